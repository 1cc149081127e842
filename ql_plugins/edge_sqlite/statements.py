"""Every SQL statement of the edge-sqlite run store, prebuilt (sqlite3 caches them per connection).

The statements SQLite spells like every SQL store come from :mod:`ql_core.db.journal_sql` (column
lists in the field order of :mod:`ql_core.records`, so a row converts with ``Record(*row)``); this
module adds SQLite's own — ``INSERT OR IGNORE``, integer booleans, ``INDEXED BY`` hints that keep
every statement of a round on an index, the clock as a parameter — and the history statements only
this store runs. The schema is declared in :mod:`ql_core.db.models` and migrated by Alembic; a test
checks that every statement here prepares against the migrated schema and is served by an index.
"""

from __future__ import annotations

from ql_core.db.journal_sql import (
    ENDED,
    shared_statements,
)

# The shared statements first (SELECT_RUN, INSERT_ATTEMPT, MARK_TERMINAL, ...); SQLite's own follow.
globals().update(shared_statements("?"))

# -- events: under their run's integer key, one rowid range per run (revision 0011) ----------------
from ql_core.db.sqlite_events import INSERT_EVENT, PURGE_EVENTS, SELECT_EVENTS  # noqa: E402,F401

# -- runs in order: the per-state ranges of ix_ql_run_order, merged (revisions 0012, 0013) ----------
from ql_core.db.sqlite_runs import (  # noqa: E402,F401
    OLDEST_ENDED_RUNS,
    OLDEST_RUNS,
    SELECT_RUNS_NEWEST,
    SELECT_RUNS_NEWEST_BY_STATUS,
)

# -- a run's attempts: one range of their key, through the run's row (revision 0012); an attempt's
# host handle in ql_attempt_host (revision 0014) -------------------------------------------------------
from ql_core.db.sqlite_runs import (  # noqa: E402,F401
    ATTEMPTS_OF,
    INSERT_ATTEMPT,
    INSERT_ATTEMPT_HOST,
    PAGE_ACTIVE_ATTEMPTS,
    SELECT_ATTEMPT,
    SELECT_ATTEMPTS_OF_RUN,
    SELECT_TRANSITION_ROWS,
)

# -- create ------------------------------------------------------------------------------
# The run and its first attempt: queued/starting, or — a standby launcher's handle known before the
# run — running with it (ql_core.ports.journal.create_facts decides which).
INSERT_RUN = ("INSERT INTO ql_run (id, name, status, version, event_seq, current_attempt_id, created_at_ms, "
              "updated_at_ms, deadline_at_ms) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)")
# INSERT_RUN with the create's host handle (a ninth parameter) in the run's row (revision 0019): the
# kernel's create writes it with the row instead of INSERT_ATTEMPT_HOST's second statement.
INSERT_RUN_HOST = ("INSERT INTO ql_run (id, name, status, version, event_seq, current_attempt_id, created_at_ms, "
                   "updated_at_ms, deadline_at_ms, host_handle) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?)")
# -- the receipt journal: one WITHOUT ROWID B-tree whose rows fit their cell (revision 0016) ----------
# A row leaves run_id and receipt_ref empty when they are derived: the run is its attempt's (the
# create writes the attempt first; a purge deletes it only after the journal row), the reference is
# <xx>/<attempt_id>.json (ql_core.receipts.file_store.relative_ref). A row registered for a receipt
# whose attempt is not there, or with another reference, keeps them. Parameters: attempt id, run id,
# reference, registered, updated.
_REF_OF = "substr({a}, -2) || '/' || {a} || '.json'"
INSERT_JOURNAL = ("INSERT OR IGNORE INTO ql_receipt_journal (attempt_id, run_id, state, receipt_ref, "
                  "registered_at_ms, updated_at_ms) VALUES (?1, CASE WHEN EXISTS (SELECT 1 FROM ql_run_attempt "
                  f"WHERE id = ?1 AND run_id = ?2) THEN '' ELSE ?2 END, 'pending', CASE ?3 WHEN {_REF_OF.format(a='?1')} "
                  "THEN '' ELSE ?3 END, ?4, ?5)")
