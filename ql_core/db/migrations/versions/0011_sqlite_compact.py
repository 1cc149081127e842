"""SQLite: a run's events under its integer key (issue 25 item 1: disk written per task).

Counted per B-tree (``python bench/wal_pages.py --tasks 60 --quiet``), ``ql_run_event`` wrote the
most WAL frames of any B-tree per task: a ``WITHOUT ROWID`` table is an index B-tree, whose page
splits rewrite three sibling pages, and whose rows (two 36-character ids) spill into an overflow
page each at the 512-byte pages of a new database. Here:

- ``ql_run`` gets ``run_key INTEGER PRIMARY KEY`` (its rowid made explicit, so it is never
  renumbered, not even by ``VACUUM``); ``id`` stays unique (the same automatic index as before).
  Existing runs are numbered in creation order.
- ``ql_run_event`` becomes a rowid table keyed by ``event_key = run_key << 20 | seq``
  (:mod:`ql_core.db.sqlite_events`): a run's events are one rowid range, appended at the table's
  right edge, and the table has no index but the partial dedupe index (empty on SQLite). The
  store's INSERT takes the key from the run's row (no row, nothing inserted: the store checks it
  inserted every event); a CHECK keeps ``seq`` in the key's low 20 bits, and the trigger
  ``ql_event_fixed`` refuses changing a key. The foreign key to ``ql_run`` goes: its check on a
  run's purge would scan the table (no index on ``run_id``); the purge deletes a run's events
  before the run, in one transaction.
- ``ql_run_attempt`` is copied as it is: SQLite cannot drop the table its foreign key references
  (``ql_run``) while it holds rows, and cannot turn foreign keys off inside the migration's
  transaction, so the parent is rebuilt with its child.

Every row is copied as it is (an event gets its key from its run); every index and trigger is
re-created as it was. PostgreSQL is not changed.

Revision ID: 0011_sqlite_compact
Revises: 0010_sqlite_pages
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade

revision = "0011_sqlite_compact"
down_revision = "0010_sqlite_pages"
branch_labels = None
depends_on = None

_BITS = 20  # ql_core.db.sqlite_events.EVENT_KEY_BITS (a revision keeps its own copy)

_RUN = """(
	id VARCHAR(36) NOT NULL UNIQUE, 
	name VARCHAR(200), 
	status VARCHAR(16) NOT NULL, 
	exit_code INTEGER, 
	reason VARCHAR(80), 
	version INTEGER NOT NULL, 
	event_seq INTEGER NOT NULL, 
	current_attempt_id VARCHAR(36), 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	finished_at_ms BIGINT, 
	deadline_at_ms BIGINT, 
	cancel_reason VARCHAR(16), 
	cancel_requested_at_ms BIGINT, 
	max_attempts INTEGER DEFAULT '1' NOT NULL, 
	timeout_ms BIGINT, 
	run_key INTEGER PRIMARY KEY
)"""

_ATTEMPT = """(
	id VARCHAR(36) NOT NULL, 
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
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES ql_run (id)
)"""

_EVENT = """(
	run_id VARCHAR(36) NOT NULL, 
	seq INTEGER NOT NULL, 
	type VARCHAR(48) NOT NULL, 
	attempt_id VARCHAR(36), 
	status VARCHAR(16), 
	exit_code INTEGER, 
	reason VARCHAR(80), 
	at_ms BIGINT NOT NULL, 
	dedupe_key VARCHAR(160), 
	event_key INTEGER PRIMARY KEY, 
	CHECK (seq BETWEEN 1 AND 1048575 AND (event_key & 1048575) = seq)
)"""

# An event's key never changes (ql never updates one; this refuses anyone else's doing so).
_EVENT_FIXED = ("CREATE TRIGGER ql_event_fixed BEFORE UPDATE OF event_key, run_id, seq ON ql_run_event "
                "BEGIN SELECT RAISE(ABORT, 'ql_run_event: an event''s key does not change'); END")


def _columns(bind, table: str) -> list[str]:
    return [r[1] for r in bind.exec_driver_sql(f'PRAGMA table_info("{table}")').fetchall()]


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    # Every trigger goes first (the tally triggers of ql_log_artifact read ql_run_attempt, and a
    # table cannot be renamed while a trigger names a missing one); the rebuilt tables' own indexes
    # go with them. Both are re-created from their DDL as it was.
    triggers = [r[0] for r in bind.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'trigger' "
                                                   "ORDER BY name").fetchall()]
    indexes = [r[0] for r in bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
        "AND tbl_name IN ('ql_run', 'ql_run_attempt', 'ql_run_event') ORDER BY name").fetchall()]
    for name, in bind.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        op.execute(f'DROP TRIGGER "{name}"')

    runs = ", ".join(_columns(bind, "ql_run"))
    attempts = ", ".join(_columns(bind, "ql_run_attempt"))
    events = _columns(bind, "ql_run_event")
    op.execute(f"CREATE TABLE ql_run_0011 {_RUN}")
    # Keys in creation order: a run's key, like its id, grows with time.
    op.execute(f"INSERT INTO ql_run_0011 ({runs}) SELECT {runs} FROM ql_run ORDER BY created_at_ms, id")
    op.execute(f"CREATE TABLE ql_run_attempt_0011 {_ATTEMPT}")
    op.execute(f"INSERT INTO ql_run_attempt_0011 ({attempts}) SELECT {attempts} FROM ql_run_attempt")
    op.execute(f"CREATE TABLE ql_run_event_0011 {_EVENT}")
    op.execute(f"INSERT INTO ql_run_event_0011 (event_key, {', '.join(events)}) "
               f"SELECT (r.run_key << {_BITS}) + e.seq, {', '.join('e.' + c for c in events)} "
               "FROM ql_run_event e JOIN ql_run_0011 r ON r.id = e.run_id ORDER BY r.run_key, e.seq")
    kept = bind.exec_driver_sql("SELECT count(*) FROM ql_run_event_0011").scalar()
    had = bind.exec_driver_sql("SELECT count(*) FROM ql_run_event").scalar()
    bad = bind.exec_driver_sql(f"SELECT count(*) FROM ql_run_event WHERE seq NOT BETWEEN 1 AND {(1 << _BITS) - 1}"
                               ).scalar()
    if kept != had or bad:
        raise RuntimeError(f"0011: {had - kept} events of no run, {bad} with a seq outside 1..2**{_BITS}-1: "
                           "restore ql.db from a backup")
    # Children before their parent: no row is ever missing its run.
    op.execute("DROP TABLE ql_run_event")
    op.execute("DROP TABLE ql_run_attempt")
    op.execute("DROP TABLE ql_run")
    op.execute("ALTER TABLE ql_run_0011 RENAME TO ql_run")
    op.execute("ALTER TABLE ql_run_attempt_0011 RENAME TO ql_run_attempt")
    op.execute("ALTER TABLE ql_run_event_0011 RENAME TO ql_run_event")
    for sql in indexes + triggers + [_EVENT_FIXED]:
        op.execute(sql)


downgrade = no_downgrade
