"""Every SQL statement of the cluster-fenced run store on PostgreSQL, prebuilt.

The statements PostgreSQL spells like every SQL store come from :mod:`ql_core.db.journal_sql`, in
``%s`` placeholder style (column lists in the field order of :mod:`ql_core.records`, so a row
converts with ``Record(*row)`` on both backends). This module adds PostgreSQL's own: ``ON CONFLICT
DO NOTHING``, booleans, row locks (``FOR NO KEY UPDATE``) in the control plane's lock order
(run → attempt), array parameters, the journal rows joined to their attempts, and the database
clock (``ql__clock_ms()``, revision 0003) wherever the store decides with a time.

A test prepares every statement here against the migrated schema.
"""

from __future__ import annotations

from ql_core.db.journal_sql import (
    ATTEMPT_COLUMNS,
    DISPATCH_COLUMNS,
    ENDED,
    LIVE,
    LOG_COLUMNS_L,
    RUN_COLUMNS,
    shared_statements,
)

# The shared statements first (SELECT_RUN, INSERT_ATTEMPT, MARK_TERMINAL, ...); PostgreSQL's own
# follow, and replace the shared ones they name (the journal reads, the pending-row delete).
globals().update(shared_statements("%s", index_hints=False))

CLOCK = "SELECT ql__clock_ms()"

# -- create ------------------------------------------------------------------------------
# The run and its first attempt: queued/starting, or — a standby launcher's handle known before the
# run — running with it (ql_core.ports.journal.create_facts decides which).
INSERT_RUN = ("INSERT INTO ql_run (id, name, status, version, event_seq, current_attempt_id, created_at_ms, "
              "updated_at_ms, deadline_at_ms) VALUES (%s, %s, %s, 1, %s, %s, %s, %s, %s) "
              "ON CONFLICT (id) DO NOTHING")
INSERT_LOG = ("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, truncated, "
              "created_at_ms) VALUES (%s, %s, %s, %s, %s, false, %s)")
INSERT_JOURNAL = ("INSERT INTO ql_receipt_journal (attempt_id, run_id, state, receipt_ref, registered_at_ms, "
                  "updated_at_ms) VALUES (%s, %s, 'pending', %s, %s, %s) ON CONFLICT (attempt_id) DO NOTHING")

# -- locked snapshots (lock order run → attempt, as the control plane's functions) ----------
ATTEMPT_RUN_ID = "SELECT run_id FROM ql_run_attempt WHERE id = %s"
LOCK_RUN = f"SELECT {RUN_COLUMNS}, ql__clock_ms() FROM ql_run WHERE id = %s FOR NO KEY UPDATE"
LOCK_ATTEMPT = f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE id = %s FOR NO KEY UPDATE"

# -- reads -----------------------------------------------------------------------------
SELECT_ATTEMPTS_OF_RUNS = (f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE run_id = ANY(%s) "
                           f"ORDER BY run_id, attempt_no")
# The journal rows with their attempts in one statement (PostgreSQL's planner joins by key).
PAGE_JOURNAL = ("SELECT j.attempt_id, j.run_id, j.state, j.receipt_ref, j.quarantine_reason, j.registered_at_ms, "
                "j.updated_at_ms, j.terminal_seen_at_ms, a.status, a.runtime_owner FROM ql_receipt_journal j "
                "LEFT JOIN ql_run_attempt a ON a.id = j.attempt_id WHERE j.attempt_id > %s "
                "ORDER BY j.attempt_id LIMIT %s")
SELECT_JOURNAL = ("SELECT j.attempt_id, j.run_id, j.state, j.receipt_ref, j.quarantine_reason, j.registered_at_ms, "
                  "j.updated_at_ms, j.terminal_seen_at_ms, a.status, a.runtime_owner FROM ql_receipt_journal j "
                  "LEFT JOIN ql_run_attempt a ON a.id = j.attempt_id WHERE j.attempt_id = %s")

# -- the receipt journal -------------------------------------------------------------------
DELETE_JOURNAL_PENDING = "DELETE FROM ql_receipt_journal WHERE attempt_id = ANY(%s) AND state = 'pending'"

# -- cancellation dispatch -----------------------------------------------------------------
DUE_DISPATCHES = ("SELECT d.run_id FROM ql_cancel_dispatch d JOIN ql_run_attempt a ON a.id = d.attempt_id "
                  "WHERE d.state IN ('pending', 'term_sent') AND d.next_attempt_at_ms <= ql__clock_ms() "
                  "AND a.runtime_owner = %s ORDER BY d.next_attempt_at_ms, d.run_id LIMIT %s")
INSERT_DISPATCH = ("INSERT INTO ql_cancel_dispatch (run_id, attempt_id, reason, state, version, tries, "
                   "next_attempt_at_ms, created_at_ms, updated_at_ms) "
                   "VALUES (%s, %s, %s, 'pending', 1, 0, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING")
LOCK_DISPATCH = f"SELECT {DISPATCH_COLUMNS}, ql__clock_ms() FROM ql_cancel_dispatch WHERE run_id = %s FOR UPDATE"

# -- log artifacts -----------------------------------------------------------------------------
MARK_LOG_TRUNCATED = "UPDATE ql_log_artifact SET truncated = true WHERE id = %s AND NOT truncated RETURNING run_id"
PAGE_LIVE_LOGS = (f"SELECT {LOG_COLUMNS_L} FROM ql_log_artifact l "
                  "JOIN ql_run_attempt a ON a.log_artifact_id = l.id "
                  f"WHERE l.deleted_at_ms IS NULL AND l.id > %s AND a.runtime_owner = %s AND a.status IN {LIVE} "
                  "ORDER BY l.id LIMIT %s")
_ENDED_LOGS = (f"SELECT {LOG_COLUMNS_L} FROM ql_log_artifact l JOIN ql_run_attempt a ON a.log_artifact_id = l.id "
               f"WHERE a.runtime_owner = %s AND a.status IN {ENDED} AND l.deleted_at_ms IS NULL ")
ENDED_LOGS_UNSIZED = _ENDED_LOGS + "AND l.size_bytes IS NULL ORDER BY l.created_at_ms, l.id LIMIT %s"
ENDED_LOGS_OLDER = _ENDED_LOGS + "AND l.created_at_ms < %s ORDER BY l.created_at_ms, l.id LIMIT %s"
ENDED_LOGS_SIZED = _ENDED_LOGS + "AND l.size_bytes IS NOT NULL ORDER BY l.created_at_ms, l.id LIMIT %s"
ENDED_LOG_BYTES = ("SELECT COALESCE(SUM(l.size_bytes), 0) FROM ql_log_artifact l "
                   "JOIN ql_run_attempt a ON a.log_artifact_id = l.id "
                   f"WHERE a.runtime_owner = %s AND l.deleted_at_ms IS NULL AND a.status IN {ENDED}")

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]
