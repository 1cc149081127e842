"""SQLite: one index of kept logs, the unsized ones at its right edge (issue 25).

Two partial indexes of ``ql_log_artifact`` were written by every task: ``ix_ql_log_unsized (id)``
(the running logs and the sizing queue) at its create and again at its end (the size recorded:
the entry leaves), and ``ix_ql_log_kept (created_at_ms, id)`` (undeleted logs by age) at its
create — three index leaves per awaited task plus the splits (``bench/wal_pages.py``: 3.8 frames).

The unsized logs are a subset of the kept ones. ``ql_log_artifact.log_order``, a VIRTUAL generated
column (nothing stored in the row), is the log's ``created_at_ms`` once it is sized and the largest
integer before (``ql_core.db.sqlite_logs.UNSIZED``); ``ix_ql_log_order (log_order, id) WHERE
deleted_at_ms IS NULL`` replaces both on SQLite: the sized logs by age, then the unsized ones by id
— the running logs and the sizing queue as one range at the right edge. A task's create appends its
entry there and its end moves it to the newest end of the sized range, right beside it: one leaf
per commit. Every statement reads one range of it (``ql_core.db.sqlite_logs``). Every row is kept
(only indexes change); PostgreSQL is not changed.

Revision ID: 0015_sqlite_log_order
Revises: 0014_sqlite_attempt_host
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade, upgrade_sqlite

revision = "0015_sqlite_log_order"
down_revision = "0014_sqlite_attempt_host"
branch_labels = None
depends_on = None

_UNSIZED = (1 << 63) - 1  # ql_core.db.sqlite_logs.UNSIZED (a revision keeps its own copy)


def upgrade() -> None:
    upgrade_sqlite(op, [
        "ALTER TABLE ql_log_artifact ADD COLUMN log_order BIGINT GENERATED ALWAYS AS "
        f"(CASE WHEN size_bytes IS NULL THEN {_UNSIZED} ELSE created_at_ms END) VIRTUAL",
        "CREATE INDEX ix_ql_log_order ON ql_log_artifact (log_order, id) WHERE deleted_at_ms IS NULL",
        "DROP INDEX ix_ql_log_kept",
        "DROP INDEX ix_ql_log_unsized",
    ])


downgrade = no_downgrade
