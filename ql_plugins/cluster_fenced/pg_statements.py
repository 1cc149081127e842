"""Every SQL statement of the cluster-fenced run store on PostgreSQL, prebuilt.

Column lists are the edge store's (:mod:`ql_plugins.edge_sqlite.statements`), spelled in the field
order of :mod:`ql_core.records`, so a row converts with ``Record(*row)`` on both backends. The
differences are PostgreSQL's: ``%s`` placeholders, ``ON CONFLICT DO NOTHING``, booleans, row locks
(``FOR NO KEY UPDATE``) in the control plane's lock order (run → attempt), and the database clock
(``ql__clock_ms()``, revision 0003) wherever the store decides with a time.

A test prepares every statement here against the migrated schema.
"""

from __future__ import annotations

from ql_plugins.edge_sqlite.statements import (
    ACTIVE,
    ATTEMPT_COLUMNS,
    DISPATCH_COLUMNS,
    ENDED,
    EVENT_COLUMNS,
    LIVE,
    LOG_COLUMNS,
    RUN_COLUMNS,
)

_LOG_COLUMNS_L = ", ".join(f"l.{c.strip()}" for c in LOG_COLUMNS.split(","))

CLOCK = "SELECT ql__clock_ms()"

# -- create ------------------------------------------------------------------------------
# The run and its first attempt: queued/starting, or — a standby launcher's handle known before the
# run — running with it (ql_core.ports.journal.create_facts decides which).
INSERT_RUN = ("INSERT INTO ql_run (id, name, status, version, event_seq, current_attempt_id, created_at_ms, "
              "updated_at_ms, deadline_at_ms) VALUES (%s, %s, %s, 1, %s, %s, %s, %s, %s) "
              "ON CONFLICT (id) DO NOTHING")
RUN_CURRENT_ATTEMPT = "SELECT current_attempt_id FROM ql_run WHERE id = %s"
INSERT_ATTEMPT = ("INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, "
                  "log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, "
                  "started_at_ms, handle, host_handle, version) "
                  "VALUES (%s, %s, 1, %s, %s, %s, %s, %s, 0, %s, %s, %s, %s, %s, 1)")
INSERT_LOG = ("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, truncated, "
              "created_at_ms) VALUES (%s, %s, %s, %s, %s, false, %s)")
INSERT_EVENT = f"INSERT INTO ql_run_event ({EVENT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
INSERT_JOURNAL = ("INSERT INTO ql_receipt_journal (attempt_id, run_id, state, receipt_ref, registered_at_ms, "
                  "updated_at_ms) VALUES (%s, %s, 'pending', %s, %s, %s) ON CONFLICT (attempt_id) DO NOTHING")

# -- locked snapshots (lock order run → attempt, as the control plane's functions) ----------
ATTEMPT_RUN_ID = "SELECT run_id FROM ql_run_attempt WHERE id = %s"
LOCK_RUN = f"SELECT {RUN_COLUMNS}, ql__clock_ms() FROM ql_run WHERE id = %s FOR NO KEY UPDATE"
LOCK_ATTEMPT = f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE id = %s FOR NO KEY UPDATE"
SELECT_DISPATCH_SIGNAL = "SELECT attempt_id, term_sent_at_ms FROM ql_cancel_dispatch WHERE run_id = %s"

# -- reads -----------------------------------------------------------------------------
SELECT_RUN = f"SELECT {RUN_COLUMNS} FROM ql_run WHERE id = %s"
SELECT_ATTEMPT = f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE id = %s"
SELECT_ATTEMPTS_OF_RUN = f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE run_id = %s ORDER BY attempt_no"
SELECT_ATTEMPTS_OF_RUNS = (f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE run_id = ANY(%s) "
                           f"ORDER BY run_id, attempt_no")
SELECT_EVENTS = f"SELECT {EVENT_COLUMNS} FROM ql_run_event WHERE run_id = %s ORDER BY seq"
SELECT_RUNS_NEWEST = f"SELECT {RUN_COLUMNS} FROM ql_run ORDER BY created_at_ms DESC, id DESC LIMIT %s"
SELECT_RUNS_NEWEST_BY_STATUS = (f"SELECT {RUN_COLUMNS} FROM ql_run WHERE status = %s "
                                f"ORDER BY created_at_ms DESC, id DESC LIMIT %s")
SELECT_DISPATCH_OF_RUN = f"SELECT {DISPATCH_COLUMNS} FROM ql_cancel_dispatch WHERE run_id = %s"

# -- recovery paging ---------------------------------------------------------------------
PAGE_ACTIVE_ATTEMPTS = (f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE runtime_owner = %s "
                        f"AND status IN {ACTIVE} AND id > %s ORDER BY id LIMIT %s")
DUE_DEADLINES = ("SELECT r.id FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id "
                 f"WHERE a.status IN {LIVE} AND a.deadline_at_ms <= %s AND a.runtime_owner = %s "
                 "AND r.current_attempt_id = a.id AND r.cancel_reason IS NULL "
                 "ORDER BY a.deadline_at_ms, r.id LIMIT %s")
