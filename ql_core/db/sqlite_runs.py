"""SQLite's ordered reads of runs: every run from ``ix_ql_run_order`` alone (revisions 0012_sqlite_lean_runs, 0013_sqlite_run_order).

On SQLite a run is in one ordered index, ``ix_ql_run_order (status_order, created_at_ms)``
(0012's ``ix_ql_run_status``, its states numbered by 0013, its id dropped by 0016): each state is a
range of it in creation order — ``created_at_ms``, then the rowid ``run_key`` that ends every index
entry (runs created in the same millisecond, in the order they were created). The newest (or
oldest) n runs of any state are the merge of the seven ranges (:data:`ql_core.states.RUN_ACTIVE`
and :data:`~ql_core.states.RUN_TERMINAL`), written as a compound SELECT whose ORDER BY is the
index's: SQLite runs each range as a co-routine and merges them (``MERGE (UNION ALL)`` in the plan,
no sort), stopping after ``LIMIT`` rows — n rows and seven seeks, whatever the history, in the order
``ix_ql_run_created`` gave before (ties in one millisecond now by ``run_key``, not by id: revision
0016 keeps the 36-character id out of the index's entries, ~13 bytes an entry where ~50 made a
512-byte leaf split three times as often). The ended runs by age are the five ended ranges
(:data:`OLDEST_ENDED_RUNS`, one state per call).

Every write of a run used to move it in three ordered indexes (created, status, ended) plus its
key's; now in one plus its key's: about two WAL frames fewer per awaited task at 512-byte pages,
where an index's page splits cost as much as its entries (``bench/wal_pages.py``).

A run's attempts are one range of ``ql_run_attempt``'s rowid, ``attempt_key = run_key << 8 |
attempt_no`` (as a run's events are of theirs, :mod:`ql_core.db.sqlite_events`): every read of a run's
attempts goes through its run's row (:data:`ATTEMPTS_OF`), and no index of attempts by run id is
written per task (two more frames). :data:`INSERT_ATTEMPT` takes the key from the run's row.

The states are numbered (``ql_run.status_order``, a VIRTUAL generated column: nothing stored) in
:data:`STATUS_ORDER`, not sorted by name: the live ones last and ``succeeded`` just before them, so
an awaited task appends its ``running`` entry at the index's right edge and its ``succeeded`` entry
beside it — one leaf per commit, where by name the ``running`` range sat in front of the whole
``succeeded`` history and a task wrote a middle leaf (and rebalanced it) as well as the edge.

A run's state is always one of the seven (core writes no other), so every run is in one range.
PostgreSQL keeps ``ix_ql_run_created``, ``ix_ql_run_status`` and ``ix_ql_run_ended`` and the shared
statements.
"""

from __future__ import annotations

from ql_core.states import RUN_ACTIVE, RUN_TERMINAL

from .journal_sql import ACTIVE, ATTEMPT_COLUMNS, RUN_COLUMNS, qualified

__all__ = ["RUN_STATES", "STATUS_ORDER", "SELECT_RUNS_NEWEST", "RUN_ROW", "SELECT_RUNS_NEWEST_BY_STATUS", "OLDEST_RUNS",
           "OLDEST_ENDED_RUNS"]

#: Every state a run can be in, in a fixed order (the arms of the merges).
RUN_STATES = tuple(sorted(RUN_ACTIVE | RUN_TERMINAL))
#: ``ql_run.status_order`` of each state is its place here, from 1 (revision 0013_sqlite_run_order
#: computes the column from its own copy of this tuple): the ended states first, the common one
#: last among them, then the live ones.
STATUS_ORDER = ("cancelled", "failed", "lost", "timed_out", "succeeded", "queued", "running")
#: A state's number (a parameter ``?``) as SQL: equal to ``status_order`` only for that state.
_ORDER_OF_PARAM = "CASE ? " + " ".join(f"WHEN '{s}' THEN {n}" for n, s in enumerate(STATUS_ORDER, start=1)) + " END"


def _merged(columns: str, descending: bool) -> str:
    order = "DESC" if descending else "ASC"
    # `?1` in every arm: one parameter, the limit. Each arm is one state's range of the index (the
    # hint keeps it there), in (created_at_ms, run_key) order; the compound's ORDER BY is that order,
    # so SQLite merges, not sorts. (A compound orders by result columns only: ``columns`` ends with
    # ``run_key`` — revision 0016 — and the reader drops it.)
    arms = " UNION ALL ".join(f"SELECT {columns}, run_key FROM ql_run INDEXED BY ix_ql_run_order "
                              f"WHERE status_order = {STATUS_ORDER.index(s) + 1}" for s in RUN_STATES)
    return f"{arms} ORDER BY created_at_ms {order}, run_key {order} LIMIT ?1"


