"""The data directory's layout (DESIGN.md §6) and the confinement rules for it.

```
<data_dir>/ql.db                               run database (edge/standalone)
<data_dir>/node_id                             this node's stable runtime-owner id
<data_dir>/logs/t<tt>/<log_artifact_id>.log    0600, append-only, dirs 0700
<data_dir>/logs/<xx>/<log_artifact_id>.log     logs an earlier version created (read and deleted there)
<data_dir>/receipts/<xx>/<attempt_id>.json
<data_dir>/receipts/.quarantine/<xx>/<attempt_id>.json
<data_dir>/receipts/.orphan-quarantine/<xx>/<name>
```
``xx`` is the last two hex digits of the id (random bits). ``tt`` is two hex digits of the *time*
a log's id was made (``ql_core.ids.time_shard_of``: one directory for ~65 s, the 256 of them cycled
through every ~4.7 h): tasks that run close together create and drop their log files in one
directory, so ext4 dirties one directory block and one inode-table block for all of them instead of
one of 256 random ones per task (issue 25: bytes written per task, ~5 KB less per awaited task), and
the directory count stays bounded. Receipts keep the random shard (launchers in C and shell derive
their paths).

This version creates every log in ``t<tt>/``; a reader (``ql logs``, follow, retention,
drop-if-empty, the cluster worker's shipper) looks there first and then in ``<xx>/``, where versions
before the time shards created theirs. The two names never meet, a file is created in one place
only, and nothing is moved or recorded on upgrade — so a data dir of an older version keeps every
log, and so does one where an older process still runs beside this one (its logs are found in
``<xx>/``). Every directory we create is 0700 and is checked not to be a symlink, so nothing escapes
the data dir.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from .errors import ConfigError, DataDirError, UnsafePathError, explain_os_error
from .ids import is_uuid7, shard_of, time_shard_of

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "ensure_data_dir",
    "ensure_private_dir",
    "logs_root",
    "receipts_root",
    "log_relative_path",
    "legacy_log_relative_path",
    "find_log_relative_path",
    "log_path",
    "read_node_id",
    "existing_data_dir",
    "read_small_file",
    "refuse_virtual_data_dir",
    "user_cache_dir",
    "flock_within",
    "LOCK_WAIT_S",
]

DIR_MODE = 0o700
FILE_MODE = 0o600
#: Virtual file systems that can never hold a data dir (they accept no files, or not for long).
_VIRTUAL_ROOTS = ("/proc", "/sys", "/dev")
#: ``node_id`` holds one UUIDv7 and a newline; anything bigger is not ours.
_NODE_ID_MAX_BYTES = 128


_P = TypeVar("_P", str, Path)


def ensure_private_dir(path: _P) -> _P:
    """Create ``path`` (0700) if missing; refuse a symlink or a non-directory."""
    # Looked at first: it exists on every call but the first (each task's log directories), and a
    # failed mkdir costs a syscall and an exception for nothing. The lstat after decides either way.
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            pass
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} must be a real directory, not a symlink or file; remove it and retry")
    return path


def refuse_virtual_data_dir(path: Path) -> None:
    """A :class:`ConfigError` for a data dir under ``/proc``, ``/sys`` or ``/dev`` (``/dev/null``
    included): no command can use one, so every command says so the same way (exit 2)."""
    real = os.path.realpath(path)
    for root in _VIRTUAL_ROOTS:
        if real == root or real.startswith(root + "/"):
            raise ConfigError(f"data dir {path} is on the virtual file system {root}, which cannot keep ql's "
                              f"files; point --data-dir / QL_DATA_DIR at a directory on a real disk")


def _stat_data_dir(data_dir: Path) -> os.stat_result | None:
    """The data dir's stat (None: it does not exist); any other failure is one line naming the fix."""
    try:
        return os.stat(data_dir)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DataDirError(explain_os_error(exc, "cannot use the data dir", data_dir)) from None


