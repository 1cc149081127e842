"""Directory-descriptor walks: the few primitives every confined file operation of ql is built from.

The receipt store, the receipt audit and the log artifacts never hand a path with more than one
component to a system call that could follow a symlink: they open each directory with
:data:`DIR_FLAGS` relative to its parent's descriptor and then act on names relative to it
(``dir_fd=``). A component swapped for a symlink or a file then fails the open
(:data:`UNSAFE_ERRNOS`) instead of redirecting the operation, and a file that was replaced between
two looks is caught by comparing identities (:func:`same_file`).

Only the primitives live here; what an unsafe component *means* (which error, which message) is
each caller's business.
"""

from __future__ import annotations

import errno
import os
from typing import Callable, Final

__all__ = ["DIR_FLAGS", "UNSAFE_ERRNOS", "open_dir", "lstat_at", "same_file"]

#: Open a directory, never following a symlink, never inherited by a child process.
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: errno values of a :data:`DIR_FLAGS` open meaning "this component is a symlink or not a directory"
#: (``O_NOFOLLOW`` on a symlink: ELOOP on Linux, EMLINK on FreeBSD).
UNSAFE_ERRNOS: Final = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})


def open_dir(name: str, dir_fd: int | None = None, *, unsafe: Callable[[], Exception],
             failed: Callable[[OSError], Exception]) -> int | None:
    """Open the directory ``name`` (relative to ``dir_fd`` when given) with :data:`DIR_FLAGS`.

    Returns its fd, or None when the name does not exist. A symlink or non-directory there raises
    ``unsafe()``, any other error ``failed(error)`` — the caller's own exceptions and messages
    (both chained to the system error).
    """
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in UNSAFE_ERRNOS:
            raise unsafe() from exc
        raise failed(exc) from exc


def lstat_at(name: str, dir_fd: int) -> os.stat_result | None:
    """``lstat`` of ``name`` relative to a directory fd; None when the name does not exist."""
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stat results are the same inode on the same device (a file, not a name)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
