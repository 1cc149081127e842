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

See ``docs/audit.md`` for the operator's view. The parts: :mod:`.model` (limits, classes,
actions, the report, the option checks), :mod:`.dirs` (verified directories), :mod:`.scan`
(phase 1: list and classify), :mod:`.move` (phase 2: the orphan quarantine); this module runs them.
"""

from __future__ import annotations

import os
import stat
import time
from contextlib import ExitStack

from ql_core.db.audit_reads import ID_BATCH_SIZE, lookup_states

from .model import (DEFAULT_LIMIT, DEFAULT_MIN_AGE_S, DEFAULT_SHARD, DEFAULT_SHARDS, ELIGIBLE, FINAL_ATTEMPT_STATUSES,
                    MAX_LIMIT, MAX_MIN_AGE_S, MAX_SHARDS, MIN_AGE_FLOOR_S, ORPHAN_QUARANTINE_DIR_NAME, SHARD_COUNT,
                    Action, AuditEntry, AuditError, AuditOptionError, AuditReport, EntryClass, ShardReport,
                    ShardStatus, check_options, display_name, file_type, parse_shard, shard_names)
from .dirs import open_verified, verify_dir_path
from .move import quarantine_eligible, verify_orphan_quarantine
from .scan import Shard, classify, scan_shard

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
    shards, limit, min_age_s = check_options(shards, limit, min_age_s)
    names = shard_names(start, shards)
    clock = time.time() if now is None else float(now)
    root = os.path.join(os.path.realpath(os.fspath(data_dir)), "receipts")
    scanned: list[Shard] = []
    entries: dict[tuple[str, str], tuple[EntryClass, Action]] = {}

    with ExitStack() as stack:
        # Phase 1: verify and read; nothing changes.
        root_st = verify_dir_path(root, "receipts", private=quarantine)
        root_fd = None
        if root_st is not None:
            root_fd = open_verified(root, None, root, root_st, "receipts")
        if root_fd is None:
            scanned = [Shard(n, os.path.join(root, n), ShardStatus.MISSING, None, [])
                       for n in names]
        else:
            stack.callback(os.close, root_fd)
            verify_orphan_quarantine(root, names, private=quarantine)
            scanned = [scan_shard(root, root_fd, n, limit, stack) for n in names]
            ids = sorted({f.attempt_id for s in scanned for f in s.found
                          if f.attempt_id is not None and stat.S_ISREG(f.st.st_mode)})
            journal, attempts = lookup_states(database_url, ids)

            classes: dict[tuple[str, str], EntryClass] = {}
            actions: dict[tuple[str, str], Action] = {}
            for s in scanned:
                for f in s.found:
                    key = (s.name, f.name)
                    classes[key] = classify(f, journal, attempts, clock, min_age_s)
                    if classes[key] not in ELIGIBLE:
                        actions[key] = Action.KEEP
                    elif s.status is ShardStatus.OVERFLOW:
                        actions[key] = Action.SKIPPED_OVERFLOW
                    else:
                        actions[key] = Action.WOULD_QUARANTINE

            # Phase 2, only on explicit request: move eligible regular files.
            if quarantine:
                quarantine_eligible(root, root_fd, scanned, actions, stack)
            entries = {key: (cls, actions[key]) for key, cls in classes.items()}

    out: list[AuditEntry] = []
    for s in scanned:
        for f in s.found:
            cls, action = entries[(s.name, f.name)]
            out.append(AuditEntry(
                ref=f"{s.name}/{display_name(f.name)}",
                shard=s.name,
                entry_class=cls,
                action=action,
                file_type=file_type(f.st.st_mode),
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
