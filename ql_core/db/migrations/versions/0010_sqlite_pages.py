"""SQLite: fewer B-trees written per task (issue 25 item 1: disk written per task).

Each B-tree a commit touches costs at least one page in the WAL (and, at the checkpoint, in the
database file). Counted per commit of an awaited ``true`` task (``python bench/wal_pages.py``),
these index entries were written by every task although no statement of the edge-sqlite store
needs them for that task:

- ``ux_ql_event_dedupe`` held a NULL entry for every event (only the cluster's fenced audits set a
  dedupe key, and never on SQLite): now partial, ``WHERE dedupe_key IS NOT NULL`` — the same
  uniqueness for every key that exists, nothing written for the rest.
- ``ix_ql_attempt_deadline`` (status, deadline_at_ms) held every attempt and moved it at every
  status change; the one statement that reads it (due deadlines) compares ``deadline_at_ms <= ?``,
  so it is now partial, ``WHERE deadline_at_ms IS NOT NULL``: a task without a deadline never
  touches it.
- ``ix_ql_journal_state`` (state, attempt_id): no statement of the SQLite store reads it (the
  journal is paged by its key); dropped on SQLite.
- ``ix_ql_log_run`` (run_id): the history purge now finds a run's logs through its attempts'
  ``log_artifact_id`` (``ix_ql_attempt_run``, then the log's key); dropped on SQLite.
- ``ql_run_event``, ``ql_log_artifact`` and ``ql_receipt_journal`` become ``WITHOUT ROWID`` tables
  clustered on their keys ((run_id, seq), id, attempt_id): one B-tree per row written instead of the
  rowid table plus the index of its key, and a run's events side by side. Their rows are small
  (they fit a page's cell without overflow). Every row is copied as it is, the indexes and the
  ql_tally triggers are re-created as they were: every event, log and journal row of an existing
  data dir is kept, and the tallies stay exact. (``ql_run`` and ``ql_run_attempt`` keep their rowid:
  other tables reference them and an attempt's row, with its handles, can outgrow a cell.)

PostgreSQL is not changed (the cluster's queries and audits keep their indexes).

Revision ID: 0010_sqlite_pages
Revises: 0009_sqlite_indexes
"""

from alembic import op

from ql_core.db.sqlite_migration import no_downgrade

revision = "0010_sqlite_pages"
down_revision = "0009_sqlite_indexes"
branch_labels = None
depends_on = None

# The tables rebuilt WITHOUT ROWID, clustered on their key: one B-tree per row written instead of
# the rowid table plus the index of its key. Their columns are unchanged; nothing references them
# but ql_run_event -> ql_run, which is kept.
_REBUILT = {
    "ql_run_event": """(
	run_id VARCHAR(36) NOT NULL, 
	seq INTEGER NOT NULL, 
	type VARCHAR(48) NOT NULL, 
	attempt_id VARCHAR(36), 
	status VARCHAR(16), 
	exit_code INTEGER, 
	reason VARCHAR(80), 
	at_ms BIGINT NOT NULL, 
	dedupe_key VARCHAR(160), 
	PRIMARY KEY (run_id, seq), 
	FOREIGN KEY(run_id) REFERENCES ql_run (id)
) WITHOUT ROWID""",
    "ql_log_artifact": """(
	id VARCHAR(36) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	attempt_id VARCHAR(36) NOT NULL, 
	relative_path VARCHAR(120) NOT NULL, 
	max_bytes BIGINT NOT NULL, 
	size_bytes BIGINT, 
	truncated BOOLEAN NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	deleted_at_ms BIGINT, 
	PRIMARY KEY (id)
) WITHOUT ROWID""",
    "ql_receipt_journal": """(
	attempt_id VARCHAR(36) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	receipt_ref VARCHAR(64) NOT NULL, 
	quarantine_reason VARCHAR(40), 
	registered_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	terminal_seen_at_ms BIGINT, 
	PRIMARY KEY (attempt_id)
) WITHOUT ROWID""",
}


def _rebuild_without_rowid(bind, table: str) -> None:
    """Copy ``table`` into its WITHOUT ROWID twin and put the twin in its place, with the same
    indexes and triggers (their DDL read back from sqlite_master, re-run as it was)."""
    rows = bind.exec_driver_sql("SELECT type, sql FROM sqlite_master WHERE tbl_name = ? "
                                "AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY type, name",
                                (table,)).fetchall()
    columns = ", ".join(r[1] for r in bind.exec_driver_sql(f'PRAGMA table_info("{table}")').fetchall())
    op.execute(f"CREATE TABLE {table}_0010 {_REBUILT[table]}")
    op.execute(f"INSERT INTO {table}_0010 ({columns}) SELECT {columns} FROM {table}")
    op.execute(f"DROP TABLE {table}")  # its indexes and triggers go with it
    op.execute(f"ALTER TABLE {table}_0010 RENAME TO {table}")
    for _kind, sql in rows:
        op.execute(sql)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    op.drop_index("ix_ql_journal_state", table_name="ql_receipt_journal")
    op.drop_index("ix_ql_log_run", table_name="ql_log_artifact")
    op.drop_index("ix_ql_attempt_deadline", table_name="ql_run_attempt")
    op.execute("CREATE INDEX ix_ql_attempt_deadline ON ql_run_attempt (status, deadline_at_ms) "
               "WHERE deadline_at_ms IS NOT NULL")
    op.drop_index("ux_ql_event_dedupe", table_name="ql_run_event")
    op.execute("CREATE UNIQUE INDEX ux_ql_event_dedupe ON ql_run_event (dedupe_key) WHERE dedupe_key IS NOT NULL")
    for table in _REBUILT:
        _rebuild_without_rowid(bind, table)


downgrade = no_downgrade
