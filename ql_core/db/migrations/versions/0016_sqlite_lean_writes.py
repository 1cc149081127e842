"""SQLite: two B-tree writes fewer per task — ``ix_ql_run_order`` without the run id, and the run count
counted up to a key instead of by a trigger on every create (issue 25: bytes written per task).

- ``ix_ql_run_order (status_order, created_at_ms, id)`` (0013) is written by both commits of every
  task: its entry is appended at the create and moved from the ``running`` range to the
  ``succeeded`` range at the end. An index B-tree grows at its right edge by rebalancing the last
  leaf with its two siblings and their parent (SQLite's quick append is for rowid tables only), so
  how often a task pays that is set by how many entries a 512-byte leaf holds: ~9 with the id
  (~50 bytes an entry), ~30 without it (~13 bytes: the state's number, the creation time and the
  rowid every index entry ends with). The id only broke ties between runs created in the same
  millisecond; the rowid, ``run_key``, breaks them now — in creation order, which the index gives
  without storing anything (``ql_core.db.sqlite_runs``: every read orders by ``created_at_ms,
  run_key``).
- ``ql_tally``'s ``runs`` row was kept by a trigger on every insert into ``ql_run``: its page was
  one more WAL frame in every create. It now counts the runs whose key is at most its new column
  ``counted_to``; the runs above are counted when read, as one range of ``ql_run``'s rowid
  (``ql_plugins.edge_sqlite.statements.RUN_COUNT``), and history retention folds them into the row
  (``FOLD_RUN_COUNT``: the row again exact, ``counted_to`` the newest key) — once per round that
  finds new runs, not once per run. Keys are given in order (max + 1) and a delete only lowers the
  count of a run at or below ``counted_to`` (the trigger ``ql_tally_run_delete``, which also lowers
  ``counted_to`` to the newest key left, so a key given again after the newest runs were deleted is
  counted as new). The row's value is exact here (``count(*)``) and ``counted_to`` the newest key.

Measured with ``python bench/wal_pages.py --tasks 100 --quiet``: 30.4 -> 28.4 WAL frames per
awaited task (ix_ql_run_order 3.34 -> 2.29, ql_tally 1.00 -> 0). Every row is kept (an index is
rebuilt, a column added, a trigger replaced); PostgreSQL is not changed (no ql_tally there).

Revision ID: 0016_sqlite_lean_writes
Revises: 0015_sqlite_log_order
"""

from alembic import op

revision = "0016_sqlite_lean_writes"
down_revision = "0015_sqlite_log_order"
branch_labels = None
depends_on = None

#: The newest run's key, 0 without runs.
_NEWEST = "COALESCE((SELECT max(run_key) FROM ql_run), 0)"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    op.execute("DROP INDEX ix_ql_run_order")
    op.execute("CREATE INDEX ix_ql_run_order ON ql_run (status_order, created_at_ms)")
    op.execute("DROP TRIGGER ql_tally_run_insert")
    op.execute("DROP TRIGGER ql_tally_run_delete")
    op.execute("ALTER TABLE ql_tally ADD COLUMN counted_to BIGINT")
    op.execute(f"UPDATE ql_tally SET value = (SELECT count(*) FROM ql_run), counted_to = {_NEWEST} "
               "WHERE name = 'runs'")
    op.execute("CREATE TRIGGER ql_tally_run_delete AFTER DELETE ON ql_run "
               "WHEN OLD.run_key <= (SELECT counted_to FROM ql_tally WHERE name = 'runs') BEGIN "
               f"UPDATE ql_tally SET value = value - 1, counted_to = min(counted_to, {_NEWEST}) "
               "WHERE name = 'runs'; END")


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")
