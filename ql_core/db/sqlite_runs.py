"""SQLite's ordered reads of runs: every run from ``ix_ql_run_status`` alone (revision 0012_sqlite_lean_runs).

On SQLite a run is in one ordered index, ``ix_ql_run_status (status, created_at_ms, id)``: each
state is a range of it in creation order. The newest (or oldest) n runs of any state are the merge
of the seven ranges (:data:`ql_core.states.RUN_ACTIVE` and :data:`~ql_core.states.RUN_TERMINAL`),
written as a compound SELECT whose ORDER BY is the index's: SQLite runs each range as a co-routine
and merges them (``MERGE (UNION ALL)`` in the plan, no sort), stopping after ``LIMIT`` rows — n rows
and seven seeks, whatever the history, in the order ``ix_ql_run_created`` gave before. The ended
runs by age are the five ended ranges (:data:`OLDEST_ENDED_RUNS`, one state per call).

Every write of a run used to move it in three ordered indexes (created, status, ended) plus its
key's; now in one plus its key's: about four WAL frames fewer per task at 512-byte pages, where an
index's page splits cost as much as its entries (``bench/wal_pages.py``).

A run's state is always one of the seven (core writes no other), so every run is in one range.
PostgreSQL keeps ``ix_ql_run_created`` and ``ix_ql_run_ended`` and the shared statements.
"""

from __future__ import annotations

from ql_core.states import RUN_ACTIVE, RUN_TERMINAL

from .journal_sql import RUN_COLUMNS

__all__ = ["RUN_STATES", "SELECT_RUNS_NEWEST", "OLDEST_RUNS", "OLDEST_ENDED_RUNS"]

#: Every state a run can be in, in a fixed order (the arms of the merges).
RUN_STATES = tuple(sorted(RUN_ACTIVE | RUN_TERMINAL))


def _merged(columns: str, descending: bool) -> str:
    order = "DESC" if descending else "ASC"
    # `?1` in every arm: one parameter, the limit. Each arm is one state's range of the index (the
    # hint keeps it there); the compound's ORDER BY is that range's order, so SQLite merges, not sorts.
    arms = " UNION ALL ".join(f"SELECT {columns} FROM ql_run INDEXED BY ix_ql_run_status WHERE status = '{s}'"
                              for s in RUN_STATES)
    return f"{arms} ORDER BY created_at_ms {order}, id {order} LIMIT ?1"


#: ``ql list`` without ``--status``: the newest ``?1`` runs (parameters: limit).
SELECT_RUNS_NEWEST = _merged(RUN_COLUMNS, descending=True)
#: History by count: the oldest ``?1`` runs, with their states (parameters: limit).
OLDEST_RUNS = _merged("id, status, created_at_ms", descending=False)
#: History by age, one ended state at a time: its oldest runs created before the cutoff, at most a
#: bounded number (parameters: state, cutoff, limit). The caller keeps those that also *finished*
#: before the cutoff: a run that ended after it is stepped over (only runs that were live at the
#: cutoff, never history), and the next page comes once the cutoff has moved past it.
OLDEST_ENDED_RUNS = ("SELECT id, finished_at_ms, created_at_ms FROM ql_run INDEXED BY ix_ql_run_status "
                     "WHERE status = ? AND created_at_ms < ? ORDER BY created_at_ms, id LIMIT ?")