#: ``ql list`` without ``--status``: the newest ``?1`` runs (parameters: limit), each row the columns
#: of :data:`~ql_core.db.journal_sql.RUN_COLUMNS` and then ``run_key`` (:data:`RUN_ROW`: the record's part).
SELECT_RUNS_NEWEST = _merged(RUN_COLUMNS, descending=True)
#: The part of a :data:`SELECT_RUNS_NEWEST` row that is a ``RunRecord`` (``RunRecord(*row[RUN_ROW])``).
RUN_ROW = slice(0, len(RUN_COLUMNS.split(",")))
#: History by count: the oldest ``?1`` runs, with their states (parameters: limit; rows: id, status,
#: created_at_ms, run_key).
OLDEST_RUNS = _merged("id, status, created_at_ms", descending=False)
#: History by age, one ended state at a time: its oldest runs created before the cutoff, at most a
#: bounded number (parameters: state, cutoff, limit). The caller keeps those that also *finished*
#: before the cutoff: a run that ended after it is stepped over (only runs that were live at the
#: cutoff, never history), and the next page comes once the cutoff has moved past it.
OLDEST_ENDED_RUNS = ("SELECT id, finished_at_ms, created_at_ms, run_key FROM ql_run INDEXED BY ix_ql_run_order "
                     f"WHERE status_order = {_ORDER_OF_PARAM} AND created_at_ms < ? ORDER BY created_at_ms, run_key LIMIT ?")
#: ``ql list --status S``: the newest ``limit`` runs in state S (parameters: state, limit).
SELECT_RUNS_NEWEST_BY_STATUS = (f"SELECT {RUN_COLUMNS} FROM ql_run INDEXED BY ix_ql_run_order "
                                f"WHERE status_order = {_ORDER_OF_PARAM} ORDER BY created_at_ms DESC, run_key DESC LIMIT ?")

# -- a run's attempts: one range of the attempt key (revision 0012_sqlite_lean_runs) ----------------
#: ``ql_run_attempt.attempt_key = run_key << ATTEMPT_KEY_BITS | attempt_no``: a run's attempts are one
#: range of the attempt table's rowid (no index of attempts by run id is written per task; a CHECK
#: keeps ``attempt_no`` in the key's low bits — ql allows at most 100 attempts).
ATTEMPT_KEY_BITS = 8
_SPAN = (1 << ATTEMPT_KEY_BITS) - 1
#: ``a.attempt_key`` within run ``r``'s range (``r`` and ``a`` are the statement's aliases).
ATTEMPTS_OF = f"a.attempt_key BETWEEN r.run_key << {ATTEMPT_KEY_BITS} AND (r.run_key << {ATTEMPT_KEY_BITS}) + {_SPAN}"
# -- an attempt's host handle beside it (revision 0014_sqlite_attempt_host) --------------------------
#: An attempt row with both executor handles (~500 bytes) is over the 477 bytes a 512-byte table page
#: keeps in a cell: it spilled into an overflow page that each commit of the task replaced (a page
#: freed and one allocated: the freelist trunk and page 1 as well, in both commits). The host handle
#: is written once, by the create, so the store writes it into ``ql_attempt_host`` under the
#: attempt's key (:data:`INSERT_ATTEMPT_HOST`) and the attempt's own column stays NULL. Reads take
#: the column when set (rows of older revisions, rows written by anything else), else the side row.
#: Since revision 0019_sqlite_run_host the create writes it into its run's row instead
#: (``ql_run.host_handle``, SQLite only): the run's leaf is written by the create anyway, where
#: ``ql_attempt_host``'s was one more page per task (1.25 WAL frames per awaited task, its splits
#: included). The create's attempt is always the run's first (:data:`INSERT_ATTEMPT`), so the run's
#: column is its first attempt's handle; side rows written before are read as they were.
HOST_HANDLE_A = (f"COALESCE(a.host_handle, CASE WHEN (a.attempt_key & {_SPAN}) = 1 THEN (SELECT hr.host_handle "
                 f"FROM ql_run hr WHERE hr.run_key = a.attempt_key >> {ATTEMPT_KEY_BITS}) END, "
                 "(SELECT h.host_handle FROM ql_attempt_host h WHERE h.attempt_key = a.attempt_key))")
#: :data:`ql_core.db.journal_sql.ATTEMPT_COLUMNS` of the attempt table aliased ``a`` (its host handle
#: as :data:`HOST_HANDLE_A`).
ATTEMPT_COLUMNS_A = ", ".join(HOST_HANDLE_A if c.strip() == "host_handle" else f"a.{c.strip()}"
                              for c in ATTEMPT_COLUMNS.split(","))
