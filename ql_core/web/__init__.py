"""``ql web``: a read-only page over a ql data dir or cluster (optional: ``pip install 'ql-runner[web]'``).

:func:`create_app` builds the Starlette app (imported only when called); the bind and token rules
are in :mod:`.auth`. docs/operations.md says how to run it behind a reverse proxy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'ql-runner[web]'"


def create_app(runtime: Any, *, token: str | None = None, **kwargs: Any) -> Any:
    """The ASGI app over an open runtime (see :func:`ql_core.web.app.create_app`)."""
    try:
        import starlette  # noqa: F401
    except ImportError:
        from ql_core.errors import ConfigError

        raise ConfigError(f"`ql web` needs starlette and uvicorn, which are not installed: {INSTALL_HINT}") from None
    from .app import create_app as build

    return build(runtime, token=token, **kwargs)
