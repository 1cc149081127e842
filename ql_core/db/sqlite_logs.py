"""SQLite's reads of kept logs: ranges of ``ix_ql_log_order`` (revisions 0015 and 0020), and the live logs.

``ql_log_artifact.log_order`` (a VIRTUAL generated column: nothing stored) is a log's
``created_at_ms`` once its size is recorded and :data:`UNSIZED` before. ``ix_ql_log_order (log_order,
id)`` lists the undeleted logs that retention and the sizing queue read (:data:`LISTED`, revision
0020): the sized ones that are not empty, by age, then the sizing queue — logs whose attempt ended
before their size was recorded (``size_due``, set by that terminal commit: ``edge_sqlite``'s
``_terminal_also``) — by id, at the index's right edge. A running log is not listed (the quota pass
reads the live runs' logs, :data:`PAGE_LIVE_LOGS`), nor an empty one (nothing to keep or free): the
usual awaited task, whose terminal commit records its size (0), never writes the index, where 0015's
listing of every undeleted log cost a leaf in both of its commits (~2.9 WAL frames per task with the
splits, ``bench/wal_pages.py``). Two partial indexes before that (``ix_ql_log_unsized``,
``ix_ql_log_kept``, PostgreSQL's still) cost three leaves per task.

Each ended-log statement is one range of the index (its WHERE repeats :data:`LISTED`, which SQLite
needs to use a partial index), joined to the log's attempt (CROSS JOIN fixes the order), with the
columns of :data:`ql_core.db.journal_sql.LOG_COLUMNS`.

A log row written since revision 0016 leaves ``attempt_id`` and ``relative_path`` empty (``''``):
the path is derived from the log's id (``ql_core.paths.log_relative_path``, as every reader does),
and the attempt is the one of the log's run whose ``log_artifact_id`` is the log — one range of the
attempt key through the run's row (:data:`ATTEMPT_OF_LOG`). So the row (two ids, the sizes, the
clocks: ~92 bytes) fits the 102 bytes a 512-byte index B-tree page keeps in a cell: with all three
ids and the path (~170) every log row spilled into an overflow page of its own (a WAL frame in every
create and 512 bytes of database per task, ``bench/wal_pages.py``). Rows written before keep theirs;
every statement reads the attempt the same way for both. Logs created before a cutoff
are two ranges: the sized ones (``log_order < cutoff``, in order) and the queued ones created
before it (sorted: logs of ended attempts not sized yet, bounded by work, never history).
"""

from __future__ import annotations

from .journal_sql import ENDED, LIVE, LOG_COLUMNS
from .sqlite_runs import ATTEMPTS_OF, LIVE_ORDERS

__all__ = ["UNSIZED", "LISTED", "SIZE_DUE", "ATTEMPT_OF_LOG", "SIZE_A", "LOG_COLUMNS_A", "INSERT_LOG",
           "SELECT_LOG", "PAGE_LIVE_LOGS", "ENDED_LOGS_UNSIZED", "ENDED_LOGS_OLDER", "ENDED_LOGS_SIZED"]

#: ``log_order`` of a log not sized yet: after every creation time.
UNSIZED = (1 << 63) - 1
#: The condition of ``ix_ql_log_order`` besides ``deleted_at_ms IS NULL`` (revision 0020), as each
#: statement that reads the index must state it: sized and not empty, or due to be sized.
LISTED = "(l.size_bytes > 0 OR (l.size_bytes IS NULL AND l.size_due = 1))"
#: The terminal commit of an attempt whose log size it does not record: the log joins the sizing
#: queue (parameters: attempt id). The attempt's log, through the attempt's row (found by its id).
SIZE_DUE = ("UPDATE ql_log_artifact SET size_due = 1 WHERE id = (SELECT log_artifact_id FROM ql_run_attempt "
            "WHERE id = ?) AND size_bytes IS NULL AND size_due = 0")

#: The attempt ``a`` of the log ``l`` through its run ``r`` (a join's tail: ``l`` comes before it).
ATTEMPT_OF_LOG = f"CROSS JOIN ql_run r ON r.id = l.run_id CROSS JOIN ql_run_attempt a ON {ATTEMPTS_OF} " \
                 "AND a.log_artifact_id = l.id"
