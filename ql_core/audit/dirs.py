"""Verified directories for the receipt audit: real, canonical, ours, opened by fd and re-checked.

The receipt root, each shard and the orphan quarantine must sit exactly at their canonical path
(never reached through a symlink); a directory is opened with ``O_NOFOLLOW`` and compared with the
one that was verified, and re-verified right before anything in it moves.
"""

from __future__ import annotations

import os
import stat

from ql_core.dirfd import open_dir, same_file
from ql_core.errors import UnsafePathError

from .model import AuditError

__all__ = ["verify_dir_path", "open_verified", "reverify", "ensure_private_subdir"]


def verify_dir_path(path: str, what: str, *, private: bool) -> os.stat_result | None:
    """A directory that must sit exactly at ``path`` (already canonical); None when missing.

    Raises :class:`UnsafePathError` for a symlink, a non-directory or a path
    that resolves elsewhere. ``private`` also demands our ownership and no
    group/other write bit (the checks before anything is moved).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AuditError(f"cannot inspect {what}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{what} is a symlink; refusing to audit through it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{what} is not a directory; refusing to audit")
    if os.path.realpath(path) != path:
        raise UnsafePathError(f"{what} escapes the receipt root; refusing to audit")
    if private:
        _check_ownership(st, what)
    return st


def _check_ownership(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise UnsafePathError(f"{what} is not owned by the current user; "
                              f"run the audit as the data dir's owner")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{what} is writable by group or others; chmod 700 it")


def open_verified(name: str, parent_fd: int | None, path: str, expected: os.stat_result,
                   what: str) -> int | None:
    """Open a verified directory with O_NOFOLLOW and check it is the very one that was verified."""
    fd = open_dir(path if parent_fd is None else name, parent_fd,
                  unsafe=lambda: UnsafePathError(f"{what} became a symlink or non-directory; refusing"),
                  failed=lambda exc: AuditError(f"cannot open {what}: {exc.strerror}"))
    if fd is None:
        return None
    try:
        if not same_file(os.fstat(fd), expected):
            raise UnsafePathError(f"{what} was replaced while being verified; refusing")
    except BaseException:
        os.close(fd)
        raise
    return fd


def reverify(fd: int, path: str, what: str) -> None:
    """Before working on a directory: its path still is a real, canonical directory: ``fd``'s."""
    st = verify_dir_path(path, what, private=True)
    if st is None or not same_file(st, os.fstat(fd)):
        raise UnsafePathError(f"{what} was replaced during the audit; stopping")


def ensure_private_subdir(parent_fd: int, name: str, path: str, what: str) -> int:
    """Open (creating 0700 if missing) a private subdirectory of the orphan quarantine."""
    created = False
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise AuditError(f"cannot create {what}: {exc.strerror}") from exc
    fd = open_dir(name, parent_fd, unsafe=lambda: UnsafePathError(f"{what} is a symlink or not a directory; refusing"),
                  failed=lambda exc: AuditError(f"cannot open {what}: {exc.strerror}"))
    if fd is None:
        raise AuditError(f"cannot open {what}: it vanished while being created")
    try:
        if created:
            os.fchmod(fd, 0o700)  # exact mode whatever the umask
            os.fsync(parent_fd)  # the new directory entry is durable
        reverify(fd, path, what)
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafePathError(f"{what} must be private (0700); chmod 700 it")
    except OSError as exc:
        os.close(fd)
        raise AuditError(f"cannot prepare {what}: {exc.strerror}") from exc
    except BaseException:
        os.close(fd)
        raise
    return fd
