"""The exceptions ql raises for expected failures, and one-line explanations of OS errors.

Every :class:`QlError` carries a one-line message that names the cause and the
fix; the CLI prints it without a traceback and exits with
:attr:`QlError.exit_code` (2 for usage and configuration errors, 1 for
operational failures). Messages never contain a command, argv, environment,
token or user output.
"""

from __future__ import annotations

import errno
import os
from typing import Iterable

__all__ = [
    "QlError",
    "UsageError",
    "ConfigError",
    "PluginError",
    "DatabaseError",
    "PersistBeforeSpawnError",
    "RuntimeClosedError",
    "NotFoundError",
    "UnsafePathError",
    "DataDirError",
    "explain_os_error",
    "owner_of",
    "unknown_setting",
]


class QlError(Exception):
    """Base of every expected ql failure."""

    exit_code: int = 1


class UsageError(QlError):
    """Wrong command-line usage."""

    exit_code = 2


class ConfigError(QlError):
    """The configuration file or an override is invalid; the message names the key."""

    exit_code = 2


class PluginError(QlError):
    """A named plugin is missing or failed to load; the message lists what is installed."""

    exit_code = 2


class DatabaseError(QlError):
    """The run database cannot be opened, migrated or written."""


class PersistBeforeSpawnError(DatabaseError):
    """The create transaction failed, so nothing was spawned (ADR-0007 §2.2)."""


class RuntimeClosedError(QlError):
    """A verb of a :class:`~ql_core.runtime.Runtime` after its ``close()``: open a new one."""


class NotFoundError(QlError):
    """A run or attempt id that the database does not know."""


class UnsafePathError(QlError):
    """A path under the data dir is a symlink or escapes its canonical root."""


class DataDirError(QlError):
    """The data dir (or a file ql keeps in it) cannot be used: permissions, owner, file system."""


def owner_of(path: str | os.PathLike[str]) -> str:
    """``uid N (name)`` of the file at ``path``, or ``an unknown owner`` if it cannot be read."""
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return "an unknown owner"
    return _describe_uid(uid)


def _describe_uid(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _permission_fix(where: str | None) -> str:
    """Whose file it is and what to do: run as its owner, or give yourself the mode ql needs."""
    if where is None:
        return "check the permissions of the data dir (`ql doctor`)"
    nearest = _nearest_existing(where)
    try:
        st = os.stat(nearest)
    except OSError:
        st = None
    if st is not None and st.st_uid == os.geteuid():
        mode = st.st_mode & 0o7777
        return (f"{nearest} is yours but its mode is {mode:04o}, which does not allow this: "
                f"chmod u+rwx it (ql keeps its directories 0700)")
    holder = _describe_uid(st.st_uid) if st is not None else "another user"
    return (f"{nearest} belongs to {holder} and you are {_describe_uid(os.geteuid())}: run ql as that user, "
            f"or point --data-dir / QL_DATA_DIR at a directory of your own")


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


def explain_os_error(exc: OSError, action: str, path: str | os.PathLike[str] | None = None, *,
                     fix: str | None = None) -> str:
    """One line for an :class:`OSError`: what ql tried (``action``), the cause, and the fix.

    ``action`` reads like "cannot create the data dir"; ``path`` defaults to the
    error's own filename. ``fix`` overrides the generic fix for the errno.
    """
    where = os.fspath(path) if path is not None else (exc.filename if isinstance(exc.filename, str) else None)
    cause = exc.strerror or type(exc).__name__
    code = exc.errno
    if fix is None:
        if code in (errno.EACCES, errno.EPERM):
            fix = _permission_fix(where)
        elif code == errno.ENOTDIR:
            fix = "a component of the path is a file, not a directory: fix the path (--data-dir / QL_DATA_DIR)"
        elif code == errno.ENAMETOOLONG:
            fix = "the path is too long for the file system: choose a shorter --data-dir"
        elif code == errno.ELOOP:
            fix = "a symlink sits where ql expects a real file or directory: remove it"
        elif code == errno.EROFS:
            fix = "the file system is mounted read-only: point --data-dir at a writable one"
        elif code in (errno.ENOSPC, errno.EDQUOT):
            fix = "the file system is full (or over quota): free some space, then retry"
        elif code == errno.ENOENT:
            fix = "the path does not exist or its file system does not allow creating files here"
        elif code == errno.EIO:
            fix = "the device reported an I/O error: check the disk (dmesg) before retrying"
        elif code == errno.EMFILE or code == errno.ENFILE:
            fix = "too many open files: raise the limit (ulimit -n) or close other programs"
        elif code == errno.ENXIO:
            fix = "it is a FIFO or device with no reader/writer: point it at a regular file"
        else:
            fix = "check the path and its file system (`ql doctor`)"
    subject = f"{action} {where}" if where else action
    return f"{subject}: {cause}; {fix}"


def unknown_setting(table: str, keys: Iterable[str], allowed: Iterable[str]) -> ConfigError | None:
    """The error for the first key of a ``[plugin.<name>]`` table (``table``: ``"plugin.local"``) its
    plugin does not accept, with a did-you-mean (difflib) and the fix; None when every key is allowed.

    Plugins validate their own tables with it, so a typo (``standbye``) reads alike for every plugin.
    """
    accepted = sorted(allowed)
    unknown = sorted(set(keys) - set(accepted))
    if not unknown:
        return None
    import difflib  # only for a key to explain: every executor start checks its table

    key = unknown[0]
    close = difflib.get_close_matches(key, accepted, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    if not accepted:
        return ConfigError(f"[{table}] takes no settings (got {key!r}); remove the table")
    return ConfigError(f"[{table}] has no setting {key!r}{guess} (allowed: {', '.join(accepted)}); "
                       f"fix or remove the key")
