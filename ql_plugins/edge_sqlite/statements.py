"""Every SQL statement of the edge-sqlite run store, prebuilt (sqlite3 caches them per connection).

Column lists are spelled in the field order of the records in
:mod:`ql_core.records`, so a row converts with ``Record(*row)``. The schema is
declared in :mod:`ql_core.db.models` and migrated by Alembic; a test checks
that every statement here prepares against the migrated schema.
"""

from __future__ import annotations


RUN_COLUMNS = ("id, name, status, exit_code, reason, version, event_seq, current_attempt_id, created_at_ms, "
               "updated_at_ms, finished_at_ms, deadline_at_ms, cancel_reason, cancel_requested_at_ms")
ATTEMPT_COLUMNS = ("id, run_id, attempt_no, executor, runtime_owner, status, exit_code, reason, log_artifact_id, "
                   "callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, started_at_ms, "
                   "finished_at_ms, handle, host_handle, version")
EVENT_COLUMNS = "run_id, seq, type, attempt_id, status, exit_code, reason, at_ms"
DISPATCH_COLUMNS = ("run_id, attempt_id, reason, state, outcome, lease_owner, lease_expires_at_ms, version, tries, "
                    "next_attempt_at_ms, term_sent_at_ms, kill_sent_at_ms, created_at_ms, updated_at_ms")
LOG_COLUMNS = "id, run_id, attempt_id, max_bytes, size_bytes, truncated, created_at_ms, deleted_at_ms"
_LOG_COLUMNS_L = ", ".join(f"l.{c.strip()}" for c in LOG_COLUMNS.split(","))
ACTIVE = "('starting', 'running')"
LIVE = "('starting', 'running', 'blocked')"
ENDED = "('succeeded', 'failed', 'cancelled', 'timed_out', 'lost')"

# -- create ------------------------------------------------------------------------------
# The run and its first attempt: queued/starting, or — a standby launcher's handle known before the
# run — running with it (ql_core.ports.journal.create_facts decides which).
INSERT_RUN = ("INSERT INTO ql_run (id, name, status, version, event_seq, current_attempt_id, created_at_ms, "
              "updated_at_ms, deadline_at_ms) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)")
INSERT_ATTEMPT = ("INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, "
                  "log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, "
                  "started_at_ms, handle, host_handle, version) "
                  "VALUES (?, ?, 1, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, 1)")
INSERT_LOG = ("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, truncated, "
              "created_at_ms) VALUES (?, ?, ?, ?, ?, 0, ?)")
INSERT_EVENT = f"INSERT INTO ql_run_event ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_JOURNAL = ("INSERT OR IGNORE INTO ql_receipt_journal (attempt_id, run_id, state, receipt_ref, "
                  "registered_at_ms, updated_at_ms) VALUES (?, ?, 'pending', ?, ?, ?)")

# -- reads -----------------------------------------------------------------------------
SELECT_RUN = f"SELECT {RUN_COLUMNS} FROM ql_run WHERE id = ?"
SELECT_ATTEMPT = f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE id = ?"
SELECT_ATTEMPTS_OF_RUN = f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE run_id = ? ORDER BY attempt_no"
SELECT_EVENTS = f"SELECT {EVENT_COLUMNS} FROM ql_run_event WHERE run_id = ? ORDER BY seq"
SELECT_RUNS_NEWEST = f"SELECT {RUN_COLUMNS} FROM ql_run INDEXED BY ix_ql_run_created ORDER BY created_at_ms DESC, id DESC LIMIT ?"
SELECT_RUNS_NEWEST_BY_STATUS = (f"SELECT {RUN_COLUMNS} FROM ql_run INDEXED BY ix_ql_run_status WHERE status = ? "
                                f"ORDER BY created_at_ms DESC, id DESC LIMIT ?")
SELECT_DISPATCH_OF_RUN = f"SELECT {DISPATCH_COLUMNS} FROM ql_cancel_dispatch WHERE run_id = ?"
SELECT_DISPATCH_SIGNAL = "SELECT attempt_id, term_sent_at_ms FROM ql_cancel_dispatch WHERE run_id = ?"

