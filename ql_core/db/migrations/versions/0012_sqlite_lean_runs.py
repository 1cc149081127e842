"""SQLite: three index B-trees fewer per task, and the receipt journal without overflow pages (issue 25).

Counted per B-tree of an awaited ``true`` task after 120 warm-up tasks (``bench/wal_pages.py``),
every index B-tree that grows with history cost about two WAL frames per task: one for the entry,
about one more for its page splits — at 512-byte pages an index leaf holds ~9 entries, and SQLite
balances an index B-tree by rewriting three siblings and their parent. ``ql_run`` had four of them:

- ``ix_ql_run_created`` (created_at_ms, id) served ``ql list`` without ``--status`` and history by
  count (the oldest runs). ``ix_ql_run_status`` (status, created_at_ms, id) orders every run too,
  within its state: the newest (or oldest) n runs are now a merge of the seven per-state ranges of
  that index (``ql_core.db.sqlite_runs``): SQLite merges them lazily (``MERGE (UNION ALL)``, no sort)
  and stops after n rows, in the same order (created_at_ms, id) as before.
- ``ix_ql_run_ended`` (finished_at_ms, id) WHERE ended served history by age. The same ended runs
  are ranges of ``ix_ql_run_status``, in creation order: the store reads each ended state's oldest
  runs created before the cutoff, a bounded number, and keeps those that also finished before it
  (``ql_plugins.edge_sqlite.store``).
- ``ix_ql_attempt_run`` (run_id, attempt_no): a run's attempts become one range of the attempt
  table's rowid, ``attempt_key = run_key << 8 | attempt_no`` (as a run's events are of theirs, 0011):
  the store's INSERT takes the key from the run's row, a CHECK keeps ``attempt_no`` in the key's low
  bits (ql allows 100 attempts), and every read of a run's attempts goes through its run's key.
  ``id`` stays unique (the same automatic index as before). Existing attempts get their run's key
  and their number; an attempt whose run is missing stops the upgrade (restore from a backup).
- ``ql_receipt_journal`` becomes a rowid table again (0010 made it ``WITHOUT ROWID``): a row (two
  ids, the receipt's relative path, three clocks: ~150 bytes) is wider than the 102 bytes an index
  B-tree's cell holds at 512-byte pages, so every row spilled into an overflow page, which the
  terminal commit's ``terminal_seen_at_ms`` rewrote (a new page, the old one to the freelist) and the
  row's delete freed. A rowid table's cell holds 477 bytes: the row and the small index of its key
  (the table holds only the few rows of receipts not yet consumed) each cost one page per change.

Measured on the same machine (``python bench/wal_pages.py`` after 120 tasks, 40 tasks): 42.0 ->
37.0 WAL frames per awaited task without the two run indexes and with the rowid journal, 35.0 also
without ``ix_ql_attempt_run``. Every row is kept (the journal's rows are copied as they are);
PostgreSQL is not changed.

Revision ID: 0012_sqlite_lean_runs
Revises: 0011_sqlite_compact
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade

revision = "0012_sqlite_lean_runs"
down_revision = "0011_sqlite_compact"
branch_labels = None
depends_on = None

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
)"""


_BITS = 8  # ql_core.db.sqlite_runs.ATTEMPT_KEY_BITS (a revision keeps its own copy)

_ATTEMPT = f"""(
	id VARCHAR(36) NOT NULL UNIQUE, 
	run_id VARCHAR(36) NOT NULL, 
	attempt_no INTEGER NOT NULL, 
	executor VARCHAR(64) NOT NULL, 
	runtime_owner VARCHAR(64) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	exit_code INTEGER, 
	reason VARCHAR(80), 
	log_artifact_id VARCHAR(36) NOT NULL, 
	callback_token_hash VARCHAR(64) NOT NULL, 
	callback_sequence INTEGER NOT NULL, 
	deadline_at_ms BIGINT, 
	created_at_ms BIGINT NOT NULL, 
	started_at_ms BIGINT, 
	finished_at_ms BIGINT, 
	version INTEGER NOT NULL, 
	handle VARCHAR(512), 
	host_handle VARCHAR(512), 
	attempt_key INTEGER PRIMARY KEY, 
	FOREIGN KEY(run_id) REFERENCES ql_run (id), 
	CHECK (attempt_no BETWEEN 1 AND {(1 << _BITS) - 1} AND (attempt_key & {(1 << _BITS) - 1}) = attempt_no)
)"""


def _columns(bind, table: str) -> list[str]:
    return [r[1] for r in bind.exec_driver_sql(f'PRAGMA table_info("{table}")').fetchall()]


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    op.execute("DROP INDEX IF EXISTS ix_ql_run_created")
    op.execute("DROP INDEX IF EXISTS ix_ql_run_ended")
    _attempts_by_run_key(bind)
    columns = ", ".join(_columns(bind, "ql_receipt_journal"))
    _rebuild(bind, "ql_receipt_journal", _JOURNAL,
             f"({columns}) SELECT {columns} FROM ql_receipt_journal ORDER BY attempt_id",
             "receipt-journal rows not copied")


def _rebuild(bind, table: str, ddl: str, insert: str, lost: str) -> None:  # type: ignore[no-untyped-def]
    """``table`` as ``ddl`` defines it, its rows copied by ``INSERT INTO <new> {insert}``; every row
    must arrive (else the migration stops: ``lost`` names what went missing)."""
    op.execute(f"CREATE TABLE {table}_0012 {ddl}")
    op.execute(f"INSERT INTO {table}_0012 {insert}")
    kept = bind.exec_driver_sql(f"SELECT count(*) FROM {table}_0012").scalar()
    had = bind.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
    if kept != had:
        raise RuntimeError(f"0012: {had - kept} {lost}: restore ql.db from a backup")
    op.execute(f"DROP TABLE {table}")
    op.execute(f"ALTER TABLE {table}_0012 RENAME TO {table}")


def _attempts_by_run_key(bind) -> None:  # type: ignore[no-untyped-def]
    """ql_run_attempt keyed by ``run_key << 8 | attempt_no``; ix_ql_attempt_run goes."""
    # The triggers go first (the tally triggers read ql_run_attempt: a table cannot be renamed while a
    # trigger names a missing one) and come back as they were, with the attempt table's other indexes.
    triggers = [r[0] for r in bind.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'trigger' "
                                                   "ORDER BY name").fetchall()]
    indexes = [r[0] for r in bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND tbl_name = 'ql_run_attempt' "
        "AND name != 'ix_ql_attempt_run' ORDER BY name").fetchall()]
    for name, in bind.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        op.execute(f'DROP TRIGGER "{name}"')
    columns = _columns(bind, "ql_run_attempt")
    _rebuild(bind, "ql_run_attempt", _ATTEMPT,
             f"(attempt_key, {', '.join(columns)}) "
             f"SELECT (r.run_key << {_BITS}) + a.attempt_no, {', '.join('a.' + c for c in columns)} "
             "FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id ORDER BY r.run_key, a.attempt_no",
             "attempts of no run")
    for sql in indexes + triggers:
        op.execute(sql)


downgrade = no_downgrade
