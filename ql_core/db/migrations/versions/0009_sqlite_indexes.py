"""SQLite: two secondary indexes no query reads are dropped (fewer pages written per task).

Issue 25 item 1: every run's create and end commits wrote ``ix_ql_run_finished`` (status,
finished_at_ms) and ``ix_ql_attempt_active`` (runtime_owner, status, id). On SQLite no statement
of the run store needs them (checked with EXPLAIN QUERY PLAN of every statement of
``ql_core.db.journal_sql`` and ``ql_plugins.edge_sqlite.statements``): live attempts are paged
through the partial ``ix_ql_attempt_live``, due deadlines through ``ix_ql_attempt_deadline``, the
log queries join attempts on their key, retention reads the partial ``ix_ql_run_ended``. Dropping
them saves about 25 KB written per awaited task (bench/bench_edge.py). PostgreSQL keeps both
(the cluster's own queries are not changed here).

Nothing else changes: no table, column or row is touched.

Revision ID: 0009_sqlite_indexes
Revises: 0008_worker_draining
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade

revision = "0009_sqlite_indexes"
down_revision = "0007_history"  # core's chain; the cluster branch's 0008 sits on 0007 too
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index("ix_ql_run_finished", table_name="ql_run")
    op.drop_index("ix_ql_attempt_active", table_name="ql_run_attempt")


downgrade = no_downgrade
