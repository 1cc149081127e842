"""The receipt audit's vocabulary: its limits, what an entry is and what became of it, the report.

Everything :func:`ql_core.audit.audit_receipts` returns or raises is defined here, with the checks of
its options (each bounded by a hard cap, ADR-0007 §2.9).
"""

from __future__ import annotations

import enum
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Final

from ql_core.errors import QlError, UsageError
from ql_core.states import ATTEMPT_FINAL

__all__ = ["DEFAULT_LIMIT", "DEFAULT_MIN_AGE_S", "DEFAULT_SHARD", "DEFAULT_SHARDS", "ELIGIBLE",
           "FINAL_ATTEMPT_STATUSES", "MAX_LIMIT", "MAX_MIN_AGE_S", "MAX_SHARDS", "MIN_AGE_FLOOR_S",
           "ORPHAN_QUARANTINE_DIR_NAME", "SHARD_COUNT", "Action", "AuditEntry", "AuditError", "AuditOptionError",
           "AuditReport", "EntryClass", "ShardReport", "ShardStatus", "check_options", "display_name", "file_type",
           "parse_shard", "shard_names"]

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
ELIGIBLE: Final = frozenset(
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


def check_options(shards: object, limit: object, min_age_s: object) -> tuple[int, int, int]:
    return (
        _check_int("--shards", shards, 1, MAX_SHARDS, "shards per run",
                   "; continue from next_shard in the next run"),
        _check_int("--limit", limit, 1, MAX_LIMIT, "entries per shard"),
        _check_int("--min-age", min_age_s, MIN_AGE_FLOOR_S, MAX_MIN_AGE_S, "seconds"),
    )


# ------------------------------------------------------------------- rendering


#: ``AuditEntry.file_type`` by the test that recognises it, first match wins.
_FILE_TYPES: Final = ((stat.S_ISREG, "regular"), (stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"),
                      (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISBLK, "block_device"),
                      (stat.S_ISCHR, "char_device"))


def file_type(mode: int) -> str:
    """What an entry is, by its ``lstat`` mode (never by opening it)."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "other")


def display_name(name: str) -> str:
    """A bounded, printable-ASCII rendering of an entry name (never the file's content)."""
    raw = os.fsencode(name)
    text = "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)
    if len(text) > _MAX_REF_NAME:
        text = text[: _MAX_REF_NAME - 3] + "..."
    return text