PAGE_JOURNAL = ("SELECT j.attempt_id, j.run_id, j.state, j.receipt_ref, j.quarantine_reason, j.registered_at_ms, "
                "j.updated_at_ms, j.terminal_seen_at_ms, a.status, a.runtime_owner FROM ql_receipt_journal j "
                "LEFT JOIN ql_run_attempt a ON a.id = j.attempt_id WHERE j.attempt_id > %s "
                "ORDER BY j.attempt_id LIMIT %s")
SELECT_JOURNAL = ("SELECT j.attempt_id, j.run_id, j.state, j.receipt_ref, j.quarantine_reason, j.registered_at_ms, "
                  "j.updated_at_ms, j.terminal_seen_at_ms, a.status, a.runtime_owner FROM ql_receipt_journal j "
                  "LEFT JOIN ql_run_attempt a ON a.id = j.attempt_id WHERE j.attempt_id = %s")

# -- the receipt journal -------------------------------------------------------------------
MARK_TERMINAL = ("UPDATE ql_receipt_journal SET terminal_seen_at_ms = %s "
                 "WHERE attempt_id = %s AND terminal_seen_at_ms IS NULL")
MARK_QUARANTINED = ("UPDATE ql_receipt_journal SET state = 'quarantined', quarantine_reason = %s, "
                    "updated_at_ms = %s WHERE attempt_id = %s AND state <> 'quarantined'")
JOURNAL_EXISTS = "SELECT 1 FROM ql_receipt_journal WHERE attempt_id = %s"
DELETE_JOURNAL = "DELETE FROM ql_receipt_journal WHERE attempt_id = %s"
DELETE_JOURNAL_PENDING = "DELETE FROM ql_receipt_journal WHERE attempt_id = ANY(%s) AND state = 'pending'"
REQUEUE_QUARANTINED = ("UPDATE ql_receipt_journal SET state = 'pending', updated_at_ms = %s "
                       "WHERE attempt_id = %s AND state = 'quarantined' AND updated_at_ms = %s")

# -- cancellation dispatch -----------------------------------------------------------------
DUE_DISPATCHES = ("SELECT d.run_id FROM ql_cancel_dispatch d JOIN ql_run_attempt a ON a.id = d.attempt_id "
                  "WHERE d.state IN ('pending', 'term_sent') AND d.next_attempt_at_ms <= ql__clock_ms() "
                  "AND a.runtime_owner = %s ORDER BY d.next_attempt_at_ms, d.run_id LIMIT %s")
INSERT_DISPATCH = ("INSERT INTO ql_cancel_dispatch (run_id, attempt_id, reason, state, version, tries, "
                   "next_attempt_at_ms, created_at_ms, updated_at_ms) "
                   "VALUES (%s, %s, %s, 'pending', 1, 0, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING")
LOCK_DISPATCH = f"SELECT {DISPATCH_COLUMNS}, ql__clock_ms() FROM ql_cancel_dispatch WHERE run_id = %s FOR UPDATE"
CLAIM_DISPATCH = ("UPDATE ql_cancel_dispatch SET lease_owner = %s, version = version + 1, lease_expires_at_ms = %s, "
                  "updated_at_ms = %s WHERE run_id = %s AND version = %s "
                  "AND (lease_expires_at_ms IS NULL OR lease_expires_at_ms < %s)")

# -- log artifacts -----------------------------------------------------------------------------
SELECT_LOG = f"SELECT {LOG_COLUMNS} FROM ql_log_artifact WHERE id = %s"
MARK_LOG_TRUNCATED = "UPDATE ql_log_artifact SET truncated = true WHERE id = %s AND NOT truncated RETURNING run_id"
SET_LOG_SIZE = "UPDATE ql_log_artifact SET size_bytes = %s WHERE id = %s"
MARK_LOG_DELETED = "UPDATE ql_log_artifact SET deleted_at_ms = %s, size_bytes = %s WHERE id = %s"
PAGE_LIVE_LOGS = (f"SELECT {_LOG_COLUMNS_L} FROM ql_log_artifact l "
                  "JOIN ql_run_attempt a ON a.log_artifact_id = l.id "
                  f"WHERE a.runtime_owner = %s AND a.status IN {LIVE} AND l.deleted_at_ms IS NULL AND l.id > %s "
                  "ORDER BY l.id LIMIT %s")
_ENDED_LOGS = (f"SELECT {_LOG_COLUMNS_L} FROM ql_log_artifact l JOIN ql_run_attempt a ON a.log_artifact_id = l.id "
               f"WHERE a.runtime_owner = %s AND a.status IN {ENDED} AND l.deleted_at_ms IS NULL ")
ENDED_LOGS_UNSIZED = _ENDED_LOGS + "AND l.size_bytes IS NULL ORDER BY l.created_at_ms, l.id LIMIT %s"
ENDED_LOGS_OLDER = _ENDED_LOGS + "AND l.created_at_ms < %s ORDER BY l.created_at_ms, l.id LIMIT %s"
ENDED_LOGS_SIZED = _ENDED_LOGS + "AND l.size_bytes IS NOT NULL ORDER BY l.created_at_ms, l.id LIMIT %s"
ENDED_LOG_BYTES = ("SELECT COALESCE(SUM(l.size_bytes), 0) FROM ql_log_artifact l "
                   "JOIN ql_run_attempt a ON a.log_artifact_id = l.id "
                   f"WHERE a.runtime_owner = %s AND l.deleted_at_ms IS NULL AND a.status IN {ENDED}")

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]
