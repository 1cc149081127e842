"""History at O(work): indexes that serve every statement of a round, and running totals.

Before this revision a supervisor round cost O(history): log retention walked every ended attempt,
the history check read ``history_max_runs`` index entries (``OFFSET``), ``ql_log_artifact`` had no
index on ``run_id`` (two full scans per purged run) and ``ql list --status S`` sorted every run in
that state. See docs/recovery.md "Cost of a round".

Both dialects:
- ``ix_ql_run_created`` becomes ``(created_at_ms, id)`` and ``ix_ql_run_status`` becomes
  ``(status, created_at_ms, id)``: newest/oldest n runs (of one state) read in index order;
- ``ix_ql_run_ended``: ended runs by ``(finished_at_ms, id)``, partial (history retention by age);
- ``ix_ql_attempt_run`` becomes ``(run_id, attempt_no)``; ``ix_ql_attempt_live``: starting/running
  attempts by ``(runtime_owner, id)``, partial (the recovery page);
- ``ix_ql_log_run`` (purge), ``ix_ql_log_unsized`` (partial: logs not sized yet — running ones and
  ended ones whose sizing a crash interrupted) and ``ix_ql_log_kept`` (partial: undeleted logs by
  age) replace ``ix_ql_log_created``.

SQLite only (the edge-sqlite store's retention reads them; the PostgreSQL store has no history
retention of its own):
- ``ql_tally`` (name, value) with ``runs`` = rows of ``ql_run`` and ``log_bytes:<owner>`` = recorded
  sizes of that node's undeleted logs, kept exact by triggers on every insert, update and delete —
  filled once here from the existing rows.

Nothing is deleted or rewritten: every run of an existing data dir is kept.

Revision ID: 0007_history
Revises: 0003_cluster_control
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_history"
down_revision = "0003_cluster_control"  # 0004-0006 are the cluster plugin's branch
branch_labels = None
depends_on = None

_ENDED = "status IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'lost')"
_ACTIVE = "status IN ('starting', 'running')"
_UNSIZED = "size_bytes IS NULL AND deleted_at_ms IS NULL"
_KEPT = "deleted_at_ms IS NULL"


def _partial(where: str) -> dict[str, object]:
    return {"sqlite_where": sa.text(where), "postgresql_where": sa.text(where)}


def upgrade() -> None:
    op.drop_index("ix_ql_run_created", table_name="ql_run")
    op.create_index("ix_ql_run_created", "ql_run", ["created_at_ms", "id"])
    op.drop_index("ix_ql_run_status", table_name="ql_run")
    op.create_index("ix_ql_run_status", "ql_run", ["status", "created_at_ms", "id"])
    op.create_index("ix_ql_run_ended", "ql_run", ["finished_at_ms", "id"], **_partial(_ENDED))
    op.drop_index("ix_ql_attempt_run", table_name="ql_run_attempt")
    op.create_index("ix_ql_attempt_run", "ql_run_attempt", ["run_id", "attempt_no"])
    op.create_index("ix_ql_attempt_live", "ql_run_attempt", ["runtime_owner", "id"], **_partial(_ACTIVE))
    op.drop_index("ix_ql_log_created", table_name="ql_log_artifact")
    op.create_index("ix_ql_log_run", "ql_log_artifact", ["run_id"])
    op.create_index("ix_ql_log_unsized", "ql_log_artifact", ["id"], **_partial(_UNSIZED))
    op.create_index("ix_ql_log_kept", "ql_log_artifact", ["created_at_ms", "id"], **_partial(_KEPT))
    if op.get_bind().dialect.name == "sqlite":
        for statement in SQLITE_TALLY:
            op.execute(statement)


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


#: A log's share of its owner's total: its recorded size while it is not deleted.
_SHARE = "(CASE WHEN {r}.deleted_at_ms IS NULL THEN COALESCE({r}.size_bytes, 0) ELSE 0 END)"
# An upsert fed by a SELECT needs a WHERE (SQLite's parser); the owner comes from the log's attempt,
# which a purge deletes after the log (statements.PURGE_*), so it is always there to read.
_ADD_TO_OWNER = ("INSERT INTO ql_tally (name, value) SELECT 'log_bytes:' || a.runtime_owner, {delta} "
                 "FROM ql_run_attempt a WHERE a.id = {r}.attempt_id "
                 "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value;")

SQLITE_TALLY = (
    "CREATE TABLE ql_tally (name VARCHAR(80) NOT NULL PRIMARY KEY, value BIGINT NOT NULL)",
    "INSERT INTO ql_tally (name, value) SELECT 'runs', COUNT(*) FROM ql_run",
    "INSERT INTO ql_tally (name, value) SELECT 'log_bytes:' || a.runtime_owner, SUM(l.size_bytes) "
    "FROM ql_log_artifact l JOIN ql_run_attempt a ON a.id = l.attempt_id "
    "WHERE l.deleted_at_ms IS NULL AND l.size_bytes IS NOT NULL GROUP BY a.runtime_owner",
    "CREATE TRIGGER ql_tally_run_insert AFTER INSERT ON ql_run BEGIN "
    "UPDATE ql_tally SET value = value + 1 WHERE name = 'runs'; END",
    "CREATE TRIGGER ql_tally_run_delete AFTER DELETE ON ql_run BEGIN "
    "UPDATE ql_tally SET value = value - 1 WHERE name = 'runs'; END",
    "CREATE TRIGGER ql_tally_log_update AFTER UPDATE OF size_bytes, deleted_at_ms ON ql_log_artifact "
    f"WHEN {_SHARE.format(r='NEW')} != {_SHARE.format(r='OLD')} BEGIN "
    + _ADD_TO_OWNER.format(delta=f"{_SHARE.format(r='NEW')} - {_SHARE.format(r='OLD')}", r="NEW") + " END",
    "CREATE TRIGGER ql_tally_log_delete AFTER DELETE ON ql_log_artifact "
    f"WHEN {_SHARE.format(r='OLD')} != 0 BEGIN "
    + _ADD_TO_OWNER.format(delta=f"-{_SHARE.format(r='OLD')}", r="OLD") + " END",
)