#: A log's size: its own, else 0 when its attempt ended with it empty (``a.log_empty``, 0020: that
#: terminal commit writes the attempt's row, not the log's).
SIZE_A = "COALESCE(l.size_bytes, CASE WHEN a.log_empty = 1 THEN 0 END)"
_FROM_ATTEMPT = {"attempt_id": "a.id", "size_bytes": SIZE_A}
#: :data:`ql_core.db.journal_sql.LOG_COLUMNS` of the log ``l`` joined to its attempt ``a``: the
#: attempt's id from the attempt (a row written since 0016 leaves its own empty), the size as
#: :data:`SIZE_A`.
LOG_COLUMNS_A = ", ".join(_FROM_ATTEMPT.get(c.strip(), f"l.{c.strip()}") for c in LOG_COLUMNS.split(","))

#: The create's log row (parameters: id, run id, attempt id, relative path, max bytes, created): the
#: attempt id and the path are not stored (both derived; see above), so the row fits its cell.
INSERT_LOG = ("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, truncated, "
              "created_at_ms) VALUES (?1, ?2, '', '', ?5, 0, ?6)")
#: One log by id, with its attempt's id (parameters: id). No attempt found (a row left by something
#: else), the row's own column.
SELECT_LOG = (f"SELECT {LOG_COLUMNS_A.replace('a.id', 'COALESCE(a.id, l.attempt_id)')} FROM ql_log_artifact l "
              f"LEFT JOIN ql_run r ON r.id = l.run_id LEFT JOIN ql_run_attempt a ON {ATTEMPTS_OF} "
              "AND a.log_artifact_id = l.id WHERE l.id = ?")

_FROM = (f"FROM ql_log_artifact l INDEXED BY ix_ql_log_order {ATTEMPT_OF_LOG} WHERE l.deleted_at_ms IS NULL "
         f"AND {LISTED} AND ")
_QUEUE = f"l.log_order = {UNSIZED}"

#: Unsized logs of live attempts, by id after a cursor (parameters: after, owner, limit): not listed
#: (0020), so read as 0018 reads the active attempts — the live ranges of ``ix_ql_run_order``, each
#: run's attempts by key, their logs by id — and sorted: live rows only, never history.
PAGE_LIVE_LOGS = (f"SELECT {LOG_COLUMNS_A} FROM ql_run r INDEXED BY ix_ql_run_order CROSS JOIN ql_run_attempt a "
                  f"ON {ATTEMPTS_OF} CROSS JOIN ql_log_artifact l ON l.id = a.log_artifact_id "
                  f"WHERE r.status_order IN {LIVE_ORDERS} AND a.runtime_owner = ?2 AND a.status IN {LIVE} "
                  "AND l.deleted_at_ms IS NULL AND l.size_bytes IS NULL AND l.id > ?1 ORDER BY l.id LIMIT ?3")
#: The sizing queue: unsized logs of ended attempts, by id (parameters: owner, limit).
ENDED_LOGS_UNSIZED = (f"SELECT {LOG_COLUMNS_A} {_FROM}{_QUEUE} AND a.runtime_owner = ? AND a.status IN {ENDED} "
                      "ORDER BY l.id LIMIT ?")
#: Sized logs of ended attempts, oldest first (parameters: owner, limit).
ENDED_LOGS_SIZED = (f"SELECT {LOG_COLUMNS_A} {_FROM}l.log_order < {UNSIZED} AND a.runtime_owner = ? "
                    f"AND a.status IN {ENDED} ORDER BY l.log_order, l.id LIMIT ?")
# The sized arm returns log_order in created_at_ms's place (equal for a sized log), so the index's
# order is the compound's: SQLite merges the arms and sorts only the unsized one.
_SIZED_COLUMNS = LOG_COLUMNS_A.replace("l.created_at_ms", "l.log_order")
# A compound SELECT orders by result column position: created_at_ms's, derived from the column list
# (LOG_COLUMNS': a column of LOG_COLUMNS_A may hold a comma of its own).
_CREATED_AT = [c.strip() for c in LOG_COLUMNS.split(",")].index("created_at_ms") + 1
#: Logs of ended attempts created before a cutoff, oldest first (parameters: owner, cutoff, limit).
ENDED_LOGS_OLDER = (f"SELECT {_SIZED_COLUMNS} {_FROM}l.log_order < ?2 AND a.runtime_owner = ?1 "
                    f"AND a.status IN {ENDED} "
                    f"UNION ALL SELECT {LOG_COLUMNS_A} {_FROM}{_QUEUE} AND l.created_at_ms < ?2 "
                    f"AND a.runtime_owner = ?1 AND a.status IN {ENDED} ORDER BY {_CREATED_AT}, 1 LIMIT ?3")
