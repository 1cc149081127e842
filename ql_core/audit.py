"""Bounded audit of receipt files that the journal does not index (ADR-0007 §2.9, gate 13).

The online cleaner only follows journal rows and never walks directories
(ADR §2.8). Files outside the journal — receipts published after their journal
row was resolved, temp files left by a crash, anything else dropped into a
shard — are this module's business. It is a maintenance job, not part of the
runtime:

* **Read-only by default.** The report mode changes nothing on disk: no
  directory is created, no file is opened for content. Only
  ``quarantine=True`` moves *eligible regular files*, by same-file-system hard
  link (never replacing anything) plus unlink of the original, into
  ``receipts/.orphan-quarantine/<xx>/`` (0700). Nothing is ever deleted.
* **Bounded.** At most :data:`MAX_SHARDS` of the 256 shard directories per
  call (default :data:`DEFAULT_SHARDS`) and at most :data:`MAX_LIMIT` entries
  per shard (default :data:`DEFAULT_LIMIT`). Directories are read
  incrementally with ``os.scandir`` and a shard is abandoned after its
  ``limit + 1``-th entry: it is reported ``overflow`` and nothing in it moves
  this round, so a partial listing can never lead to a wrong verdict.
  :attr:`AuditReport.next_shard` is the cursor for the next call.
* **Fail closed.** Symlinks, directories, FIFOs, sockets and devices inside a
  shard are only reported ``unsafe``. The receipt root, each shard and the
  orphan quarantine are verified to be real directories at their canonical
  path (a symlink escape raises :class:`~ql_core.errors.UnsafePathError` before
  anything moves), and every move goes through directory file descriptors
  opened with ``O_NOFOLLOW``. A file whose attempt has a journal row, or
  whose attempt is not proven final (``starting``, ``running``, ``blocked``,
  or a status this version does not know), is never moved, whatever its
  age. Everything else must also be older than the minimum age.
* **Light.** The run database is read with the standard library's
  ``sqlite3`` (``mode=ro`` URI, ``PRAGMA query_only``) or with psycopg in a
  ``READ ONLY`` transaction, one snapshot, only for the attempt ids actually
  found, in batches. No SQLAlchemy, no ORM, no plugins, no runtime.

See ``docs/audit.md`` for the operator's view.
"""

from __future__ import annotations

import enum
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Final

from ql_core.db.audit_reads import ID_BATCH_SIZE, lookup_states
from ql_core.dirfd import DIR_FLAGS, UNSAFE_ERRNOS, lstat_at, same_file
from ql_core.errors import DatabaseError, QlError, UnsafePathError, UsageError
from ql_core.receipts.names import RECEIPT_NAME_PATTERN, TEMP_NAME_PATTERN
from ql_core.states import ATTEMPT_FINAL

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_MIN_AGE_S",
    "DEFAULT_SHARD",
    "DEFAULT_SHARDS",
    "FINAL_ATTEMPT_STATUSES",
    "ID_BATCH_SIZE",
    "MAX_LIMIT",
    "MAX_MIN_AGE_S",
    "MAX_SHARDS",
    "MIN_AGE_FLOOR_S",
    "ORPHAN_QUARANTINE_DIR_NAME",
    "SHARD_COUNT",
    "Action",
    "AuditEntry",
    "AuditError",
    "AuditOptionError",
    "AuditReport",
    "EntryClass",
    "ShardReport",
    "ShardStatus",
    "audit_receipts",
    "parse_shard",
    "shard_names",
]

