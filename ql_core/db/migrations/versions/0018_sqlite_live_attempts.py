"""SQLite: no index of the live attempts; the recovery page reads them through the live runs (issue 25).

``ix_ql_attempt_live (runtime_owner, id) WHERE status IN ('starting', 'running')`` (0007) was written
by both commits of every task: the create added the attempt's entry and the terminal commit removed
it — one 512-byte page in each (``bench/wal_pages.py``: 2.00 WAL frames per awaited task), for a
read that only the reconciler's round makes. An attempt is active only while its run is (an attempt
and its run end in one transaction), and the live runs are already ranges of ``ix_ql_run_order``
(``status_order`` of ``queued`` and ``running``), which every task writes anyway: the page of active
attempts now reads those ranges, each run's attempts by their key, and sorts the active ones of
this node by id (``ql_core.db.sqlite_runs.PAGE_ACTIVE_ATTEMPTS``) — live rows only, never history.
Only the index is dropped: every row is kept. PostgreSQL keeps it.

Revision ID: 0018_sqlite_live_attempts
Revises: 0016_sqlite_lean_writes
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade, upgrade_sqlite

revision = "0018_sqlite_live_attempts"
down_revision = "0016_sqlite_lean_writes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_sqlite(op, [
        "DROP INDEX IF EXISTS ix_ql_attempt_live",
    ])


downgrade = no_downgrade
