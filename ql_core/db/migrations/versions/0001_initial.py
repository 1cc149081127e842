"""Initial schema: runs, attempts, events, log artifacts, receipt journal, cancel dispatch.

Revision ID: 0001_initial
Revises:
"""

from alembic import op
import sqlalchemy as sa

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('ql_cancel_dispatch',
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('attempt_id', sa.String(length=36), nullable=False),
    sa.Column('reason', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('outcome', sa.String(length=24), nullable=True),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('tries', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('term_sent_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('kill_sent_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('run_id')
    )
    op.create_index('ix_ql_dispatch_due', 'ql_cancel_dispatch', ['state', 'next_attempt_at_ms'], unique=False)
    op.create_table('ql_log_artifact',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('attempt_id', sa.String(length=36), nullable=False),
    sa.Column('relative_path', sa.String(length=120), nullable=False),
    sa.Column('max_bytes', sa.BigInteger(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=True),
    sa.Column('truncated', sa.Boolean(), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('deleted_at_ms', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_ql_log_created', 'ql_log_artifact', ['created_at_ms'], unique=False)
    op.create_table('ql_receipt_journal',
    sa.Column('attempt_id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('receipt_ref', sa.String(length=64), nullable=False),
    sa.Column('quarantine_reason', sa.String(length=40), nullable=True),
    sa.Column('registered_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('terminal_seen_at_ms', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('attempt_id')
    )
    op.create_index('ix_ql_journal_state', 'ql_receipt_journal', ['state', 'attempt_id'], unique=False)
    op.create_table('ql_run',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('reason', sa.String(length=80), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('event_seq', sa.Integer(), nullable=False),
    sa.Column('current_attempt_id', sa.String(length=36), nullable=True),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('finished_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('deadline_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('cancel_reason', sa.String(length=16), nullable=True),
    sa.Column('cancel_requested_at_ms', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_ql_run_created', 'ql_run', ['created_at_ms'], unique=False)
    op.create_index('ix_ql_run_status', 'ql_run', ['status'], unique=False)
    op.create_table('ql_run_attempt',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('attempt_no', sa.Integer(), nullable=False),
    sa.Column('executor_type', sa.String(length=64), nullable=False),
    sa.Column('runtime_owner', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('reason', sa.String(length=80), nullable=True),
    sa.Column('log_artifact_id', sa.String(length=36), nullable=False),
    sa.Column('callback_token_hash', sa.String(length=64), nullable=False),
    sa.Column('callback_sequence', sa.Integer(), nullable=False),
    sa.Column('deadline_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('started_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('finished_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('boot_id', sa.String(length=64), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('pgid', sa.Integer(), nullable=True),
    sa.Column('process_start_time', sa.BigInteger(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['ql_run.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_ql_attempt_active', 'ql_run_attempt', ['runtime_owner', 'status', 'id'], unique=False)
    op.create_index('ix_ql_attempt_deadline', 'ql_run_attempt', ['status', 'deadline_at_ms'], unique=False)
    op.create_index('ix_ql_attempt_run', 'ql_run_attempt', ['run_id'], unique=False)
    op.create_table('ql_run_event',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=48), nullable=False),
    sa.Column('attempt_id', sa.String(length=36), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('reason', sa.String(length=80), nullable=True),
    sa.Column('at_ms', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['ql_run.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'seq', name='uq_ql_run_event_seq')
    )


def downgrade() -> None:
    op.drop_table('ql_run_event')
    op.drop_index('ix_ql_attempt_run', table_name='ql_run_attempt')
    op.drop_index('ix_ql_attempt_deadline', table_name='ql_run_attempt')
    op.drop_index('ix_ql_attempt_active', table_name='ql_run_attempt')
    op.drop_table('ql_run_attempt')
    op.drop_index('ix_ql_run_status', table_name='ql_run')
    op.drop_index('ix_ql_run_created', table_name='ql_run')
    op.drop_table('ql_run')
    op.drop_index('ix_ql_journal_state', table_name='ql_receipt_journal')
    op.drop_table('ql_receipt_journal')
    op.drop_index('ix_ql_log_created', table_name='ql_log_artifact')
    op.drop_table('ql_log_artifact')
    op.drop_index('ix_ql_dispatch_due', table_name='ql_cancel_dispatch')
    op.drop_table('ql_cancel_dispatch')