def ensure_data_dir(data_dir: Path) -> Path:
    """Create the data dir (and its parents) with private permissions; return its canonical path.

    Refuses, with one line naming the fix: a path that is not a directory, a data dir on a
    virtual file system (``/proc``, ``/sys``, ``/dev``), one owned by another user (files created
    there would belong to the wrong user), one on a read-only file system, and any OS error
    creating it.
    """
    data_dir = Path(os.path.abspath(data_dir))
    refuse_virtual_data_dir(data_dir)
    st = _stat_data_dir(data_dir)
    if st is None:
        try:
            os.makedirs(data_dir, DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise DataDirError(explain_os_error(exc, "cannot create the data dir", data_dir)) from None
        st = _stat_data_dir(data_dir)
        assert st is not None
    if not stat.S_ISDIR(st.st_mode):
        raise DataDirError(f"data dir {data_dir} is not a directory; point --data-dir / QL_DATA_DIR elsewhere")
    if st.st_uid != os.geteuid():
        from .errors import owner_of

        raise DataDirError(f"data dir {data_dir} belongs to {owner_of(data_dir)}, not to you (uid {os.geteuid()}): "
                           f"files ql created there would belong to the wrong user; run ql as its owner, or "
                           f"point --data-dir / QL_DATA_DIR at a directory of your own")
    # Said here, before SQLite's "unable to open database file" would blame owner and permissions.
    if _read_only_fs(data_dir):
        raise DataDirError(f"data dir {data_dir} is on a read-only file system: this command writes there (runs, "
                           f"receipts, logs); remount it read-write, or point --data-dir / QL_DATA_DIR at a writable "
                           f"directory (reading commands such as ql list still work)")
    if not os.access(data_dir, os.W_OK | os.X_OK):
        mode = stat.S_IMODE(st.st_mode)
        why = (f"its mode is {mode:04o}: chmod u+rwx it" if (mode & 0o700) != 0o700 else
               f"its mode {mode:04o} allows it, so it is immutable (chattr +i; `lsattr -d` shows it) or an ACL or "
               f"security policy forbids it: chattr -i it, or fix that policy")
        raise DataDirError(f"data dir {data_dir} cannot be written: this command writes there (runs, receipts, "
                           f"logs); {why}")
    return Path(os.path.realpath(data_dir))


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


#: ``logs_root`` per data dir: each task asks for it several times (its log's path, its shard), and a
#: pathlib join parses both parts again each time. Bounded: a process uses one or two data dirs.
_LOGS_ROOTS: dict[Path, Path] = {}


def logs_root(data_dir: Path) -> Path:
    root = _LOGS_ROOTS.get(data_dir)
    if root is None:
        if len(_LOGS_ROOTS) >= 16:
            _LOGS_ROOTS.clear()
        root = _LOGS_ROOTS[data_dir] = data_dir / "logs"
    return root


def receipts_root(data_dir: Path) -> Path:
    return data_dir / "receipts"


def log_relative_path(log_artifact_id: str) -> str:
    """``t<tt>/<id>.log`` relative to the logs root: where this version creates a log (what the
    database stores). Readers resolve with :func:`find_log_relative_path`."""
    if not is_uuid7(log_artifact_id):
        raise ValueError("log artifact id must be a lowercase UUIDv7")
    return f"t{time_shard_of(log_artifact_id)}/{log_artifact_id}.log"


def legacy_log_relative_path(log_artifact_id: str) -> str:
    """``<xx>/<id>.log``: where versions before the time shards created a log (``xx``: the id's last
    two hex digits)."""
    if not is_uuid7(log_artifact_id):
        raise ValueError("log artifact id must be a lowercase UUIDv7")
    return _legacy(log_artifact_id)


def _legacy(log_artifact_id: str) -> str:
    return f"{shard_of(log_artifact_id)}/{log_artifact_id}.log"


def find_log_relative_path(data_dir: Path, log_artifact_id: str) -> str:
    """Where the log of ``log_artifact_id`` is, relative to the logs root: its time shard, or — a log
    an earlier version created — its random shard if something is there; the time shard when neither
    exists (a log not created yet, or gone). One ``lstat`` for a log of this version, two for an older
    one (nothing is followed or opened here: the caller opens safely)."""
    relative = log_relative_path(log_artifact_id)
    root = logs_root(data_dir)
    if os.path.lexists(root / relative):
        return relative
    legacy = _legacy(log_artifact_id)  # the id was checked just above
    return legacy if os.path.lexists(root / legacy) else relative


def log_path(data_dir: Path, log_artifact_id: str) -> Path:
    """The log's path as a reader finds it (:func:`find_log_relative_path`)."""
    return logs_root(data_dir) / find_log_relative_path(data_dir, log_artifact_id)


def existing_data_dir(data_dir: Path) -> Path:
    """The canonical path of a data dir that must already exist (readers never create one)."""
    from .errors import NotFoundError

    path = Path(os.path.abspath(data_dir))
    refuse_virtual_data_dir(path)
    st = _stat_data_dir(path)
    if st is None:
        raise NotFoundError(f"no ql data dir at {path}: nothing has run there; check --data-dir / QL_DATA_DIR")
    if not stat.S_ISDIR(st.st_mode):
        raise DataDirError(f"data dir {path} is not a directory; point --data-dir / QL_DATA_DIR elsewhere")
    return Path(os.path.realpath(path))


def read_small_file(path: Path, *, max_bytes: int, what: str, follow_symlinks: bool = True,
                    refuse: Callable[[OSError | None], Exception] | None = None) -> bytes:
    """The bytes of a small regular file, read without ever blocking or reading without bound.

    Opened ``O_NONBLOCK`` (a FIFO cannot hang us), ``O_NOFOLLOW`` unless ``follow_symlinks``,
    checked to be a regular file of at most ``max_bytes`` before reading (``/dev/zero`` cannot
    exhaust memory). :class:`FileNotFoundError` is raised as is (callers decide what a missing
    file means); anything else is a :class:`~ql_core.errors.DataDirError` naming ``what`` and the fix.
    ``refuse``: the caller's own error for a file that cannot be opened (the OSError, a missing
    file included) or is not a regular file (None).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if refuse is not None:
            raise refuse(exc) from None
        if isinstance(exc, FileNotFoundError):
            raise
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafePathError(f"{what} {path} is a symlink; ql never follows one there: remove it") from None
        raise DataDirError(explain_os_error(exc, f"cannot read {what}", path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            if refuse is not None:
                raise refuse(None)
            raise DataDirError(f"{what} {path} is not a regular file (a directory, FIFO, socket or device); "
                               f"point it at a regular file")
        if st.st_size > max_bytes:
            raise DataDirError(f"{what} {path} is {st.st_size} bytes, more than the {max_bytes} it may have; "
                               f"it is not the file you meant")
        chunks: list[bytes] = []
        remaining = max_bytes + 1  # a file growing while we read is still cut at the bound
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise DataDirError(explain_os_error(exc, f"cannot read {what}", path)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise DataDirError(f"{what} {path} grew past {max_bytes} bytes while being read; it is not the file "
                           f"you meant")
    return data


def read_node_id(data_dir: Path) -> str | None:
    """This node's id if the data dir has one (None: never used); a corrupt one is an error."""
    try:
        return read_existing_node_id(data_dir)
    except FileNotFoundError:
        return None


def read_existing_node_id(data_dir: Path) -> str:
    st = _stat_data_dir(Path(data_dir))
    if st is None:
        raise FileNotFoundError(errno.ENOENT, "no data dir", str(data_dir))
    if not stat.S_ISDIR(st.st_mode):
        raise DataDirError(f"data dir {data_dir} is not a directory; point --data-dir / QL_DATA_DIR elsewhere")
    path = Path(data_dir) / "node_id"
    raw = read_small_file(path, max_bytes=_NODE_ID_MAX_BYTES, what="the node id file", follow_symlinks=False)
    value = raw.decode("ascii", "replace").strip()
    if is_uuid7(value):
        return value
    raise UnsafePathError(f"{path} is corrupt; it must hold one UUIDv7 (restore it from a backup)")


def write_node_id(data_dir: Path, value: str) -> None:
    """Create ``<data_dir>/node_id`` holding ``value``, durably and atomically; an existing one is
    kept (a concurrent first start keeps the winner's id: read it back)."""
    path = data_dir / "node_id"
    tmp = data_dir / f".node_id.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        raise DataDirError(explain_os_error(exc, "cannot create files in the data dir", data_dir)) from None
    try:
        try:
            os.write(fd, value.encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # no-replace: a concurrent first start keeps the winner's id
        except FileExistsError:
            pass
    except OSError as exc:
        raise DataDirError(explain_os_error(exc, "cannot create the node id file", path)) from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


#: Serializes a data dir's first use (node id, run database): see :func:`first_use_lock`.
FIRST_USE_LOCK = ".first-use.lock"
#: How long a process waits for another one's first use of a data dir (or its schema migration)
#: before it gives up with an error: the holder may be stopped (SIGSTOP, a debugger), and nothing
#: ql runs may wait unboundedly on a stopped peer. A first use takes about a second.
LOCK_WAIT_S = 30.0


def flock_within(fd: int, path: Path, what: str, limit_s: float = LOCK_WAIT_S) -> None:
    """``flock(fd, LOCK_EX)``, waiting at most ``limit_s`` for another holder (then a one-line
    :class:`~ql_core.errors.DataDirError` naming the cause and the fix)."""
    import fcntl
    import time

    deadline = time.monotonic() + limit_s
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise DataDirError(f"another ql process has held {path} ({what}) for more than {limit_s:g} s: it may "
                               f"be stopped (SIGSTOP, a debugger); resume or end it, then retry")
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.1)


class first_use_lock:
    """An exclusive ``flock`` on ``<data_dir>/.first-use.lock`` while a data dir is set up.

    A process that finds no node id takes it, looks again, and creates the node id and opens the run
    store (creating and migrating the database) before it lets go. So a node id without a database
    always means a lost database, never one that a concurrent first start is still creating: fifty
    processes starting on a fresh data dir at once all succeed.
    """

    def __init__(self, data_dir: Path) -> None:
        self._path = Path(data_dir) / FIRST_USE_LOCK
        self._fd: int | None = None

    def __enter__(self) -> first_use_lock:
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise DataDirError(explain_os_error(exc, "cannot create the data dir's first-use lock", self._path)) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafePathError(f"{self._path} is not a regular file; remove it")
            flock_within(fd, self._path, "the data dir's first use")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def user_cache_dir(environ: Mapping[str, str]) -> str | None:
    """ql's per-user cache: ``$XDG_CACHE_HOME/ql``, else ``<home>/.cache/ql`` (a relative
    XDG_CACHE_HOME is ignored, as the XDG spec says; without HOME, the account's home directory);
    None when no absolute home can be found. The plugin cache and the compiled launcher live here."""
    base = environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):
        home = environ.get("HOME")
        if not home:
            import pwd

            try:
                home = pwd.getpwuid(os.geteuid()).pw_dir
            except KeyError:
                return None
        if not home or not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "ql")
