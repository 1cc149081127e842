"""The SQL both run stores spell alike: column lists of ql's schema and the statements no dialect changes.

Column lists are spelled in the field order of :mod:`ql_core.records`, so a row converts with
``Record(*row)`` on every backend. The statements here are written with ``?`` placeholders and
handed to a dialect by :func:`shared_statements` in its own placeholder style (with or without
SQLite's index hints); what a dialect writes
differently (conflict clauses, booleans, index hints, row locks, its clock) stays in its own
statements module (``ql_plugins.edge_sqlite.statements``, ``ql_plugins.cluster_fenced.pg_statements``),
which takes these first and may replace any of them by name.

The schema is declared in :mod:`ql_core.db.models` and migrated by Alembic; each dialect's tests
prepare every statement of its module (these included) against the migrated schema.
"""

from __future__ import annotations

import re

__all__ = ["RUN_COLUMNS", "ATTEMPT_COLUMNS", "EVENT_COLUMNS", "DISPATCH_COLUMNS", "LOG_COLUMNS", "LOG_COLUMNS_L",
           "ACTIVE", "LIVE", "ENDED", "qualified", "shared_statements"]

RUN_COLUMNS = ("id, name, status, exit_code, reason, version, event_seq, current_attempt_id, created_at_ms, "
               "updated_at_ms, finished_at_ms, deadline_at_ms, cancel_reason, cancel_requested_at_ms")
ATTEMPT_COLUMNS = ("id, run_id, attempt_no, executor, runtime_owner, status, exit_code, reason, log_artifact_id, "
                   "callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, started_at_ms, "
                   "finished_at_ms, handle, host_handle, version")
EVENT_COLUMNS = "run_id, seq, type, attempt_id, status, exit_code, reason, at_ms"
DISPATCH_COLUMNS = ("run_id, attempt_id, reason, state, outcome, lease_owner, lease_expires_at_ms, version, tries, "
                    "next_attempt_at_ms, term_sent_at_ms, kill_sent_at_ms, created_at_ms, updated_at_ms")
LOG_COLUMNS = "id, run_id, attempt_id, max_bytes, size_bytes, truncated, created_at_ms, deleted_at_ms"


def qualified(columns: str, alias: str) -> str:
    """A column list (as :data:`RUN_COLUMNS`) with each name qualified by a table alias: what a
    join selects (``qualified(LOG_COLUMNS, "l")``: ``l.id, l.run_id, ...``)."""
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


#: :data:`LOG_COLUMNS` of the log table aliased ``l`` (the log pages join the attempt).
LOG_COLUMNS_L = qualified(LOG_COLUMNS, "l")
ACTIVE = "('starting', 'running')"
LIVE = "('starting', 'running', 'blocked')"
ENDED = "('succeeded', 'failed', 'cancelled', 'timed_out', 'lost')"

_INDEX_HINT = re.compile(r" INDEXED BY \w+")

