"""SQLite: runs ordered with the live ones at the index's right edge (issue 25).

``ix_ql_run_status (status, created_at_ms, id)`` is SQLite's one ordered index of runs (0012): each
state a range of it in creation order. Sorted by the state's *name*, the ``running`` range sat just
before the huge ``succeeded`` range, at its oldest end, so every awaited task wrote three leaves of
it: its ``running`` entry in the middle of the index at the create, that leaf again and the right
edge (its ``succeeded`` entry, the newest) at its end — and the middle leaf, full, was rebalanced
with its two siblings and their parent every few tasks (``bench/wal_pages.py``: 4.1 frames per task).

``ql_run.status_order`` is a VIRTUAL generated column (nothing stored in the row) that numbers the
states so that the common ended state comes last among the ended ones and the live ones after it:
cancelled 1, failed 2, lost 3, timed_out 4, succeeded 5, queued 6, running 7. ``ix_ql_run_order
(status_order, created_at_ms, id)`` replaces ``ix_ql_run_status`` on SQLite: a task's ``running``
entry is appended at the right edge and its ``succeeded`` entry lands beside it, in the same leaf —
one leaf per commit, and splits are the cheap right-edge appends. Reads are the same ranges, by
number (``ql_core.db.sqlite_runs``); an unknown state numbers NULL, outside every range, as a state
missing from the merged reads was before. Every row is kept (only an index is rebuilt);
PostgreSQL is not changed.

Revision ID: 0013_sqlite_run_order
Revises: 0012_sqlite_lean_runs
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade, upgrade_sqlite

revision = "0013_sqlite_run_order"
down_revision = "0012_sqlite_lean_runs"
branch_labels = None
depends_on = None

#: ql_core.db.sqlite_runs.STATUS_ORDER (a revision keeps its own copy).
_ORDER = ("cancelled", "failed", "lost", "timed_out", "succeeded", "queued", "running")


def upgrade() -> None:
    cases = " ".join(f"WHEN '{state}' THEN {n}" for n, state in enumerate(_ORDER, start=1))
    upgrade_sqlite(op, [
        f"ALTER TABLE ql_run ADD COLUMN status_order INTEGER GENERATED ALWAYS AS (CASE status {cases} END) "
        "VIRTUAL",
        "CREATE INDEX ix_ql_run_order ON ql_run (status_order, created_at_ms, id)",
        "DROP INDEX ix_ql_run_status",
    ])


downgrade = no_downgrade