# -- recovery paging ---------------------------------------------------------------------
# The partial index ix_ql_attempt_live holds active rows only: a page reads `limit` entries.
PAGE_ACTIVE_ATTEMPTS = (f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt INDEXED BY ix_ql_attempt_live "
                        f"WHERE runtime_owner = ? AND status IN {ACTIVE} AND id > ? ORDER BY id LIMIT ?")
# Driven by the attempt's indexed copy of the deadline (status, deadline_at_ms), joined on the run's key.
DUE_DEADLINES = ("SELECT r.id FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id "
                 f"WHERE a.status IN {LIVE} AND a.deadline_at_ms <= ? AND a.runtime_owner = ? "
                 "AND r.current_attempt_id = a.id AND r.cancel_reason IS NULL "
                 "ORDER BY a.deadline_at_ms, r.id LIMIT ?")
# Two index-driven reads per page: the journal by its key, then those attempts by theirs (a join
# would let the planner walk every attempt this node ever ran for each page).
PAGE_JOURNAL = ("SELECT attempt_id, run_id, state, receipt_ref, quarantine_reason, registered_at_ms, updated_at_ms, "
                "terminal_seen_at_ms FROM ql_receipt_journal WHERE attempt_id > ? ORDER BY attempt_id LIMIT ?")
SELECT_JOURNAL = ("SELECT attempt_id, run_id, state, receipt_ref, quarantine_reason, registered_at_ms, "
                  "updated_at_ms, terminal_seen_at_ms FROM ql_receipt_journal WHERE attempt_id = ?")
ATTEMPT_STATUS_OWNER = "SELECT status, runtime_owner FROM ql_run_attempt WHERE id = ?"

# -- the receipt journal -------------------------------------------------------------------
MARK_TERMINAL = ("UPDATE ql_receipt_journal SET terminal_seen_at_ms = ? "
                 "WHERE attempt_id = ? AND terminal_seen_at_ms IS NULL")
MARK_QUARANTINED = ("UPDATE ql_receipt_journal SET state = 'quarantined', quarantine_reason = ?, updated_at_ms = ? "
                    "WHERE attempt_id = ? AND state != 'quarantined'")
JOURNAL_EXISTS = "SELECT 1 FROM ql_receipt_journal WHERE attempt_id = ?"
DELETE_JOURNAL = "DELETE FROM ql_receipt_journal WHERE attempt_id = ?"
DELETE_JOURNAL_PENDING = "DELETE FROM ql_receipt_journal WHERE attempt_id = ? AND state = 'pending'"
REQUEUE_QUARANTINED = ("UPDATE ql_receipt_journal SET state = 'pending', updated_at_ms = ? "
                       "WHERE attempt_id = ? AND state = 'quarantined' AND updated_at_ms = ?")

# -- cancellation dispatch -----------------------------------------------------------------
DUE_DISPATCHES = ("SELECT d.run_id FROM ql_cancel_dispatch d JOIN ql_run_attempt a ON a.id = d.attempt_id "
                  "WHERE d.state IN ('pending', 'term_sent') AND d.next_attempt_at_ms <= ? AND a.runtime_owner = ? "
                  "ORDER BY d.next_attempt_at_ms, d.run_id LIMIT ?")
INSERT_DISPATCH = ("INSERT OR IGNORE INTO ql_cancel_dispatch (run_id, attempt_id, reason, state, version, tries, "
                   "next_attempt_at_ms, created_at_ms, updated_at_ms) VALUES (?, ?, ?, 'pending', 1, 0, ?, ?, ?)")
CLAIM_DISPATCH = ("UPDATE ql_cancel_dispatch SET lease_owner = ?, version = version + 1, lease_expires_at_ms = ?, "
                  "updated_at_ms = ? WHERE run_id = ? AND version = ? "
                  "AND (lease_expires_at_ms IS NULL OR lease_expires_at_ms < ?)")