#: Number of shard directories ``00``..``ff`` under the receipt root.
SHARD_COUNT: Final = 256
#: First shard audited when no cursor is given.
DEFAULT_SHARD: Final = "00"
#: Shards audited per call by default, and the hard cap (ADR-0007 §2.9 point 2).
DEFAULT_SHARDS: Final = 8
MAX_SHARDS: Final = 32
#: Entries examined per shard by default, and the hard cap.
DEFAULT_LIMIT: Final = 32
MAX_LIMIT: Final = 64
#: Minimum age (seconds since the file's last modification) before an unprotected file may move.
#:
#: One hour is far beyond every race this could lose: a publication lasts
#: milliseconds (write, fsync, link, unlink), the consumer removes a receipt
#: before it resolves the journal row, and the longest default retention
#: window of any profile — quarantined receipts kept 1 h on standalone and
#: cluster workers; terminal-missing journal rows 1–2 min — is over before a
#: file becomes eligible, so the online cleaner always gets its turn first.
DEFAULT_MIN_AGE_S: Final = 3600
#: Smallest accepted minimum age: above the publish grace and the edge profile's
#: terminal-journal retention (2 min), so a typo such as ``--min-age 0`` cannot
#: make a file that is being published right now eligible.
MIN_AGE_FLOOR_S: Final = 300
#: Largest accepted minimum age (ten years; only guards against nonsense input).
MAX_MIN_AGE_S: Final = 10 * 365 * 24 * 3600
#: Attempt ids per ``WHERE ... IN (...)`` query.
#: This command's own quarantine, directly under the receipt root
#: (the runtime's is ``.quarantine``; the audit never touches it).
ORPHAN_QUARANTINE_DIR_NAME: Final = ".orphan-quarantine"

#: The only attempt statuses that leave a receipt unprotected: proven final
#: (:data:`ql_core.states.ATTEMPT_FINAL`). Every other status — ``starting``,
#: ``running``, ``blocked`` (a late valid receipt still completes a blocked
#: attempt) or one this version does not know — protects the attempt's files.
FINAL_ATTEMPT_STATUSES: Final[frozenset[str]] = frozenset(ATTEMPT_FINAL)

_SHARD_PATTERN: Final = re.compile(r"[0-9a-fA-F]{2}")
_MAX_REF_NAME: Final = 120


class EntryClass(enum.StrEnum):
    """What a shard entry is (ADR-0007 §2.9 point 3); compares equal to its string value."""

    #: The attempt id (receipt or temp name) has a journal row: the online cleaner owns it.
    JOURNAL_REGISTERED = "journal_registered"
    #: The attempt exists and is not proven final: active, blocked, or a status unknown here.
    ACTIVE_ATTEMPT = "active_attempt"
    #: A receipt-named file whose attempt is final or unknown to the database.
    TERMINAL_OR_UNKNOWN = "terminal_or_unknown"
    #: A publication temp file of an attempt that is neither journaled nor active.
    TEMP_FILE = "temp_file"
    #: A regular file with any other name (including a receipt name in the wrong shard).
    UNKNOWN_FILE = "unknown_file"
    #: Not a regular file: symlink, directory, FIFO, socket, device. Never moved.
    UNSAFE = "unsafe"
    #: Would be eligible, but younger than the minimum age.
    TOO_YOUNG = "too_young"


#: Classes whose files ``quarantine=True`` moves (when their shard did not overflow).
_ELIGIBLE: Final = frozenset(
    {EntryClass.TERMINAL_OR_UNKNOWN, EntryClass.TEMP_FILE, EntryClass.UNKNOWN_FILE}
)


class Action(enum.StrEnum):
    """What happened to an entry."""

    #: Protected, unsafe or too young: left alone.
    KEEP = "keep"
    #: Report mode: ``--quarantine`` would move it.
    WOULD_QUARANTINE = "would_quarantine"
    #: Moved into the orphan quarantine.
    QUARANTINED = "quarantined"
    #: Eligible, but its shard overflowed: nothing in it moves this round.
    SKIPPED_OVERFLOW = "skipped_overflow"
    #: The orphan quarantine already holds that name; nothing was overwritten.
    SKIPPED_TARGET_EXISTS = "skipped_target_exists"
    #: The file vanished, was replaced or was modified since it was classified.
    SKIPPED_CHANGED = "skipped_changed"


class ShardStatus(enum.StrEnum):
    """How a shard directory looked."""

    OK = "ok"
    MISSING = "missing"
    OVERFLOW = "overflow"


class AuditOptionError(UsageError, ValueError):
    """An option is malformed or above its hard cap (exit 2 in the CLI)."""


class AuditError(QlError):
    """The audit could not read or move what it needed (I/O); nothing unsafe was done."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One classified directory entry; ``ref`` is ``<xx>/<name>`` relative to the receipt root."""

    ref: str
    shard: str
    entry_class: EntryClass
    action: Action
    #: regular | symlink | directory | fifo | socket | block_device | char_device | other
    file_type: str
    #: Whole seconds since the last modification (negative if the mtime is in the future).
    age_s: int
    #: The attempt id parsed from a receipt or temp name, else None.
    attempt_id: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "class": str(self.entry_class),
            "action": str(self.action),
            "type": self.file_type,
            "age_s": self.age_s,
        }