# The retention clock of a row whose terminal_seen_at_ms is not written: its attempt ended, the
# time of the terminal commit, read from that commit's own ``attempt.<status>`` event (its at_ms is the
# clock the terminal commit wrote into the row before; the event is one of its run's few, one range of
# the event key, read from the newest; core names the attempt in it, one that names none counts for
# the attempt read). The terminal commit then writes no journal row
# (SqliteJournal.derives_terminal_seen): one page fewer per task. A live or unknown attempt, or an
# ended one without that event: NULL, as before (the reconciler's retention then starts the clock when
# it sees the receipt missing). Written clocks (the reconciler's, rows of earlier versions) come first.
from ql_core.db.sqlite_events import EVENT_KEY_BITS as _EVENT_BITS  # noqa: E402
from ql_core.db.sqlite_runs import ATTEMPT_KEY_BITS as _ATTEMPT_BITS  # noqa: E402

_RUN_OF_A = f"(a.attempt_key >> {_ATTEMPT_BITS})"
_TERMINAL_SEEN = (f"COALESCE(j.terminal_seen_at_ms, (SELECT e.at_ms FROM ql_run_attempt a CROSS JOIN ql_run_event e "
                  f"ON e.event_key BETWEEN {_RUN_OF_A} << {_EVENT_BITS} AND ({_RUN_OF_A} << {_EVENT_BITS}) + "
                  f"{(1 << _EVENT_BITS) - 1} WHERE a.id = j.attempt_id AND a.status IN {ENDED} "
                  "AND COALESCE(e.attempt_id, a.id) = a.id AND e.type = 'attempt.' || a.status "
                  "ORDER BY e.event_key DESC LIMIT 1))")
# The journal's columns (JournalEntry's first eight) with the derived ones filled in.
_JOURNAL_COLUMNS = ("j.attempt_id, COALESCE(NULLIF(j.run_id, ''), (SELECT a.run_id FROM ql_run_attempt a "
                    f"WHERE a.id = j.attempt_id), ''), j.state, COALESCE(NULLIF(j.receipt_ref, ''), "
                    f"{_REF_OF.format(a='j.attempt_id')}), j.quarantine_reason, j.registered_at_ms, "
                    f"j.updated_at_ms, {_TERMINAL_SEEN}")
PAGE_JOURNAL = (f"SELECT {_JOURNAL_COLUMNS} FROM ql_receipt_journal j WHERE j.attempt_id > ? "
                "ORDER BY j.attempt_id LIMIT ?")
SELECT_JOURNAL = f"SELECT {_JOURNAL_COLUMNS} FROM ql_receipt_journal j WHERE j.attempt_id = ?"

# -- cancellation dispatch -----------------------------------------------------------------
# Due by the host's clock (the first parameter): one node owns this database.
DUE_DISPATCHES = ("SELECT d.run_id FROM ql_cancel_dispatch d JOIN ql_run_attempt a ON a.id = d.attempt_id "
                  "WHERE d.state IN ('pending', 'term_sent') AND d.next_attempt_at_ms <= ? AND a.runtime_owner = ? "
                  "ORDER BY d.next_attempt_at_ms, d.run_id LIMIT ?")
INSERT_DISPATCH = ("INSERT OR IGNORE INTO ql_cancel_dispatch (run_id, attempt_id, reason, state, version, tries, "
                   "next_attempt_at_ms, created_at_ms, updated_at_ms) VALUES (?, ?, ?, 'pending', 1, 0, ?, ?, ?)")

