"""SQLite: the create's host handle in its run's row, not in a table of its own (issue 25).

Revision 0014 moved an attempt's host handle (the submitting host's identity, ~110 bytes, written
once by the create and read by recovery's "never started" proof) out of the attempt row, which with
both handles overflowed a 512-byte page's cell, into ``ql_attempt_host``: one more B-tree in every
create, 1.25 WAL frames per awaited task with its splits (``bench/wal_pages.py``). The run's row is
written by the same create anyway and, at ~130 bytes, has room: ``ql_run.host_handle`` (NULL unless
set) now holds it — the create's attempt is always the run's first, so the column is that attempt's
handle (``ql_core.db.sqlite_runs.HOST_HANDLE_A`` reads the attempt's own column first, then the
run's for a first attempt, then the side table). Rows are kept where they are: side rows written
before are read as they were, and the table and its trigger stay for them. PostgreSQL is not
changed (its attempt row keeps the handle).

Revision ID: 0019_sqlite_run_host
Revises: 0018_sqlite_live_attempts
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade, upgrade_sqlite

revision = "0019_sqlite_run_host"
down_revision = "0018_sqlite_live_attempts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_sqlite(op, [
        "ALTER TABLE ql_run ADD COLUMN host_handle VARCHAR(512)",
    ])


downgrade = no_downgrade
