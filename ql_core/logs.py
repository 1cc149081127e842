"""Log artifacts (ADR-0007 §2.3): created before spawn, written by the task directly.

The task's stdout and stderr *are* the artifact's ``O_APPEND`` descriptor, so
the host holds no pipe: a host restart cannot cut the log, and a slow reader
can never slow the task. Reading is on demand from a byte offset.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UnsafePathError
from .paths import FILE_MODE, ensure_private_dir, log_path, logs_root

__all__ = ["open_log_artifact", "read_log_chunk", "LOG_CHUNK_BYTES"]

#: Largest chunk one read returns (bounded memory per follower).
LOG_CHUNK_BYTES = 64 * 1024


def open_log_artifact(data_dir: Path, log_artifact_id: str) -> int:
    """Create (or reopen) the artifact; return an ``O_WRONLY|O_APPEND`` fd (close-on-exec)."""
    path = log_path(data_dir, log_artifact_id)
    ensure_private_dir(logs_root(data_dir))
    ensure_private_dir(path.parent)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symlink sits where the log belongs
            raise UnsafePathError(f"log artifact {log_artifact_id} is a symlink; refusing to follow it") from None
        raise


def read_log_chunk(data_dir: Path, log_artifact_id: str, offset: int,
                   limit: int = LOG_CHUNK_BYTES) -> bytes:
    """Up to ``limit`` bytes of the log from ``offset`` (b"" at the end or if it does not exist)."""
    path = log_path(data_dir, log_artifact_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)
