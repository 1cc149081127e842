"""SQLite's reads of kept logs: one range of ``ix_ql_log_order`` each (revision 0015_sqlite_log_order).

``ql_log_artifact.log_order`` (a VIRTUAL generated column: nothing stored) is a log's
``created_at_ms`` once its size is recorded and :data:`UNSIZED` before; ``ix_ql_log_order (log_order,
id) WHERE deleted_at_ms IS NULL`` holds every undeleted log: the sized ones by age, then the unsized
ones (running logs and the sizing queue) by id, at the index's right edge. A task's create appends
its log's entry at that edge and its end (the size recorded) moves it to the newest end of the
sized range, beside it: one index leaf per commit, where two partial indexes (``ix_ql_log_unsized``,
``ix_ql_log_kept``, PostgreSQL's still) cost three leaves per task and their splits.

Each statement is one range of the index, joined to the attempt by its id (CROSS JOIN fixes the
order), with the columns of :data:`ql_core.db.journal_sql.LOG_COLUMNS`. Logs created before a cutoff
are two ranges: the sized ones (``log_order < cutoff``, in order) and the unsized ones created
before it (the sizing queue and running logs, sorted: bounded by work in flight, never history).
"""

from __future__ import annotations

from .journal_sql import ENDED, LIVE, LOG_COLUMNS_L

__all__ = ["UNSIZED", "PAGE_LIVE_LOGS", "ENDED_LOGS_UNSIZED", "ENDED_LOGS_OLDER", "ENDED_LOGS_SIZED"]

#: ``log_order`` of a log not sized yet: after every creation time.
UNSIZED = (1 << 63) - 1

_FROM = ("FROM ql_log_artifact l INDEXED BY ix_ql_log_order CROSS JOIN ql_run_attempt a ON a.id = l.attempt_id "
         "WHERE l.deleted_at_ms IS NULL AND ")
_QUEUE = f"l.log_order = {UNSIZED}"

#: Unsized logs of live attempts, by id after a cursor (parameters: after, owner, limit).
PAGE_LIVE_LOGS = (f"SELECT {LOG_COLUMNS_L} {_FROM}{_QUEUE} AND l.id > ? AND a.runtime_owner = ? "
                  f"AND a.status IN {LIVE} ORDER BY l.id LIMIT ?")
#: The sizing queue: unsized logs of ended attempts, by id (parameters: owner, limit).
ENDED_LOGS_UNSIZED = (f"SELECT {LOG_COLUMNS_L} {_FROM}{_QUEUE} AND a.runtime_owner = ? AND a.status IN {ENDED} "
                      "ORDER BY l.id LIMIT ?")
#: Sized logs of ended attempts, oldest first (parameters: owner, limit).
ENDED_LOGS_SIZED = (f"SELECT {LOG_COLUMNS_L} {_FROM}l.log_order < {UNSIZED} AND a.runtime_owner = ? "
                    f"AND a.status IN {ENDED} ORDER BY l.log_order, l.id LIMIT ?")
# The sized arm returns log_order in created_at_ms's place (equal for a sized log), so the index's
# order is the compound's: SQLite merges the arms and sorts only the unsized one.
_SIZED_COLUMNS = LOG_COLUMNS_L.replace("l.created_at_ms", "l.log_order")
# A compound SELECT orders by result column position: created_at_ms's, derived from the column list.
_CREATED_AT = [c.strip() for c in LOG_COLUMNS_L.split(",")].index("l.created_at_ms") + 1
#: Logs of ended attempts created before a cutoff, oldest first (parameters: owner, cutoff, limit).
ENDED_LOGS_OLDER = (f"SELECT {_SIZED_COLUMNS} {_FROM}l.log_order < ?2 AND a.runtime_owner = ?1 "
                    f"AND a.status IN {ENDED} "
                    f"UNION ALL SELECT {LOG_COLUMNS_L} {_FROM}{_QUEUE} AND l.created_at_ms < ?2 "
                    f"AND a.runtime_owner = ?1 AND a.status IN {ENDED} ORDER BY {_CREATED_AT}, 1 LIMIT ?3")
