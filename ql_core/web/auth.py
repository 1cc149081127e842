"""Who may read ``ql web``: the bind rule and the token (stdlib only; no web framework imported).

- Bound to a loopback address (``127.0.0.1``, ``::1``, ``localhost``) the page needs no token, unless
  one is configured (then every request needs it, wherever it comes from).
- Any other address needs the token: ``web_token_file = "/path"`` in the config (a top-level key,
  ql_core.config), a regular file owned by this user with mode 0600 (no group or other bits), 16 to
  4096 bytes of text after stripping whitespace. Otherwise ``ql web`` refuses to start (exit 2)
  naming the fix.
- A request proves it with ``Authorization: Bearer TOKEN`` or the ``ql_web_token`` cookie that the
  ``/login`` form sets (HttpOnly, SameSite=Strict). Compared in constant time (``hmac.compare_digest``
  on the SHA-256 of both, so even the length is not leaked). A request without it gets 401 and a page
  that names nothing but the login form.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import stat
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

__all__ = ["is_loopback", "load_token", "token_required_error", "TokenGate", "COOKIE", "TOKEN_MIN", "TOKEN_MAX"]

COOKIE = "ql_web_token"
TOKEN_MIN = 16
TOKEN_MAX = 4096


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (``localhost`` included)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_required_error(host: str) -> str:
    return (f"`ql web --listen {host[:80]}` binds a non-loopback address and needs a token: put one (at least "
            f"{TOKEN_MIN} characters) in a file with mode 0600 and name it in the config as "
            f"web_token_file = \"/path/to/token\" (docs/operations.md)")


def load_token(path: Path | None) -> str | None:
    """The token in ``web_token_file`` (None when not configured); ConfigError names the fix.

    The config resolved the path (ql_core.config); the file itself is checked here, when ``ql web``
    starts: opened without following a symlink or blocking, a regular file of this user, mode 0600.
    """
    from ql_core.errors import ConfigError

    if path is None:
        return None
    path_text = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"web_token_file {path_text[:120]!r} cannot be opened ({exc.strerror}); "
                          f"create it with mode 0600") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"web_token_file {path_text[:120]!r} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigError(f"web_token_file {path_text[:120]!r} is owned by another user; "
                              f"it must be this user's")
        if st.st_mode & 0o077:
            raise ConfigError(f"web_token_file {path_text[:120]!r} has mode "
                              f"{stat.S_IMODE(st.st_mode):04o}; run chmod 600 on it")
        raw = os.read(fd, TOKEN_MAX + 2)
    finally:
        os.close(fd)
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"web_token_file {path_text[:120]!r} is not UTF-8 text") from None
    if not TOKEN_MIN <= len(token) <= TOKEN_MAX or any(c.isspace() for c in token):
        raise ConfigError(f"web_token_file {path_text[:120]!r} must hold one token of {TOKEN_MIN} to "
                          f"{TOKEN_MAX} characters without spaces (e.g. `openssl rand -hex 32`)")
    return token


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def _cookie(header: str) -> str | None:
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == COOKIE:
            return value
    return None


class TokenGate:
    """ASGI middleware: every request but ``/login`` must carry the token (constant-time compare)."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str) -> None:
        self.app = app
        self._want = _digest(token)

    def allowed(self, headers: Mapping[str, str]) -> bool:
        given = None
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if given is None:
            given = _cookie(headers.get("cookie", ""))
        # Compare digests even when nothing was given: the time does not depend on the input.
        return hmac.compare_digest(_digest(given or ""), self._want) and bool(given)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") == "/login":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed(headers):
            await self.app(scope, receive, send)
            return
        body = (b"<!doctype html><meta charset=utf-8><title>ql web: token needed</title>"
                b"<p>This page needs the ql web token: <a href=/login>log in</a> or send "
                b"<code>Authorization: Bearer TOKEN</code>.</p>")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                (b"www-authenticate", b'Bearer realm="ql"'),
                                (b"cache-control", b"no-store"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
