"""SQLite's reads of kept logs: one range of ``ix_ql_log_order`` each (revision 0015_sqlite_log_order).

``ql_log_artifact.log_order`` (a VIRTUAL generated column: nothing stored) is a log's
``created_at_ms`` once its size is recorded and :data:`UNSIZED` before; ``ix_ql_log_order (log_order,
id) WHERE deleted_at_ms IS NULL`` holds every undeleted log: the sized ones by age, then the unsized
ones (running logs and the sizing queue) by id, at the index's right edge. A task's create appends
its log's entry at that edge and its end (the size recorded) moves it to the newest end of the
sized range, beside it: one index leaf per commit, where two partial indexes (``ix_ql_log_unsized``,
``ix_ql_log_kept``, PostgreSQL's still) cost three leaves per task and their splits.

Each statement is one range of the index, joined to the log's attempt (CROSS JOIN fixes the order),
with the columns of :data:`ql_core.db.journal_sql.LOG_COLUMNS`.

A log row written since revision 0016 leaves ``attempt_id`` and ``relative_path`` empty (``''``):
the path is derived from the log's id (``ql_core.paths.log_relative_path``, as every reader does),
and the attempt is the one of the log's run whose ``log_artifact_id`` is the log — one range of the
attempt key through the run's row (:data:`ATTEMPT_OF_LOG`). So the row (two ids, the sizes, the
clocks: ~92 bytes) fits the 102 bytes a 512-byte index B-tree page keeps in a cell: with all three
ids and the path (~170) every log row spilled into an overflow page of its own (a WAL frame in every
create and 512 bytes of database per task, ``bench/wal_pages.py``). Rows written before keep theirs;
every statement reads the attempt the same way for both. Logs created before a cutoff
are two ranges: the sized ones (``log_order < cutoff``, in order) and the unsized ones created
before it (the sizing queue and running logs, sorted: bounded by work in flight, never history).
"""

from __future__ import annotations

from .journal_sql import ENDED, LIVE, LOG_COLUMNS
from .sqlite_runs import ATTEMPTS_OF

__all__ = ["UNSIZED", "ATTEMPT_OF_LOG", "LOG_COLUMNS_A", "INSERT_LOG", "SELECT_LOG", "PAGE_LIVE_LOGS",
           "ENDED_LOGS_UNSIZED", "ENDED_LOGS_OLDER", "ENDED_LOGS_SIZED"]

#: ``log_order`` of a log not sized yet: after every creation time.
UNSIZED = (1 << 63) - 1

#: The attempt ``a`` of the log ``l`` through its run ``r`` (a join's tail: ``l`` comes before it).
ATTEMPT_OF_LOG = f"CROSS JOIN ql_run r ON r.id = l.run_id CROSS JOIN ql_run_attempt a ON {ATTEMPTS_OF} " \
                 "AND a.log_artifact_id = l.id"
#: :data:`ql_core.db.journal_sql.LOG_COLUMNS` of the log ``l`` joined to its attempt ``a``: the
#: attempt's id from the attempt (a row written since 0016 leaves its own empty).
LOG_COLUMNS_A = ", ".join("a.id" if c.strip() == "attempt_id" else f"l.{c.strip()}" for c in LOG_COLUMNS.split(","))

#: The create's log row (parameters: id, run id, attempt id, relative path, max bytes, created): the
#: attempt id and the path are not stored (both derived; see above), so the row fits its cell.
INSERT_LOG = ("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, truncated, "
              "created_at_ms) VALUES (?1, ?2, '', '', ?5, 0, ?6)")
#: One log by id, with its attempt's id (parameters: id). No attempt found (a row left by something
#: else), the row's own column.
SELECT_LOG = (f"SELECT {LOG_COLUMNS_A.replace('a.id', 'COALESCE(a.id, l.attempt_id)')} FROM ql_log_artifact l "
              f"LEFT JOIN ql_run r ON r.id = l.run_id LEFT JOIN ql_run_attempt a ON {ATTEMPTS_OF} "
              "AND a.log_artifact_id = l.id WHERE l.id = ?")

_FROM = f"FROM ql_log_artifact l INDEXED BY ix_ql_log_order {ATTEMPT_OF_LOG} WHERE l.deleted_at_ms IS NULL AND "
_QUEUE = f"l.log_order = {UNSIZED}"

#: Unsized logs of live attempts, by id after a cursor (parameters: after, owner, limit).
PAGE_LIVE_LOGS = (f"SELECT {LOG_COLUMNS_A} {_FROM}{_QUEUE} AND l.id > ? AND a.runtime_owner = ? "
                  f"AND a.status IN {LIVE} ORDER BY l.id LIMIT ?")
#: The sizing queue: unsized logs of ended attempts, by id (parameters: owner, limit).
ENDED_LOGS_UNSIZED = (f"SELECT {LOG_COLUMNS_A} {_FROM}{_QUEUE} AND a.runtime_owner = ? AND a.status IN {ENDED} "
                      "ORDER BY l.id LIMIT ?")
#: Sized logs of ended attempts, oldest first (parameters: owner, limit).
ENDED_LOGS_SIZED = (f"SELECT {LOG_COLUMNS_A} {_FROM}l.log_order < {UNSIZED} AND a.runtime_owner = ? "
                    f"AND a.status IN {ENDED} ORDER BY l.log_order, l.id LIMIT ?")
# The sized arm returns log_order in created_at_ms's place (equal for a sized log), so the index's
# order is the compound's: SQLite merges the arms and sorts only the unsized one.
_SIZED_COLUMNS = LOG_COLUMNS_A.replace("l.created_at_ms", "l.log_order")
# A compound SELECT orders by result column position: created_at_ms's, derived from the column list.
_CREATED_AT = [c.strip() for c in LOG_COLUMNS_A.split(",")].index("l.created_at_ms") + 1
#: Logs of ended attempts created before a cutoff, oldest first (parameters: owner, cutoff, limit).
ENDED_LOGS_OLDER = (f"SELECT {_SIZED_COLUMNS} {_FROM}l.log_order < ?2 AND a.runtime_owner = ?1 "
                    f"AND a.status IN {ENDED} "
                    f"UNION ALL SELECT {LOG_COLUMNS_A} {_FROM}{_QUEUE} AND l.created_at_ms < ?2 "
                    f"AND a.runtime_owner = ?1 AND a.status IN {ENDED} ORDER BY {_CREATED_AT}, 1 LIMIT ?3")
