"""SQLite: a log is listed in ``ix_ql_log_order`` once its attempt has ended, never when empty; an empty end writes no log row (issue 25).

``ix_ql_log_order (log_order, id) WHERE deleted_at_ms IS NULL`` (0015) held every undeleted log: a
task's create added its entry at the index's right edge (the unsized range) and its end moved it to
the sized range — a leaf in both of a task's commits, ~2.9 WAL frames per awaited task with the
splits (``bench/wal_pages.py``). Neither entry is read for a running log: the quota pass finds the
logs of live attempts through the live runs (``ql_core.db.sqlite_logs.PAGE_LIVE_LOGS``, as the
recovery page of 0018 finds their attempts), and retention never looks at a live log. An empty log
(the usual awaited task: its size, 0, recorded by the terminal commit, the file dropped) has no
bytes to keep or free. So a log is listed only when

- its size is recorded and not 0 (the sized range, by age: what retention deletes), or
- its attempt ended before its size was recorded: ``size_due`` (new, 0 by default) is set to 1 by
  the terminal commit that records no size, and the size is still not recorded (the sizing queue,
  at the right edge, as before; a size of 0 recorded later unlists it).

And an empty log's end writes no log row at all: the terminal commit that records a log as empty
(the size 0 offered by the waiting host, ``ql_core.ports.journal.TerminalLogSize``) sets
``ql_run_attempt.log_empty`` (new, NULL by default) on the attempt row it writes anyway, and every
read of a log takes its size from there while the log's own is NULL
(``ql_core.db.sqlite_logs.LOG_COLUMNS_A``): one page fewer in that commit.

Existing rows: every undeleted unsized log joins the queue (a running one among them is skipped by
the queue's reads, which take ended attempts only, and sized when it ends, as before); sized
empty logs leave the index (retention has nothing of theirs to free; their rows go with their run's
history). Only the index is rebuilt and two columns added: every row is kept. PostgreSQL is not
changed.

Revision ID: 0020_sqlite_log_listing
Revises: 0019_sqlite_run_host
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade, upgrade_sqlite

revision = "0020_sqlite_log_listing"
down_revision = "0019_sqlite_run_host"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_sqlite(op, [
        "ALTER TABLE ql_log_artifact ADD COLUMN size_due INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE ql_run_attempt ADD COLUMN log_empty INTEGER",
        # Through the index still there: the unsized range only, never the sized history.
        "UPDATE ql_log_artifact SET size_due = 1 WHERE id IN (SELECT id FROM ql_log_artifact INDEXED BY "
        "ix_ql_log_order WHERE log_order = 9223372036854775807 AND deleted_at_ms IS NULL)",
        "DROP INDEX ix_ql_log_order",
        "CREATE INDEX ix_ql_log_order ON ql_log_artifact (log_order, id) "
        "WHERE deleted_at_ms IS NULL AND (size_bytes > 0 OR (size_bytes IS NULL AND size_due = 1))",
    ])


downgrade = no_downgrade
