"""Phase 1 of the receipt audit: list a shard (bounded) and classify what is in it; nothing changes."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass

from ql_core.receipts.names import RECEIPT_NAME_PATTERN, TEMP_NAME_PATTERN

from .dirs import open_verified, verify_dir_path
from .model import FINAL_ATTEMPT_STATUSES, AuditError, EntryClass, ShardStatus

__all__ = ["Found", "Shard", "scan_shard", "classify"]


@dataclass(slots=True)
class Found:
    """One shard entry as listed (``lstat``, never opened) and what its name says."""

    name: str
    st: os.stat_result
    attempt_id: str | None
    #: "receipt" | "temp" when the name is one of the contract names in its own shard, else "other".
    kind: str


@dataclass(slots=True)
class Shard:
    """One listed shard: its verified fd (closed by the caller's stack) and its entries."""

    name: str
    path: str
    status: ShardStatus
    fd: int | None
    found: list[Found]


def _parse_name(name: str, shard: str) -> tuple[str | None, str]:
    for kind, pattern in (("receipt", RECEIPT_NAME_PATTERN), ("temp", TEMP_NAME_PATTERN)):
        match = pattern.fullmatch(name)
        if match is not None:
            attempt_id = match.group("attempt_id")
            return attempt_id, (kind if attempt_id[-2:] == shard else "other")
    return None, "other"


def scan_shard(root: str, root_fd: int, shard: str, limit: int, stack: ExitStack) -> Shard:
    path = os.path.join(root, shard)
    what = f"receipts/{shard}"
    st = verify_dir_path(path, what, private=False)
    fd = open_verified(shard, root_fd, path, st, what) if st is not None else None
    if fd is None:
        return Shard(shard, path, ShardStatus.MISSING, None, [])
    stack.callback(os.close, fd)
    found: list[Found] = []
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
                found.append(Found(entry.name, entry_st, attempt_id, kind))
    except OSError as exc:
        raise AuditError(f"cannot list {what}: {exc.strerror}") from exc
    found.sort(key=lambda f: os.fsencode(f.name))
    return Shard(shard, path, ShardStatus.OVERFLOW if overflow else ShardStatus.OK, fd, found)


def classify(found: Found, journal: Mapping[str, str], attempts: Mapping[str, str],
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