# -- log artifacts -----------------------------------------------------------------------------
SELECT_LOG = f"SELECT {LOG_COLUMNS} FROM ql_log_artifact WHERE id = ?"
MARK_LOG_TRUNCATED = "UPDATE ql_log_artifact SET truncated = 1 WHERE id = ? AND truncated = 0"
SET_LOG_SIZE = "UPDATE ql_log_artifact SET size_bytes = ? WHERE id = ?"
MARK_LOG_DELETED = "UPDATE ql_log_artifact SET deleted_at_ms = ?, size_bytes = ? WHERE id = ?"
# Every log statement of a round is driven by a partial index of ql_log_artifact and joins the
# attempt by its key (CROSS JOIN fixes that order): ix_ql_log_unsized holds the running logs and the
# ended ones not sized yet (sizing happens when a run ends), ix_ql_log_kept the undeleted ones by age.
PAGE_LIVE_LOGS = (f"SELECT {_LOG_COLUMNS_L} FROM ql_log_artifact l INDEXED BY ix_ql_log_unsized "
                  "CROSS JOIN ql_run_attempt a ON a.id = l.attempt_id "
                  f"WHERE l.size_bytes IS NULL AND l.deleted_at_ms IS NULL AND l.id > ? "
                  f"AND a.runtime_owner = ? AND a.status IN {LIVE} ORDER BY l.id LIMIT ?")
ENDED_LOGS_UNSIZED = (f"SELECT {_LOG_COLUMNS_L} FROM ql_log_artifact l INDEXED BY ix_ql_log_unsized "
                      "CROSS JOIN ql_run_attempt a ON a.id = l.attempt_id "
                      "WHERE l.size_bytes IS NULL AND l.deleted_at_ms IS NULL "
                      f"AND a.runtime_owner = ? AND a.status IN {ENDED} ORDER BY l.id LIMIT ?")
_KEPT_LOGS = (f"SELECT {_LOG_COLUMNS_L} FROM ql_log_artifact l INDEXED BY ix_ql_log_kept "
              "CROSS JOIN ql_run_attempt a ON a.id = l.attempt_id "
              f"WHERE l.deleted_at_ms IS NULL AND a.runtime_owner = ? AND a.status IN {ENDED} ")
ENDED_LOGS_OLDER = _KEPT_LOGS + "AND l.created_at_ms < ? ORDER BY l.created_at_ms, l.id LIMIT ?"
ENDED_LOGS_SIZED = _KEPT_LOGS + "AND l.size_bytes IS NOT NULL ORDER BY l.created_at_ms, l.id LIMIT ?"
# Kept exact by the triggers of migration 0007 (never a SUM over history).
ENDED_LOG_BYTES = "SELECT COALESCE((SELECT value FROM ql_tally WHERE name = 'log_bytes:' || ?), 0)"

# -- history retention ------------------------------------------------------------------------
# How many runs exist (ql_tally, kept by triggers): the excess over history_max_runs is known
# without counting; the oldest runs are then read in index order, as many as are in excess.
RUN_COUNT = "SELECT COALESCE((SELECT value FROM ql_tally WHERE name = 'runs'), 0)"
OLDEST_RUNS = "SELECT id, status FROM ql_run INDEXED BY ix_ql_run_created ORDER BY created_at_ms, id LIMIT ?"
OLD_FINISHED_RUNS = (f"SELECT id FROM ql_run INDEXED BY ix_ql_run_ended WHERE status IN {ENDED} "
                     "AND finished_at_ms < ? ORDER BY finished_at_ms, id LIMIT ?")
RUN_ATTEMPTS_OWNERS = "SELECT id, runtime_owner FROM ql_run_attempt WHERE run_id = ?"
LIVE_LOGS_OF_RUN = "SELECT id FROM ql_log_artifact INDEXED BY ix_ql_log_run WHERE run_id = ? AND deleted_at_ms IS NULL"
_ENDED_RUN = f"(SELECT id FROM ql_run WHERE id = ? AND status IN {ENDED})"
PURGE_EVENTS = f"DELETE FROM ql_run_event WHERE run_id IN {_ENDED_RUN}"
PURGE_DISPATCH = f"DELETE FROM ql_cancel_dispatch WHERE run_id IN {_ENDED_RUN}"
PURGE_LOGS = f"DELETE FROM ql_log_artifact INDEXED BY ix_ql_log_run WHERE run_id IN {_ENDED_RUN}"
PURGE_ATTEMPTS = f"DELETE FROM ql_run_attempt WHERE run_id IN {_ENDED_RUN}"
PURGE_RUN = f"DELETE FROM ql_run WHERE id = ? AND status IN {ENDED}"

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]
