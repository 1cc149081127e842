"""Callback tokens: made here, hashed here, compared here (ADR-0007 §2.2).

A token is 256 random bits as 43 characters of ``[A-Za-z0-9_-]`` (what
``secrets.token_urlsafe(32)`` gives); only its SHA-256 is stored. Built on the
interpreter's own SHA-256 and constant-time comparison rather than
``hashlib``/``hmac``/``secrets``, which load OpenSSL: a host that runs tasks
for months keeps about a mebibyte less for the same guarantee.
"""

from __future__ import annotations

import base64
import os

__all__ = ["new_token", "hash_token", "same_hash", "sha256_hex"]

try:  # CPython's built-in SHA-256 (``_sha2`` from 3.12 on, ``_sha256`` before)
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:
        from hashlib import sha256 as _sha256  # type: ignore[assignment]

try:
    from _operator import _compare_digest as _compare  # the constant-time compare hmac uses
except ImportError:  # pragma: no cover
    from hmac import compare_digest as _compare  # type: ignore[assignment]


def new_token() -> str:
    """256 random bits from the OS, URL-safe base64 without padding (43 characters)."""
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


def hash_token(token: str) -> str:
    """The stored form of a token: hex SHA-256 of its ASCII bytes."""
    return sha256_hex(token.encode("ascii"))


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 without importing hashlib (and OpenSSL with it: ~1.3 MiB per host)."""
    return _sha256(data).hexdigest()


def same_hash(stored: str, token: str) -> bool:
    """Does ``token`` hash to ``stored``? Constant time in the hash's length."""
    return _compare(stored.encode("ascii"), hash_token(token).encode("ascii"))
