"""SQLite: an attempt's host handle in a row of its own, so the attempt row fits its page (issue 25).

An attempt row with both executor handles (the launcher's and the submitting host's, ~110-190
bytes of JSON each: ~510 bytes in all) is over the 477 bytes a 512-byte table page keeps in a cell,
so every attempt spilled into an overflow page. Each of a task's two commits replaced it — SQLite
rewrites a changed row's overflow chain: a new page, the old one to the freelist —, so both wrote
the overflow page, the freelist trunk and page 1 (``bench/wal_pages.py``: ``?53`` and
``sqlite_schema`` in every commit).

The host handle is written once, by the create, and read only by recovery ("never started"). The
store now writes it into ``ql_attempt_host (attempt_key INTEGER PRIMARY KEY, host_handle)`` in the
create's transaction, under the attempt's own key (``ql_core.db.sqlite_runs``), and leaves the
attempt's ``host_handle`` NULL: the attempt row (~400 bytes) fits its page. Reads take the
attempt's column when it is set — every row written before this revision keeps its handle there,
untouched, as does a row written by anything else — and the side row otherwise. A trigger deletes
the side row with its attempt (the history purge). PostgreSQL is not changed.

Revision ID: 0014_sqlite_attempt_host
Revises: 0013_sqlite_run_order
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade, upgrade_sqlite

revision = "0014_sqlite_attempt_host"
down_revision = "0013_sqlite_run_order"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_sqlite(op, [
        "CREATE TABLE ql_attempt_host (attempt_key INTEGER NOT NULL PRIMARY KEY, host_handle VARCHAR(512) NOT NULL)",
        "CREATE TRIGGER ql_attempt_host_delete AFTER DELETE ON ql_run_attempt BEGIN "
        "DELETE FROM ql_attempt_host WHERE attempt_key = OLD.attempt_key; END",
    ])


downgrade = no_downgrade