@dataclass(frozen=True, slots=True)
class ShardReport:
    """One audited shard: its status and how many entries were classified (at most the limit)."""

    shard: str
    status: ShardStatus
    entries: int

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "status": str(self.status), "entries": self.entries}


@dataclass(frozen=True, slots=True)
class AuditReport:
    """The result of one :func:`audit_receipts` call."""

    #: "report" (nothing changed) or "quarantine".
    mode: str
    start_shard: str
    #: The shard after the last one audited: pass it as ``shard`` next time.
    next_shard: str
    limit: int
    min_age_s: int
    shards: tuple[ShardReport, ...]
    entries: tuple[AuditEntry, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Entries per class; every class is present."""
        counts = {str(c): 0 for c in EntryClass}
        for entry in self.entries:
            counts[str(entry.entry_class)] += 1
        return counts

    @property
    def moved(self) -> int:
        """Files moved into the orphan quarantine."""
        return sum(1 for e in self.entries if e.action is Action.QUARANTINED)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (stable field names)."""
        return {
            "mode": self.mode,
            "start_shard": self.start_shard,
            "next_shard": self.next_shard,
            "limit": self.limit,
            "min_age_s": self.min_age_s,
            "counts": self.counts,
            "moved": self.moved,
            "shards": [s.to_dict() for s in self.shards],
            "entries": [e.to_dict() for e in self.entries],
        }


# --------------------------------------------------------------------- options


def parse_shard(text: str) -> int:
    """``"00"``..``"ff"`` (either case) -> 0..255, else :class:`AuditOptionError`."""
    if not isinstance(text, str) or _SHARD_PATTERN.fullmatch(text) is None:
        shown = repr(text)[:24]
        raise AuditOptionError(f"--shard must be two hex digits 00..ff, got {shown}")
    return int(text, 16)


def shard_names(start: int, count: int) -> tuple[str, ...]:
    """``count`` shard names from ``start``, wrapping around ``ff`` -> ``00``."""
    return tuple(f"{(start + i) % SHARD_COUNT:02x}" for i in range(count))


def _check_int(name: str, value: object, low: int, high: int, unit: str, cap_note: str = "") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise AuditOptionError(f"{name} must be a whole number from {low} to {high} ({unit})")
    if value > high:
        raise AuditOptionError(f"{name} {value} is above the hard cap of {high} {unit}{cap_note}")
    if value < low:
        raise AuditOptionError(f"{name} {value} is below the minimum of {low} {unit}")
    return value


def _check_options(shards: object, limit: object, min_age_s: object) -> tuple[int, int, int]:
    return (
        _check_int("--shards", shards, 1, MAX_SHARDS, "shards per run",
                   "; continue from next_shard in the next run"),
        _check_int("--limit", limit, 1, MAX_LIMIT, "entries per shard"),
        _check_int("--min-age", min_age_s, MIN_AGE_FLOOR_S, MAX_MIN_AGE_S, "seconds"),
    )


# ---------------------------------------------------------------- file system


def _file_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "regular"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISBLK(mode):
        return "block_device"
    if stat.S_ISCHR(mode):
        return "char_device"
    return "other"


def _display_name(name: str) -> str:
    """A bounded, printable-ASCII rendering of an entry name (never the file's content)."""
    raw = os.fsencode(name)
    text = "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)
    if len(text) > _MAX_REF_NAME:
        text = text[: _MAX_REF_NAME - 3] + "..."
    return text


def _verify_dir_path(path: str, what: str, *, private: bool) -> os.stat_result | None:
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


def _open_verified(name: str, parent_fd: int | None, path: str, expected: os.stat_result,
                   what: str) -> int | None:
    """Open a verified directory with O_NOFOLLOW and check it is the very one that was verified."""
    try:
        if parent_fd is None:
            fd = os.open(path, DIR_FLAGS)
        else:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in UNSAFE_ERRNOS:
            raise UnsafePathError(f"{what} became a symlink or non-directory; refusing") from exc
        raise AuditError(f"cannot open {what}: {exc.strerror}") from exc
    try:
        if not same_file(os.fstat(fd), expected):
            raise UnsafePathError(f"{what} was replaced while being verified; refusing")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _reverify(fd: int, path: str, what: str) -> None:
    """Before working on a directory: its path still is a real, canonical directory: ``fd``'s."""
    st = _verify_dir_path(path, what, private=True)
    if st is None or not same_file(st, os.fstat(fd)):
        raise UnsafePathError(f"{what} was replaced during the audit; stopping")


def _ensure_private_subdir(parent_fd: int, name: str, path: str, what: str) -> int:
    """Open (creating 0700 if missing) a private subdirectory of the orphan quarantine."""
    created = False
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise AuditError(f"cannot create {what}: {exc.strerror}") from exc
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in UNSAFE_ERRNOS:
            raise UnsafePathError(f"{what} is a symlink or not a directory; refusing") from exc
        raise AuditError(f"cannot open {what}: {exc.strerror}") from exc
    try:
        if created:
            os.fchmod(fd, 0o700)  # exact mode whatever the umask
            os.fsync(parent_fd)  # the new directory entry is durable
        _reverify(fd, path, what)
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


# ------------------------------------------------------------------- database


# ----------------------------------------------------------------------- scan


@dataclass(slots=True)
class _Found:
    name: str
    st: os.stat_result
    attempt_id: str | None
    #: "receipt" | "temp" when the name is one of the contract names in its own shard, else "other".
    kind: str


@dataclass(slots=True)
class _Shard:
    name: str
    path: str
    status: ShardStatus
    fd: int | None
    found: list[_Found]


def _parse_name(name: str, shard: str) -> tuple[str | None, str]:
    for kind, pattern in (("receipt", RECEIPT_NAME_PATTERN), ("temp", TEMP_NAME_PATTERN)):
        match = pattern.fullmatch(name)
        if match is not None:
            attempt_id = match.group("attempt_id")
            return attempt_id, (kind if attempt_id[-2:] == shard else "other")
    return None, "other"


def _scan_shard(root: str, root_fd: int, shard: str, limit: int, stack: ExitStack) -> _Shard:
    path = os.path.join(root, shard)
    what = f"receipts/{shard}"
    st = _verify_dir_path(path, what, private=False)
    fd = _open_verified(shard, root_fd, path, st, what) if st is not None else None
    if fd is None:
        return _Shard(shard, path, ShardStatus.MISSING, None, [])
    stack.callback(os.close, fd)
    found: list[_Found] = []
    overflow = False
    try:
        with os.scandir(fd) as it:
            for seen, entry in enumerate(it):
                if seen >= limit:  # the limit+1-th entry: stop reading here
                    overflow = True
                    break
                try:
                    entry_st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # vanished between readdir and lstat
                attempt_id, kind = _parse_name(entry.name, shard)
                found.append(_Found(entry.name, entry_st, attempt_id, kind))
    except OSError as exc:
        raise AuditError(f"cannot list {what}: {exc.strerror}") from exc
    found.sort(key=lambda f: os.fsencode(f.name))
    return _Shard(shard, path, ShardStatus.OVERFLOW if overflow else ShardStatus.OK, fd, found)


def _classify(found: _Found, journal: Mapping[str, str], attempts: Mapping[str, str],
              now: float, min_age_s: int) -> EntryClass:
    if not stat.S_ISREG(found.st.st_mode):
        return EntryClass.UNSAFE
    if found.attempt_id is not None:
        if found.attempt_id in journal:
            return EntryClass.JOURNAL_REGISTERED
        status = attempts.get(found.attempt_id)
        if status is not None and status not in FINAL_ATTEMPT_STATUSES:
            return EntryClass.ACTIVE_ATTEMPT  # active, blocked, or a status unknown here
    if found.kind == "receipt":
        base = EntryClass.TERMINAL_OR_UNKNOWN
    elif found.kind == "temp":
        base = EntryClass.TEMP_FILE
    else:
        base = EntryClass.UNKNOWN_FILE
    if now - found.st.st_mtime < min_age_s:
        return EntryClass.TOO_YOUNG
    return base


# ----------------------------------------------------------------------- move


def _move(shard_fd: int, target_fd: int, found: _Found) -> Action:
    """Hard-link into the orphan quarantine (no replace), then unlink the original."""
    name = found.name
    linked_now = False
    try:
        os.link(name, name, src_dir_fd=shard_fd, dst_dir_fd=target_fd, follow_symlinks=False)
        linked_now = True
    except FileExistsError:
        existing = lstat_at(name, target_fd)
        if existing is None or not same_file(existing, found.st):
            return Action.SKIPPED_TARGET_EXISTS  # a different file: never replaced
        # The very same file is already there: an earlier run stopped between link and
        # unlink. Finishing that move is safe; the link below is verified like a new one.
    except FileNotFoundError:
        return Action.SKIPPED_CHANGED
    except OSError as exc:
        raise AuditError(f"cannot link into the orphan quarantine: {exc.strerror}") from exc
    try:
        copy = lstat_at(name, target_fd)
        original = lstat_at(name, shard_fd)
        unchanged = (
            copy is not None
            and stat.S_ISREG(copy.st_mode)
            and same_file(copy, found.st)
            and copy.st_mtime_ns == found.st.st_mtime_ns
            and copy.st_size == found.st.st_size
        )
        if not unchanged:
            # The name now holds another file, or the file was written to since it was
            # classified: withdraw the link made just now, but only while the original name
            # still holds the very same file (so nothing becomes unreachable).
            if (linked_now and copy is not None and original is not None
                    and same_file(copy, original)):
                os.unlink(name, dir_fd=target_fd)
            return Action.SKIPPED_CHANGED
        assert copy is not None  # implied by ``unchanged``
        os.fsync(target_fd)  # the quarantined link is durable before the original goes
        if original is None or not same_file(original, copy):
            return Action.QUARANTINED  # the original name is already gone (or reused: left alone)
        os.unlink(name, dir_fd=shard_fd)
    except OSError as exc:
        raise AuditError(f"cannot move a file into the orphan quarantine: {exc.strerror}") from exc
    return Action.QUARANTINED


def _quarantine(root: str, root_fd: int, shards: Sequence[_Shard],
                actions: dict[tuple[str, str], Action], stack: ExitStack) -> None:
    """Phase 2: re-verify and prepare every directory involved, then move eligible files."""
    work: list[tuple[_Shard, int, list[_Found]]] = []
    for shard in shards:
        if shard.status is ShardStatus.OK and shard.fd is not None:
            files = [f for f in shard.found
                     if actions[(shard.name, f.name)] is Action.WOULD_QUARANTINE]
            if files:
                work.append((shard, shard.fd, files))
    if not work:
        return  # nothing eligible: create nothing
    _reverify(root_fd, root, "receipts")
    for shard, fd, _ in work:
        _reverify(fd, shard.path, f"receipts/{shard.name}")
    # Every target directory exists and is verified before the first file moves.
    oq_path = os.path.join(root, ORPHAN_QUARANTINE_DIR_NAME)
    oq_what = f"receipts/{ORPHAN_QUARANTINE_DIR_NAME}"
    oq_fd = _ensure_private_subdir(root_fd, ORPHAN_QUARANTINE_DIR_NAME, oq_path, oq_what)
    stack.callback(os.close, oq_fd)
    targets: list[int] = []
    for shard, _, _ in work:
        target_fd = _ensure_private_subdir(oq_fd, shard.name, os.path.join(oq_path, shard.name),
                                           f"{oq_what}/{shard.name}")
        stack.callback(os.close, target_fd)
        targets.append(target_fd)
    for (shard, fd, files), target_fd in zip(work, targets):
        _reverify(fd, shard.path, f"receipts/{shard.name}")  # right before working on it
        moved = False
        for found in files:
            action = _move(fd, target_fd, found)
            actions[(shard.name, found.name)] = action
            moved = moved or action is Action.QUARANTINED
        if moved:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise AuditError(f"cannot sync receipts/{shard.name}: {exc.strerror}") from exc


def _verify_orphan_quarantine(root: str, shards: Sequence[str], *, private: bool) -> None:
    """The orphan quarantine and its shard dirs, where present, are real and canonical."""
    oq_path = os.path.join(root, ORPHAN_QUARANTINE_DIR_NAME)
    oq_what = f"receipts/{ORPHAN_QUARANTINE_DIR_NAME}"
    checks = [(oq_path, oq_what)] + [(os.path.join(oq_path, s), f"{oq_what}/{s}") for s in shards]
    for i, (path, what) in enumerate(checks):
        st = _verify_dir_path(path, what, private=private)
        if st is None:
            if i == 0:
                return
            continue
        if private and stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafePathError(f"{what} must be private (0700); chmod 700 it")


# ------------------------------------------------------------------------ api


def audit_receipts(
    data_dir: str | os.PathLike[str],
    database_url: str,
    *,
    shard: str = DEFAULT_SHARD,
    shards: int = DEFAULT_SHARDS,
    limit: int = DEFAULT_LIMIT,
    min_age_s: int = DEFAULT_MIN_AGE_S,
    quarantine: bool = False,
    now: float | None = None,
) -> AuditReport:
    """Audit ``shards`` receipt shards from ``shard`` (see the module docstring for the contract).

    Raises :class:`AuditOptionError` for a malformed option or one above its
    cap, :class:`~ql_core.errors.UnsafePathError` when a directory is a
    symlink or escapes the canonical receipt root (before anything moves),
    :class:`~ql_core.errors.DatabaseError` when attempt ids were found but the
    run database cannot be read, and :class:`AuditError` for other I/O
    failures. With ``quarantine=False`` nothing under the data dir changes,
    except that SQLite may create its usual empty ``-wal``/``-shm`` side files
    next to a WAL database it reads.
    """
    start = parse_shard(shard)
    shards, limit, min_age_s = _check_options(shards, limit, min_age_s)
    names = shard_names(start, shards)
    clock = time.time() if now is None else float(now)
    root = os.path.join(os.path.realpath(os.fspath(data_dir)), "receipts")
    scanned: list[_Shard] = []
    entries: dict[tuple[str, str], tuple[EntryClass, Action]] = {}

    with ExitStack() as stack:
        # Phase 1: verify and read; nothing changes.
        root_st = _verify_dir_path(root, "receipts", private=quarantine)
        root_fd = None
        if root_st is not None:
            root_fd = _open_verified(root, None, root, root_st, "receipts")
        if root_fd is None:
            scanned = [_Shard(n, os.path.join(root, n), ShardStatus.MISSING, None, [])
                       for n in names]
        else:
            stack.callback(os.close, root_fd)
            _verify_orphan_quarantine(root, names, private=quarantine)
            scanned = [_scan_shard(root, root_fd, n, limit, stack) for n in names]
            ids = sorted({f.attempt_id for s in scanned for f in s.found
                          if f.attempt_id is not None and stat.S_ISREG(f.st.st_mode)})
            journal, attempts = lookup_states(database_url, ids)

            classes: dict[tuple[str, str], EntryClass] = {}
            actions: dict[tuple[str, str], Action] = {}
            for s in scanned:
                for f in s.found:
                    key = (s.name, f.name)
                    classes[key] = _classify(f, journal, attempts, clock, min_age_s)
                    if classes[key] not in _ELIGIBLE:
                        actions[key] = Action.KEEP
                    elif s.status is ShardStatus.OVERFLOW:
                        actions[key] = Action.SKIPPED_OVERFLOW
                    else:
                        actions[key] = Action.WOULD_QUARANTINE

            # Phase 2, only on explicit request: move eligible regular files.
            if quarantine:
                _quarantine(root, root_fd, scanned, actions, stack)
            entries = {key: (cls, actions[key]) for key, cls in classes.items()}

    out: list[AuditEntry] = []
    for s in scanned:
        for f in s.found:
            cls, action = entries[(s.name, f.name)]
            out.append(AuditEntry(
                ref=f"{s.name}/{_display_name(f.name)}",
                shard=s.name,
                entry_class=cls,
                action=action,
                file_type=_file_type(f.st.st_mode),
                age_s=int(clock - f.st.st_mtime),
                attempt_id=f.attempt_id,
            ))
    return AuditReport(
        mode="quarantine" if quarantine else "report",
        start_shard=names[0],
        next_shard=f"{(start + shards) % SHARD_COUNT:02x}",
        limit=limit,
        min_age_s=min_age_s,
        shards=tuple(ShardReport(s.name, s.status, len(s.found)) for s in scanned),
        entries=tuple(out),
    )
