"""Plugin seams: the executor's handle becomes one opaque column; events are keyed by (run_id, seq).

- ``ql_run_attempt.executor_type`` becomes ``executor`` (the registered executor name). Every row
  written before this revision was started by the one built-in executor, now registered as
  ``local``.
- Its durable handle moves from four columns (boot id, pid, pgid, start time) into ``handle``, the
  JSON document that executor reads back (core never parses it); ``host_handle`` is new.
- ``ql_run_event`` loses its surrogate id: ``(run_id, seq)`` is the primary key.
- ``ix_ql_run_finished`` serves bounded history retention (oldest terminal runs first).

Revision ID: 0002_plugin_seams
Revises: 0001_initial
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0002_plugin_seams"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

_EVENT_COLUMNS = "run_id, seq, type, attempt_id, status, exit_code, reason, at_ms"


def _event_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("type", sa.String(length=48), nullable=False),
        sa.Column("attempt_id", sa.String(length=36), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=80), nullable=True),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["ql_run.id"]),
        sa.PrimaryKeyConstraint("run_id", "seq"),
    )


def upgrade() -> None:
    with op.batch_alter_table("ql_run_attempt") as batch:
        batch.add_column(sa.Column("handle", sa.String(length=512), nullable=True))
        batch.add_column(sa.Column("host_handle", sa.String(length=512), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, boot_id, pid, pgid, process_start_time FROM ql_run_attempt "
                                "WHERE pid IS NOT NULL")).all()
    for attempt_id, boot_id, pid, pgid, start_time in rows:
        handle = json.dumps({"boot_id": boot_id, "pid": pid, "pgid": pgid, "start_time": start_time},
                            separators=(",", ":"))
        conn.execute(sa.text("UPDATE ql_run_attempt SET handle = :h WHERE id = :id"),
                     {"h": handle, "id": attempt_id})
    with op.batch_alter_table("ql_run_attempt") as batch:
        batch.alter_column("executor_type", new_column_name="executor", existing_type=sa.String(length=64),
                           existing_nullable=False)
        for column in ("boot_id", "pid", "pgid", "process_start_time"):
            batch.drop_column(column)
    conn.execute(sa.text("UPDATE ql_run_attempt SET executor = 'local'"))

    _event_table("ql_run_event_v2")
    conn.execute(sa.text(f"INSERT INTO ql_run_event_v2 ({_EVENT_COLUMNS}) "
                         f"SELECT {_EVENT_COLUMNS} FROM ql_run_event"))
    op.drop_table("ql_run_event")
    op.rename_table("ql_run_event_v2", "ql_run_event")

    op.create_index("ix_ql_run_finished", "ql_run", ["status", "finished_at_ms"], unique=False)


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")
