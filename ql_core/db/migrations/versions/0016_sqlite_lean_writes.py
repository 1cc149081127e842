"""SQLite: fewer pages written per task — ``ix_ql_run_order`` without the run id, the run count up to a
key instead of a trigger write in every create, log and journal rows that fit their cell, the journal
one B-tree (issue 25: bytes written per task).

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

- A log row is written without its ``attempt_id`` and ``relative_path`` (both left ``''``; the
  store's statements, ``ql_core.db.sqlite_logs``): the path is derived from the log's id by every
  reader, and the attempt is the one of the log's run whose ``log_artifact_id`` is the log. With
  three 36-character ids and the path (~170 bytes) every row of this WITHOUT ROWID table spilled
  into an overflow page (an index B-tree's cell holds 102 bytes at 512-byte pages): a WAL frame in
  every create and a 512-byte page of database per task; now ~92 bytes, in the cell. The triggers
  that keep ``log_bytes:<owner>`` find the owner the same way (through the run), for rows of either
  kind.

- ``ql_receipt_journal`` becomes ``WITHOUT ROWID`` again, one B-tree instead of the rowid table
  and the index of its text key (0012 made it a rowid table because its ~150-byte rows overflowed
  an index B-tree's 102-byte cell). The store now leaves ``run_id`` and ``receipt_ref`` empty when
  they are derived — the run is the attempt's (its row is written in the same create, and a purge
  deletes it only after the journal row), the reference ``<xx>/<attempt_id>.json`` — so a row is
  ~70 bytes and fits its cell; the reads derive both (``ql_plugins.edge_sqlite.statements``). A row
  registered for a receipt whose attempt is not there keeps both. Rows are copied as they are.

Measured with ``python bench/wal_pages.py --tasks 100 --quiet``: 30.4 -> 26.7 WAL frames per
awaited task (ix_ql_run_order 3.34 -> 2.29, ql_tally 1.00 -> 0, ql_log_artifact 3.91 -> 3.22, the
journal's key index 1.00 -> 0) and 1.1 -> 0.2 database pages of logs per task. Every row is kept
as it is (an index rebuilt, a column added, triggers replaced, the journal's rows copied);
PostgreSQL is not changed (no ql_tally there; its own statements).

Revision ID: 0016_sqlite_lean_writes
Revises: 0015_sqlite_log_order
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade

revision = "0016_sqlite_lean_writes"
down_revision = "0015_sqlite_log_order"
branch_labels = None
depends_on = None

#: The newest run's key, 0 without runs.
_NEWEST = "COALESCE((SELECT max(run_key) FROM ql_run), 0)"
#: A log's share of its owner's total: its recorded size while it is not deleted (as 0007's).
_SHARE = "(CASE WHEN {r}.deleted_at_ms IS NULL THEN COALESCE({r}.size_bytes, 0) ELSE 0 END)"
# The owner is the log's attempt's, found through the log's run (the attempt key range, then the
# attempt whose log it is: ql_core.db.sqlite_logs.ATTEMPT_OF_LOG; 8 = ATTEMPT_KEY_BITS): a row
# written since this revision has no attempt id. A purge deletes the log before its attempt and
# run, so they are there to read. An upsert fed by a SELECT with a join needs a WHERE (SQLite's parser).
_ADD_TO_OWNER = ("INSERT INTO ql_tally (name, value) SELECT 'log_bytes:' || a.runtime_owner, {delta} "
                 "FROM ql_run r CROSS JOIN ql_run_attempt a ON a.attempt_key BETWEEN r.run_key << 8 "
                 "AND (r.run_key << 8) + 255 AND a.log_artifact_id = {r}.id WHERE r.id = {r}.run_id "
                 "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value;")
_LOG_TRIGGERS = (
    "CREATE TRIGGER ql_tally_log_update AFTER UPDATE OF size_bytes, deleted_at_ms ON ql_log_artifact "
    f"WHEN {_SHARE.format(r='NEW')} != {_SHARE.format(r='OLD')} BEGIN "
    + _ADD_TO_OWNER.format(delta=f"{_SHARE.format(r='NEW')} - {_SHARE.format(r='OLD')}", r="NEW") + " END",
    "CREATE TRIGGER ql_tally_log_delete AFTER DELETE ON ql_log_artifact "
    f"WHEN {_SHARE.format(r='OLD')} != 0 BEGIN "
    + _ADD_TO_OWNER.format(delta=f"-{_SHARE.format(r='OLD')}", r="OLD") + " END",
)


_JOURNAL = """(
	attempt_id VARCHAR(36) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	receipt_ref VARCHAR(64) NOT NULL, 
	quarantine_reason VARCHAR(40), 
	registered_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	terminal_seen_at_ms BIGINT, 
	PRIMARY KEY (attempt_id)
) WITHOUT ROWID"""


def _journal_without_rowid(bind) -> None:  # type: ignore[no-untyped-def]
    """ql_receipt_journal as one B-tree clustered on its key, every row copied as it is."""
    columns = ", ".join(r[1] for r in bind.exec_driver_sql("PRAGMA table_info(ql_receipt_journal)").fetchall())
    op.execute(f"CREATE TABLE ql_receipt_journal_0016 {_JOURNAL}")
    op.execute(f"INSERT INTO ql_receipt_journal_0016 ({columns}) SELECT {columns} FROM ql_receipt_journal")
    kept = bind.exec_driver_sql("SELECT count(*) FROM ql_receipt_journal_0016").scalar()
    had = bind.exec_driver_sql("SELECT count(*) FROM ql_receipt_journal").scalar()
    if kept != had:
        raise RuntimeError(f"0016: {had - kept} receipt-journal rows not copied: restore ql.db from a backup")
    op.execute("DROP TABLE ql_receipt_journal")
    op.execute("ALTER TABLE ql_receipt_journal_0016 RENAME TO ql_receipt_journal")


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
    op.execute("DROP TRIGGER ql_tally_log_update")
    op.execute("DROP TRIGGER ql_tally_log_delete")
    for statement in _LOG_TRIGGERS:
        op.execute(statement)
    _journal_without_rowid(bind)


downgrade = no_downgrade