_SHARED: dict[str, str] = {
    # -- create ---------------------------------------------------------------------------
    "INSERT_ATTEMPT": ("INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, "
                       "log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, "
                       "started_at_ms, handle, host_handle, version) "
                       "VALUES (?, ?, 1, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, 1)"),
    "INSERT_EVENT": f"INSERT INTO ql_run_event ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    # What a create found in place of its run, when its INSERT was skipped (a replayed create).
    "RUN_CURRENT_ATTEMPT": "SELECT current_attempt_id FROM ql_run WHERE id = ?",
    # -- reads --------------------------------------------------------------------------------
    "SELECT_RUN": f"SELECT {RUN_COLUMNS} FROM ql_run WHERE id = ?",
    "SELECT_ATTEMPT": f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE id = ?",
    "SELECT_ATTEMPTS_OF_RUN": f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE run_id = ? ORDER BY attempt_no",
    "SELECT_EVENTS": f"SELECT {EVENT_COLUMNS} FROM ql_run_event WHERE run_id = ? ORDER BY seq",
    # A run id prefix (`ql status 0190ab`): a range of the primary key, at most `limit` ids read.
    "SELECT_RUN_IDS_IN_RANGE": "SELECT id FROM ql_run WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
    "SELECT_RUNS_NEWEST": (f"SELECT {RUN_COLUMNS} FROM ql_run INDEXED BY ix_ql_run_created "
                           "ORDER BY created_at_ms DESC, id DESC LIMIT ?"),
    "SELECT_RUNS_NEWEST_BY_STATUS": (f"SELECT {RUN_COLUMNS} FROM ql_run INDEXED BY ix_ql_run_status WHERE status = ? "
                                     "ORDER BY created_at_ms DESC, id DESC LIMIT ?"),
    "SELECT_DISPATCH_OF_RUN": f"SELECT {DISPATCH_COLUMNS} FROM ql_cancel_dispatch WHERE run_id = ?",
    "SELECT_DISPATCH_SIGNAL": "SELECT attempt_id, term_sent_at_ms FROM ql_cancel_dispatch WHERE run_id = ?",
    # -- recovery paging ------------------------------------------------------------------------
    # The partial index ix_ql_attempt_live holds active rows only: a page reads `limit` entries.
    "PAGE_ACTIVE_ATTEMPTS": (f"SELECT {ATTEMPT_COLUMNS} FROM ql_run_attempt INDEXED BY ix_ql_attempt_live "
                             f"WHERE runtime_owner = ? AND status IN {ACTIVE} AND id > ? ORDER BY id LIMIT ?"),
    # Driven by the attempt's indexed copy of the deadline (status, deadline_at_ms), joined on the run's key.
    "DUE_DEADLINES": ("SELECT r.id FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id "
                      f"WHERE a.status IN {LIVE} AND a.deadline_at_ms <= ? AND a.runtime_owner = ? "
                      "AND r.current_attempt_id = a.id AND r.cancel_reason IS NULL "
                      "ORDER BY a.deadline_at_ms, r.id LIMIT ?"),
    # Two index-driven reads per page: the journal by its key, then those attempts by theirs (a join
    # lets SQLite's planner walk every attempt this node ever ran for each page).
    "PAGE_JOURNAL": ("SELECT attempt_id, run_id, state, receipt_ref, quarantine_reason, registered_at_ms, "
                     "updated_at_ms, terminal_seen_at_ms FROM ql_receipt_journal WHERE attempt_id > ? "
                     "ORDER BY attempt_id LIMIT ?"),
    "SELECT_JOURNAL": ("SELECT attempt_id, run_id, state, receipt_ref, quarantine_reason, registered_at_ms, "
                       "updated_at_ms, terminal_seen_at_ms FROM ql_receipt_journal WHERE attempt_id = ?"),
    "ATTEMPT_STATUS_OWNER": "SELECT status, runtime_owner FROM ql_run_attempt WHERE id = ?",
    # -- the receipt journal -----------------------------------------------------------------------
    "MARK_TERMINAL": ("UPDATE ql_receipt_journal SET terminal_seen_at_ms = ? "
                      "WHERE attempt_id = ? AND terminal_seen_at_ms IS NULL"),
    "MARK_QUARANTINED": ("UPDATE ql_receipt_journal SET state = 'quarantined', quarantine_reason = ?, "
                         "updated_at_ms = ? WHERE attempt_id = ? AND state <> 'quarantined'"),
    "JOURNAL_EXISTS": "SELECT 1 FROM ql_receipt_journal WHERE attempt_id = ?",
    "DELETE_JOURNAL": "DELETE FROM ql_receipt_journal WHERE attempt_id = ?",
    "DELETE_JOURNAL_PENDING": "DELETE FROM ql_receipt_journal WHERE attempt_id = ? AND state = 'pending'",
    "REQUEUE_QUARANTINED": ("UPDATE ql_receipt_journal SET state = 'pending', updated_at_ms = ? "
                            "WHERE attempt_id = ? AND state = 'quarantined' AND updated_at_ms = ?"),
    # -- cancellation dispatch -------------------------------------------------------------------
    "CLAIM_DISPATCH": ("UPDATE ql_cancel_dispatch SET lease_owner = ?, version = version + 1, "
                       "lease_expires_at_ms = ?, updated_at_ms = ? WHERE run_id = ? AND version = ? "
                       "AND (lease_expires_at_ms IS NULL OR lease_expires_at_ms < ?)"),
    # -- log artifacts ---------------------------------------------------------------------------
    "SELECT_LOG": f"SELECT {LOG_COLUMNS} FROM ql_log_artifact WHERE id = ?",
    "SET_LOG_SIZE": "UPDATE ql_log_artifact SET size_bytes = ? WHERE id = ?",
    "MARK_LOG_DELETED": "UPDATE ql_log_artifact SET deleted_at_ms = ?, size_bytes = ? WHERE id = ?",
}


def shared_statements(placeholder: str, *, index_hints: bool = True) -> dict[str, str]:
    """Every shared statement by name, with ``placeholder`` (``"?"`` or ``"%s"``) for each parameter.

    ``index_hints``: keep SQLite's ``INDEXED BY`` clauses (they pin each paging statement to the
    index that keeps it O(page)); a dialect without them (PostgreSQL) gets the same statements
    without, and its planner picks the index.
    """
    out = dict(_SHARED)
    if not index_hints:
        out = {name: _INDEX_HINT.sub("", text) for name, text in out.items()}
    if placeholder != "?":
        out = {name: text.replace("?", placeholder) for name, text in out.items()}
    return out
