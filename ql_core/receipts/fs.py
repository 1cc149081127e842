"""The receipt store's file-system steps: verified directories opened by fd, the temp file, bounded reads.

Each function acts relative to a directory file descriptor (:mod:`ql_core.dirfd`), never through a
path of several components, and raises the receipt seam's errors
(:class:`~ql_core.ports.receipt_store.UnsafePathError` for a symlink or a foreign directory,
:class:`~ql_core.ports.receipt_store.ReceiptStoreError` for I/O). The protocol that orders them is
:mod:`ql_core.receipts.file_store`'s.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Final

from ql_core.dirfd import open_dir
from ql_core.ports.receipt_store import ReceiptStoreError, UnsafePathError

__all__ = ["DIR_MODE", "FILE_MODE", "TEMP_FLAGS", "READ_FLAGS", "unlink_quietly", "open_subdir", "verify_directory",
           "fill_temp", "read_bounded"]

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
#: A publication temp file: a new name only, never through a symlink.
TEMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: A receipt read: never through a symlink, never blocking on a FIFO planted at the path.
READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def unlink_quietly(name: str, dir_fd: int) -> None:
    """Best-effort cleanup on an error path, where the original error is the one to report."""
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def open_subdir(parent_fd: int, name: str, *, create: bool) -> int | None:
    """Open (optionally create) a child directory without following symlinks, and verify it.

    A directory created here gets mode 0700 whatever the umask, and its parent
    is fsynced so the new entry is durable. Returns None when the directory is
    missing and ``create`` is False.
    """
    fd = _open_dir_at(parent_fd, name)
    created = False
    if fd is None:
        if not create:
            return None
        created = _mkdir_at(parent_fd, name)  # False: a concurrent creator won the race
        fd = _open_dir_at(parent_fd, name)
        if fd is None:
            raise ReceiptStoreError("receipt directory vanished while in use")
    try:
        verify_directory(fd, repr(name))
        if created:
            _settle_new_directory(fd, parent_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _settle_new_directory(fd: int, parent_fd: int) -> None:
    """Exact 0700 whatever the umask, and a durable entry in the parent."""
    try:
        os.fchmod(fd, DIR_MODE)
        os.fsync(parent_fd)
    except OSError as exc:
        raise ReceiptStoreError(f"cannot prepare receipt directory: {exc.strerror}") from exc


def _open_dir_at(parent_fd: int, name: str) -> int | None:
    """``openat(O_DIRECTORY|O_NOFOLLOW)``; None when missing, UnsafePathError for a symlink/file."""
    return open_dir(name, parent_fd, unsafe=lambda: UnsafePathError(f"{name!r} is a symlink or not a directory"),
                    failed=lambda exc: ReceiptStoreError(f"cannot open receipt directory: {exc.strerror}"))


def _mkdir_at(parent_fd: int, name: str) -> bool:
    """mkdir 0700 relative to a directory fd; False when the name already exists."""
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
    except FileExistsError:
        return False
    except OSError as exc:
        raise ReceiptStoreError(f"cannot create receipt directory: {exc.strerror}") from exc
    return True


def verify_directory(fd: int, what: str) -> os.stat_result:
    """An opened directory must be a directory owned by us and not writable by others."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise ReceiptStoreError(f"cannot stat {what}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{what} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(f"{what} is not owned by the current user")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{what} is writable by group or others")
    return st


def fill_temp(fd: int, payload: bytes, *, fsync: bool) -> None:
    """Steps 3–4: exact mode, the whole payload, fsync; always closes ``fd``."""
    try:
        os.fchmod(fd, FILE_MODE)  # exact mode whatever the umask
        _write_all(fd, payload)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_bounded(fd: int, limit: int) -> bytes:
    """Read until EOF or ``limit`` bytes, whichever comes first."""
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
