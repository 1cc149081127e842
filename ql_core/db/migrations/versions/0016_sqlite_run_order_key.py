"""SQLite: ``ix_ql_run_order`` without the run's 36-character id (issue 25: bytes written per task).

``ix_ql_run_order (status_order, created_at_ms, id)`` (0013) is written by both commits of every
task: its entry is appended at the create and moved from the ``running`` range to the ``succeeded``
range at the end. An index B-tree grows at its right edge by rebalancing the last leaf with its two
siblings and their parent (SQLite's quick append is for rowid tables only), so how often a task
pays that is set by how many entries a 512-byte leaf holds: ~9 with the id (~50 bytes an entry),
~30 without it (~13 bytes: the state's number, the creation time and the rowid every index entry
ends with). The id only broke ties between runs created in the same millisecond; the rowid,
``run_key``, breaks them now — in creation order, which the index gives without storing anything
(``ql_core.db.sqlite_runs``: every read orders by ``created_at_ms, run_key``).

Measured with ``python bench/wal_pages.py --tasks 100 --quiet``: ix_ql_run_order 3.34 -> 2.29 WAL
frames per awaited task. Every row is kept (only an index is rebuilt); PostgreSQL is not changed.

Revision ID: 0016_sqlite_run_order_key
Revises: 0015_sqlite_log_order
"""

from alembic import op

revision = "0016_sqlite_run_order_key"
down_revision = "0015_sqlite_log_order"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    op.execute("DROP INDEX ix_ql_run_order")
    op.execute("CREATE INDEX ix_ql_run_order ON ql_run (status_order, created_at_ms)")


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")