#: The create's host handle (parameters: handle, attempt id), after its attempt (the run's first),
#: into its run's row (0019), written in the same transaction; none, nothing to write.
INSERT_ATTEMPT_HOST = (f"UPDATE ql_run SET host_handle = ?1 WHERE run_key = (SELECT attempt_key >> {ATTEMPT_KEY_BITS} "
                       f"FROM ql_run_attempt WHERE id = ?2 AND (attempt_key & {_SPAN}) = 1) AND ?1 IS NOT NULL")
SELECT_ATTEMPT = f"SELECT {ATTEMPT_COLUMNS_A} FROM ql_run_attempt a WHERE a.id = ?"
#: A transition's rows in one statement (parameter: attempt id), where the kernel reads three: the
#: attempt (as :data:`SELECT_ATTEMPT`), then its run (``RUN_COLUMNS``, NULLs without one), then the
#: run's cancel dispatch (``run_id, attempt_id, term_sent_at_ms``, NULLs without one). No row: no
#: attempt. An awaited task's terminal commit reads these once (``SqliteJournal._transition_rows``).
SELECT_TRANSITION_ROWS = (f"SELECT {ATTEMPT_COLUMNS_A}, {qualified(RUN_COLUMNS, 'r')}, "
                          "d.run_id, d.attempt_id, d.term_sent_at_ms FROM ql_run_attempt a "
                          "LEFT JOIN ql_run r ON r.id = a.run_id LEFT JOIN ql_cancel_dispatch d ON d.run_id = r.id "
                          "WHERE a.id = ?")
# -- the recovery page: this node's active attempts by id (revision 0018_sqlite_live_attempts) --------
#: An attempt is active (starting, running) only while its run is (queued, running: an attempt and its
#: run end in one transaction, ql_core.completion), so the active attempts are among the attempts of
#: the live ranges of ``ix_ql_run_order`` — the index every task writes anyway. The partial index
#: ``ix_ql_attempt_live`` of the active attempts cost a page in each of a task's two commits (its entry
#: added, then removed: 2.0 WAL frames per awaited task); a page now reads the live runs and their
#: attempts' key ranges and sorts the active ones by id: live rows only, never history.
LIVE_ORDERS = tuple(STATUS_ORDER.index(s) + 1 for s in sorted(RUN_ACTIVE))
PAGE_ACTIVE_ATTEMPTS = (f"SELECT {ATTEMPT_COLUMNS_A} FROM ql_run r INDEXED BY ix_ql_run_order CROSS JOIN "
                        f"ql_run_attempt a ON {ATTEMPTS_OF} WHERE r.status_order IN {LIVE_ORDERS} "
                        f"AND a.runtime_owner = ? AND a.status IN {ACTIVE} AND a.id > ? ORDER BY a.id LIMIT ?")

#: The create's attempt, its key taken from its run's row (written first, in the same transaction):
#: the parameters of the shared INSERT_ATTEMPT, in its order; no run row, nothing inserted (the
#: store checks that it inserted the attempt). The host handle (``?12``) goes to ``ql_attempt_host``
#: (:data:`INSERT_ATTEMPT_HOST`): the row's column is NULL (``NULLIF(?12, ?12)`` binds it all the same).
INSERT_ATTEMPT = ("INSERT INTO ql_run_attempt (attempt_key, id, run_id, attempt_no, executor, runtime_owner, status, "
                  "log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, "
                  "started_at_ms, handle, host_handle, version) "
                  f"SELECT (r.run_key << {ATTEMPT_KEY_BITS}) + 1, ?1, r.id, 1, ?3, ?4, ?5, ?6, ?7, 0, ?8, ?9, ?10, ?11, "
                  "NULLIF(?12, ?12), 1 FROM ql_run r WHERE r.id = ?2")
SELECT_ATTEMPTS_OF_RUN = (f"SELECT {ATTEMPT_COLUMNS_A} FROM ql_run r CROSS JOIN ql_run_attempt a ON {ATTEMPTS_OF} "
                          "WHERE r.id = ? ORDER BY a.attempt_key")


def attempts_of_runs(count: int) -> str:
    """The attempts of ``count`` runs (their ids the parameters), by run id then attempt number."""
    marks = ", ".join("?" for _ in range(count))
    return (f"SELECT {ATTEMPT_COLUMNS_A} FROM ql_run r CROSS JOIN ql_run_attempt a ON {ATTEMPTS_OF} "
            f"WHERE r.id IN ({marks}) ORDER BY r.id, a.attempt_key")


__all__ += ["ATTEMPT_KEY_BITS", "ATTEMPTS_OF", "HOST_HANDLE_A", "ATTEMPT_COLUMNS_A", "INSERT_ATTEMPT",
            "INSERT_ATTEMPT_HOST", "SELECT_ATTEMPT", "SELECT_TRANSITION_ROWS", "LIVE_ORDERS", "PAGE_ACTIVE_ATTEMPTS", "SELECT_ATTEMPTS_OF_RUN", "attempts_of_runs"]
