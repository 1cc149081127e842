"""Log artifacts (ADR-0007 §2.3): created before spawn, written by the task directly.

The task's stdout and stderr *are* the artifact's ``O_APPEND`` descriptor, so
the host holds no pipe: a host restart cannot cut the log, and a slow reader
can never slow the task. Reading is on demand from a byte offset.

Quota (``log_max_bytes``, per attempt; see ``docs/logs.md``)
-----------------------------------------------------------
Nothing sits between the task and its file, so the quota is enforced *after
the fact*, by whoever looks at the log: a supervisor round (through
:class:`ql_core.log_retention.LogKeeper`), a follower (every state look), and the end of the run
(:func:`finalize_log`). Enforcing means ``ftruncate(fd, quota)`` when the file
is longer. Because every write of the task goes through an ``O_APPEND``
descriptor, it lands at the *current* end of the file: bytes ``[0, quota)``
are written once and never touched again, and whatever the task writes after
a cut lands at ``quota`` and is cut again next time. Readers never read past
``quota``. The precise guarantee:

- every reader, at any time, sees a prefix of the first ``quota`` bytes the
  task wrote — never a byte that will later be cut;
- on disk, the file holds at most ``quota`` + what the task wrote since the
  last enforcement of *this* log;
- once the run is terminal and :func:`finalize_log` ran (the fast path, a
  follower at the end, or the next round), the file holds exactly
  ``min(total written, quota)`` bytes — the first ones. The first cut sets
  ``truncated`` and appends one ``log.truncated`` event at once; the final
  ``size_bytes`` is recorded right after the terminal commit by the process
  that ended the run (the waiting host, a follower, a round — one batched
  commit per page there). A crash in between leaves the log in the sizing
  queue (the partial index ``ix_ql_log_unsized``; on SQLite the terminal commit
  puts it there, ``ql_core.db.sqlite_logs``), drained by the next round.

The task is never blocked, signalled or slowed, and other files it writes are
not limited (which is why ``RLIMIT_FSIZE`` is not used).

Retention (:func:`ql_core.log_retention.enforce_log_retention`) deletes logs of *terminal* attempts
of this node by age (``log_retention_s``) and by total size
(``log_total_max_bytes``), in pages until the round's ``retention_budget_ms``
is spent; the log of an active or blocked attempt is never deleted.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .dirfd import DIR_FLAGS
from .errors import UnsafePathError
from .lean_tuple import LeanNamedTuple
from .paths import FILE_MODE, ensure_private_dir, find_log_relative_path, log_relative_path, logs_root
from .records import LogFacts

if TYPE_CHECKING:
    from .node import Node

__all__ = [
    "open_log_for_reading",
    "LOG_CHUNK_BYTES",
    "QUOTA_REASON",
    "LogFacts",
    "open_log_artifact",
    "read_log_chunk",
    "log_size",
    "log_facts",
    "enforce_log_quota",
    "enforce_log_quotas",
    "finalize_log",
    "finalize_own_log",
    "EmptyLog",
    "open_empty_log",
    "finalize_logs",
    "Finalized",
    "drop_if_empty",
    "unlink_log_file",
]

#: Largest chunk one read returns (bounded memory per follower).
LOG_CHUNK_BYTES = 64 * 1024
#: ``reason`` of the ``log.truncated`` event.
QUOTA_REASON = "LOG_MAX_BYTES"


_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def open_log_artifact(data_dir: Path, log_artifact_id: str) -> int:
    """Create (or reopen) the artifact; return an ``O_WRONLY|O_APPEND`` fd (close-on-exec).

    A new one is created exclusively (``O_EXCL``: what that open made is a regular file). One that
    exists is opened non-blocking (a FIFO planted at the path would otherwise block the host in
    ``open``) and checked to be a regular file; the task gets a plain blocking descriptor.
    """
    relative = log_relative_path(log_artifact_id)
    root = str(logs_root(data_dir))
    ensure_private_dir(root)
    ensure_private_dir(os.path.join(root, os.path.dirname(relative)))
    path = os.path.join(root, relative)
    try:
        # A new artifact (its id is fresh: the usual case) is created exclusively; a file this open
        # made is a regular file, so it needs neither the non-blocking open nor the checks below that
        # guard a reopen against a FIFO or device planted at the path (two syscalls less per task).
        return os.open(path, _CREATE_FLAGS, FILE_MODE)
    except FileExistsError:
        pass  # reopened, or something else sits there (a symlink: ELOOP below)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink sits where the log belongs
            raise UnsafePathError(f"log artifact {log_artifact_id} is a symlink; refusing to follow it") from None
        if exc.errno == errno.ENXIO:  # a FIFO without reader
            raise UnsafePathError(f"log artifact {log_artifact_id} is a FIFO, not a file; refusing it") from None
        raise
    try:
        _require_regular(fd, log_artifact_id)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_regular(fd: int, log_artifact_id: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"log artifact {log_artifact_id} is not a regular file (something replaced it); "
                              f"refusing to use it")
    return st


class _LogDir:
    """The log's shard directory, opened component by component without following symlinks.

    Every later operation is relative to this descriptor (``dir_fd``), so a
    symlink planted as ``logs`` or ``logs/<xx>`` can never redirect a read, a
    truncation or an unlink outside the data dir. ``fd`` is None when a
    component does not exist.
    """

    def __init__(self, data_dir: Path, log_artifact_id: str, *, created_here: bool = False) -> None:
        # A log this process created (open_log_artifact) is where this version creates one: no
        # look for an older version's layout.
        relative = (log_relative_path(log_artifact_id) if created_here
                    else find_log_relative_path(data_dir, log_artifact_id))
        shard, self.name = relative.split("/")
        self.fd: int | None = None
        #: The file's stat as :meth:`open` checked it (its last open).
        self.st: os.stat_result | None = None
        root = -1
        try:
            root = os.open(logs_root(data_dir), DIR_FLAGS)
            self.fd = os.open(shard, DIR_FLAGS, dir_fd=root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePathError(f"the log directory of {log_artifact_id} is not a real directory "
                                      f"(symlink?); refusing to use it") from None
            raise
        finally:
            if root >= 0:
                os.close(root)

    def open(self, flags: int) -> int | None:
        """Open the log file itself; None if it does not exist.

        Never blocks and never follows a link: ``O_NONBLOCK|O_NOFOLLOW``, then the descriptor must be
        a regular file — a FIFO, device or directory planted at the path (even by the task itself)
        is :class:`UnsafePathError`, reported by the caller, never waited on.
        """
        if self.fd is None:
            return None
        try:
            fd = os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(f"log artifact {self.name} is a symlink; refusing to follow it") from None
            if exc.errno in (errno.ENXIO, errno.EISDIR):
                raise UnsafePathError(f"log artifact {self.name} is not a regular file; refusing it") from None
            raise
        try:
            self.st = _require_regular(fd, self.name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> _LogDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_log_for_reading(data_dir: Path, log_artifact_id: str) -> int | None:
    """The log, ``O_RDONLY`` (close-on-exec, non-blocking), opened through its shard directory without
    following a link and checked to be a regular file (else :class:`UnsafePathError`); None if it
    does not exist. The caller closes the descriptor."""
    with _LogDir(data_dir, log_artifact_id) as d:
        return d.open(os.O_RDONLY)


def read_log_chunk(data_dir: Path, log_artifact_id: str, offset: int,
                   limit: int = LOG_CHUNK_BYTES, *, max_bytes: int | None = None) -> bytes:
    """Up to ``limit`` bytes of the log from ``offset`` (b"" at the end or if it does not exist).

    With ``max_bytes`` (the artifact's quota) nothing at or past that offset is
    returned: bytes beyond the quota are about to be cut and no reader sees them.
    """
    if offset < 0:
        raise ValueError("offset must be >= 0")
    if max_bytes is not None:
        limit = min(limit, max_bytes - offset)
    if limit <= 0:
        return b""
    with _LogDir(data_dir, log_artifact_id) as d:
        fd = d.open(os.O_RDONLY)
        if fd is None:
            return b""
        try:
            return os.pread(fd, limit, offset)
        finally:
            os.close(fd)


def log_size(data_dir: Path, log_artifact_id: str) -> int | None:
    """Current size of the log file on disk (None if it does not exist)."""
    with _LogDir(data_dir, log_artifact_id) as d:
        fd = d.open(os.O_RDONLY)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)


def _cut_to(data_dir: Path, log_artifact_id: str, max_bytes: int) -> tuple[int | None, bool]:
    """``ftruncate`` the log to ``max_bytes`` if it is longer: (size seen before, was it cut)."""
    with _LogDir(data_dir, log_artifact_id) as d:
        return _cut_in(d, max_bytes)


def _cut_in(d: _LogDir, max_bytes: int) -> tuple[int | None, bool]:
    """:func:`_cut_to` in a log directory opened already."""
    fd = d.open(os.O_WRONLY)
    if fd is None:
        return None, False
    try:
        st = os.fstat(fd)
        if st.st_size <= max_bytes:
            return st.st_size, False
        # The task's appends land at the new end (O_APPEND): [0, max_bytes) is never rewritten.
        os.ftruncate(fd, max_bytes)
        return st.st_size, True
    finally:
        os.close(fd)


def unlink_log_file(data_dir: Path, log_artifact_id: str) -> bool:
    """Remove the log file (never following a symlink); True if it is gone now."""
    with _LogDir(data_dir, log_artifact_id) as d:
        if d.fd is None:
            return True
        try:
            st = os.stat(d.name, dir_fd=d.fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"log artifact {log_artifact_id} is a directory; not removing it")
        try:
            os.unlink(d.name, dir_fd=d.fd)  # a symlink itself is removed, its target never
        except FileNotFoundError:
            pass
        return True


#: ``fcntl`` commands (Linux values; used where Python does not name them).
_F_SETLEASE, _F_SETSIG = 1024, 10


def drop_if_empty(data_dir: Path, log_artifact_id: str) -> bool:
    """Remove an ended attempt's log file if it is empty and no process has it open; True if removed.

    A task that printed nothing leaves no file behind (issue 25). "Nobody has it open" is the
    kernel's word, not a guess: a write lease (``F_SETLEASE``, ``F_WRLCK``) is granted only while no
    other descriptor of the file is open anywhere — a descendant of the task that still holds its
    stdout keeps the file (it may write later: the log must survive), as does a reader. Without
    leases (another file system, ``fs.leases-enable = 0``) the file is kept. Readers see a missing
    file as an empty log, which it is; the recorded size (0) is committed before.
    """
    with _LogDir(data_dir, log_artifact_id) as d:
        return _drop_in(d)


def _drop_in(d: _LogDir) -> bool:
    """:func:`drop_if_empty` in a log directory opened already."""
    fd = d.open(os.O_RDONLY)
    if fd is None:
        return False
    try:
        if os.fstat(fd).st_size != 0:
            return False
        return _drop_open(d, fd)
    finally:
        os.close(fd)


def _drop_open(d: _LogDir, fd: int) -> bool:
    """Unlink the log open as ``fd`` (``O_RDONLY``) in ``d`` if it is empty under a write lease."""
    import fcntl
    import signal

    setlease = getattr(fcntl, "F_SETLEASE", _F_SETLEASE)
    try:
        # A lease break (an open by another process while we hold it) signals the holder,
        # SIGIO by default — which would end this process. SIGURG is ignored by default.
        fcntl.fcntl(fd, getattr(fcntl, "F_SETSIG", _F_SETSIG), signal.SIGURG)
        fcntl.fcntl(fd, setlease, fcntl.F_WRLCK)
    except OSError:
        return False  # held open elsewhere, or no leases here: keep it
    try:
        # While we hold the lease another open waits for us (the lease-break grace), so the
        # name goes before anyone else can get a descriptor of it.
        if os.fstat(fd).st_size != 0:
            return False
        os.unlink(d.name, dir_fd=d.fd)
    finally:
        fcntl.fcntl(fd, setlease, fcntl.F_UNLCK)
    return True


class EmptyLog:
    """An ended attempt's log found empty, held open from that look until it is dropped or closed.

    The waiting host looks before its terminal commit (the size, 0, rides in it where the run store
    can take it: :class:`~ql_core.ports.journal.TerminalLogSize`) and drops the file after that
    commit through the same descriptor: one walk of the log's directories for both, no read of the
    run store, no commit of its own."""

    def __init__(self, d: _LogDir, fd: int) -> None:
        self._dir, self._fd = d, fd

    def drop(self) -> bool | None:
        """Unlink the file if it is still empty and nobody else has it open (:func:`drop_if_empty`),
        then close it. True: dropped; False: kept, still empty (held open elsewhere, or no leases
        here); None: it grew since the look (a descendant of the task wrote), size it again."""
        try:
            if _drop_open(self._dir, self._fd):
                return True
            return None if os.fstat(self._fd).st_size else False
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._dir.close()


def open_empty_log(data_dir: Path, log_artifact_id: str, *, created_here: bool = False) -> EmptyLog | None:
    """The log, open (``O_RDONLY``, never following a link, a regular file), when it is empty now;
    None when it is not empty or does not exist. ``created_here``: :func:`open_log_artifact` of this
    process created it (the waiting host's own task)."""
    d = _LogDir(data_dir, log_artifact_id, created_here=created_here)
    try:
        fd = d.open(os.O_RDONLY)
    except BaseException:
        d.close()
        raise
    if fd is not None and d.st is not None and d.st.st_size == 0:
        return EmptyLog(d, fd)
    if fd is not None:
        os.close(fd)
    d.close()
    return None


# -- facts from the run store -----------------------------------------------------------


def log_facts(node: Node, log_artifact_id: str) -> LogFacts | None:
    """The artifact's facts (quota, recorded size, truncation, deletion), or None."""
    return node.journal.log_facts(log_artifact_id)


def _record_truncation(node: Node, facts: LogFacts) -> bool:
    """Set ``truncated`` once and append one ``log.truncated`` event; True if this call did it."""
    from .ports.journal import EventSpec
    from .retrying import retrying

    event = EventSpec("log.truncated", attempt_id=facts.attempt_id, reason=QUOTA_REASON)
    events = retrying(lambda: node.journal.mark_log_truncated(facts.id, event), retries=node.profile.completion_retries)
    for info in events:
        node.notify(info)
    return bool(events)


def enforce_log_quota(node: Node, facts: LogFacts) -> bool:
    """Cut this log back to its quota if it is longer; record the first cut. True if it was cut."""
    if facts.deleted:
        return False
    _size, cut = _cut_to(node.config.data_dir, facts.id, facts.max_bytes)
    if cut and not facts.truncated:
        _record_truncation(node, facts)
    return cut


class Finalized(LeanNamedTuple):
    """What :func:`finalize_log` did: ``outcome`` and the final size (when it looked at the file).
    (A tuple, not a dataclass: ``ql logs`` imports this module, and dataclasses cost it ~8 ms.)"""

    outcome: str
    facts: LogFacts | None = None
    size_bytes: int | None = None


def _ended_facts(node: Node, log_artifact_id: str) -> LogFacts | Finalized:
    """The facts of a log whose attempt (ours) has ended, or what :func:`finalize_log` answers instead."""
    from .states import ATTEMPT_FINAL

    facts = node.journal.log_facts(log_artifact_id)
    if facts is None or facts.deleted:
        return Finalized("missing")
    attempt = node.journal.attempt(facts.attempt_id)
    if attempt is None:
        return Finalized("missing")
    if attempt.runtime_owner != node.node_id:
        return Finalized("foreign")  # another node's file: not ours to touch
    if attempt.status not in ATTEMPT_FINAL:
        return Finalized("active")
    return facts


def _cut_ended(node: Node, facts: LogFacts, d: _LogDir) -> Finalized:
    """Cut an ended attempt's log to its quota; record a first cut. No ``size_bytes`` write."""
    size, cut = _cut_in(d, facts.max_bytes)
    if cut and not facts.truncated:
        _record_truncation(node, facts)
    return Finalized("truncated" if cut else "finalized", facts, min(size or 0, facts.max_bytes))


def _finalize(node: Node, log_artifact_id: str) -> Finalized:
    """Cut an ended attempt's log to its quota; record a first cut. No ``size_bytes`` write."""
    facts = _ended_facts(node, log_artifact_id)
    if isinstance(facts, Finalized):
        return facts
    with _LogDir(node.config.data_dir, facts.id) as d:
        return _cut_ended(node, facts, d)


def finalize_log(node: Node, log_artifact_id: str, *, record_size: bool = True) -> str:
    """After the attempt ended: cut the log to its quota (the first cut is recorded at once) and record
    its final ``size_bytes`` (one small commit right after the terminal one; skipped when the recorded
    size is already right). ``record_size=False`` leaves the size to the sizing queue. Idempotent. Returns
    ``"truncated"`` (it was cut now), ``"finalized"``, ``"active"`` (the attempt
    has not ended: nothing done), ``"foreign"`` (another node's) or ``"missing"``.
    """
    facts = _ended_facts(node, log_artifact_id)
    if isinstance(facts, Finalized):
        return facts.outcome
    # One walk of the log's directories (opened without following links) for the cut and for the
    # drop of an empty file: every awaited task ends here, most of them having printed nothing.
    with _LogDir(node.config.data_dir, facts.id) as d:
        done = _cut_ended(node, facts, d)
        if record_size and facts.size_bytes != done.size_bytes:
            node.journal.record_log_sizes({facts.id: done.size_bytes or 0})
            if done.size_bytes == 0:
                _drop_in(d)  # after its size is recorded
    return done.outcome


def finalize_own_log(node: Node, log_artifact_id: str) -> str:
    """:func:`finalize_log` for the host that just committed its own attempt's end (``Runtime.wait``):
    an empty log (the usual awaited task) has nothing to cut — its size (0) is recorded and the file
    dropped without reading the run store first (two reads per task). Any other: finalize_log."""
    with _LogDir(node.config.data_dir, log_artifact_id) as d:
        fd = d.open(os.O_RDONLY)
        if fd is not None:
            empty = os.fstat(fd).st_size == 0
            os.close(fd)
            if empty:
                node.journal.record_log_sizes({log_artifact_id: 0})
                _drop_in(d)  # after its size is recorded
                return "finalized"
    return finalize_log(node, log_artifact_id)


def finalize_logs(node: Node, log_artifact_ids: list[str]) -> Counter[str]:
    """:func:`finalize_log` for many logs, their sizes recorded in ONE transaction; logs of attempts
    still active (or another node's) are left alone. Counts ``log_finalized``, ``log_truncated``,
    ``log_errors``."""
    counts: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    for log_id in log_artifact_ids:
        try:
            done = _finalize(node, log_id)
        except (OSError, UnsafePathError) as exc:
            counts["log_errors"] += 1
            _warn(f"log {log_id} not finalized this round: {type(exc).__name__}")
            continue
        if done.facts is not None and done.size_bytes is not None and done.facts.size_bytes != done.size_bytes:
            sizes[done.facts.id] = done.size_bytes
        counts["log_finalized"] += done.outcome in ("finalized", "truncated")
        counts["log_truncated"] += done.outcome == "truncated"
    node.journal.record_log_sizes(sizes)
    for log_id, size in sizes.items():
        if size == 0:
            try:
                drop_if_empty(node.config.data_dir, log_id)
            except (OSError, UnsafePathError):
                pass  # kept: an empty file is harmless
    return counts


# -- bounded maintenance passes (a supervisor round calls these) ---------------------------


def enforce_log_quotas(node: Node, limit: int, *, cursor: str = "") -> tuple[Counter[str], str]:
    """Check up to ``limit`` logs of this node's running (or blocked) attempts, from ``cursor``.

    Returns the counts (``log_quota_checked``, ``log_truncated``) and the next
    cursor ("" once the pass wrapped around).
    """
    counts: Counter[str] = Counter()
    rows = node.journal.page_live_logs(node.node_id, cursor, limit)
    for facts in rows:
        counts["log_quota_checked"] += 1
        try:
            if enforce_log_quota(node, facts):
                counts["log_truncated"] += 1
        except (OSError, UnsafePathError) as exc:
            counts["log_errors"] += 1
            _warn(f"log quota of {facts.id} not enforced this round: {type(exc).__name__}")
    next_cursor = rows[-1].id if len(rows) == limit else ""
    return counts, next_cursor


def _warn(message: str) -> None:
    from .log import logger

    logger.warning(message)