# -- log artifacts -----------------------------------------------------------------------------
MARK_LOG_TRUNCATED = "UPDATE ql_log_artifact SET truncated = 1 WHERE id = ? AND truncated = 0"
# Every ended-log statement of a round is one range of ix_ql_log_order (revisions 0015, 0020): the
# sized logs that are not empty by age, then the sizing queue by id; the live logs are read through
# the live runs; a terminal commit that records no size puts its log in the queue (SIZE_DUE).
from ql_core.db.sqlite_logs import (  # noqa: E402,F401
    ENDED_LOGS_OLDER,
    ENDED_LOGS_SIZED,
    ENDED_LOGS_UNSIZED,
    PAGE_LIVE_LOGS,
    SIZE_DUE,
)
# A log row without its attempt id and path (revision 0016: the row fits its page's cell); a log by
# id reads its attempt's id through the run.
from ql_core.db.sqlite_logs import INSERT_LOG, SELECT_LOG  # noqa: E402,F401
# Kept exact by the triggers of migration 0007 (never a SUM over history).
ENDED_LOG_BYTES = "SELECT COALESCE((SELECT value FROM ql_tally WHERE name = 'log_bytes:' || ?), 0)"

# -- history retention ------------------------------------------------------------------------
# How many runs exist: ql_tally's `runs` counts those up to its `counted_to` key (revision 0016; a
# trigger takes deleted ones off), the newer ones are one range of the rowid — both index reads, so
# the excess over history_max_runs is known without counting history; the oldest runs are then read
# in index order (OLDEST_RUNS, above), as many as are in excess. By age: OLDEST_ENDED_RUNS, one ended
# state at a time. Rows: (counted, newer).
RUN_COUNT = ("SELECT t.value, (SELECT count(*) FROM ql_run r WHERE r.run_key > t.counted_to) FROM ql_tally t "
             "WHERE t.name = 'runs'")
# The newer runs folded into the row (history retention, once per round that finds some): the row
# counts every run again, up to the newest key. In one write transaction: exact whatever ran between.
FOLD_RUN_COUNT = ("UPDATE ql_tally SET value = value + (SELECT count(*) FROM ql_run r WHERE r.run_key > "
                  "ql_tally.counted_to), counted_to = (SELECT max(run_key) FROM ql_run) WHERE name = 'runs' "
                  "AND counted_to < (SELECT max(run_key) FROM ql_run)")
RUN_ATTEMPTS_OWNERS = ("SELECT a.id, a.runtime_owner FROM ql_run r CROSS JOIN ql_run_attempt a "
                       f"ON {ATTEMPTS_OF} WHERE r.id = ?")
# A run's logs are its attempts' logs (the attempts' key range, then the log's key): no index of the
# log table by run is written per task (migration 0010), nor of attempts by run (0012).
LIVE_LOGS_OF_RUN = (f"SELECT l.id FROM ql_run r CROSS JOIN ql_run_attempt a ON {ATTEMPTS_OF} "
                    "CROSS JOIN ql_log_artifact l ON l.id = a.log_artifact_id WHERE r.id = ? AND l.deleted_at_ms IS NULL")
_ENDED_RUN = f"(SELECT id FROM ql_run WHERE id = ? AND status IN {ENDED})"
PURGE_DISPATCH = f"DELETE FROM ql_cancel_dispatch WHERE run_id IN {_ENDED_RUN}"
PURGE_LOGS = (f"DELETE FROM ql_log_artifact WHERE id IN (SELECT a.log_artifact_id FROM ql_run r CROSS JOIN "
              f"ql_run_attempt a ON {ATTEMPTS_OF} WHERE r.id = ? AND r.status IN {ENDED})")
PURGE_ATTEMPTS = (f"DELETE FROM ql_run_attempt WHERE attempt_key IN (SELECT a.attempt_key FROM ql_run r CROSS JOIN "
                  f"ql_run_attempt a ON {ATTEMPTS_OF} WHERE r.id = ? AND r.status IN {ENDED})")
PURGE_RUN = f"DELETE FROM ql_run WHERE id = ? AND status IN {ENDED}"

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]
