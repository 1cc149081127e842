"""Cluster hardening: sealed task specs and functions a least-privilege worker role may call.

PostgreSQL only (nothing changes on SQLite):

- ``ql_run_spec`` holds SEALED specs only: one AES-GCM copy per attempt the run's retry policy
  allows (``ordinal`` 1..max_attempts), its key id and the ciphertext; never a command, cwd or
  environment in clear (ql_plugins/cluster_fenced/sealing.py says how they are bound to the run and
  the attempt). The plaintext table of 0003 is dropped. A run still queued for workers with a
  plaintext spec cannot be sealed here (the database never has the key): it ends ``failed`` with
  reason ``SPEC_NOT_SEALED`` and its events — resubmit it after the upgrade (drain the queue first
  to avoid this, docs/cluster.md).
- ``ql_submit(run_id, name, key_id, sealed bytea[], timeout_ms, max_attempts)`` replaces the jsonb
  one; ``ql_claim`` returns ``spec_key_id, spec_ordinal, sealed_spec`` (copy n for the n-th attempt
  that may start — never-started attempts do not count, exactly as for retries) instead of ``spec``.
- Erasure: a copy is deleted when the attempt that used it ends after it may have started
  (``ql__lose`` requeue path), every copy when the run ends (``ql__finish``, cancel of a queued run,
  the sweeper's retention — unchanged: they delete ``ql_run_spec`` rows of the run).
- Every public ``ql_*`` function but the pure ``ql_map_outcome`` becomes ``SECURITY DEFINER`` with
  ``search_path`` pinned to the schema ql lives in (then ``pg_temp``), and EXECUTE on every ``ql``
  function is revoked from PUBLIC: a role may call only what ``ql db grant-worker`` (or an admin)
  grants it. The functions were written for this since 0003: unqualified names, no dynamic SQL,
  errors never echo a value.

Revision ID: 0005_worker_role
Revises: 0004_cluster_worker
"""

import sqlalchemy as sa
from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, execute_statements, split_statements

revision = "0005_worker_role"
down_revision = "0004_cluster_worker"
branch_labels = None
depends_on = None

#: Public functions that run with their owner's rights (pinned search_path). ql_map_outcome is pure.
DEFINER_FUNCTIONS = ("ql_submit", "ql_request_cancel", "ql_sweep", "ql_register", "ql_heartbeat",
                     "ql_deregister", "ql_claim", "ql_start", "ql_running", "ql_renew", "ql_complete",
                     "ql_end_without_completion")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    cursor = op.get_bind().connection.dbapi_connection.cursor()
    try:
        # Before the plaintext table goes: runs queued for workers with a clear spec end, audited.
        cursor.execute(_FAIL_PLAINTEXT_QUEUED)
        cursor.execute("DROP TABLE ql_run_spec")
    finally:
        cursor.close()
    op.create_table(
        "ql_run_spec",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["ql_run.id"]),
        sa.PrimaryKeyConstraint("run_id", "ordinal"),
    )
    execute_statements(op, SQL_STATEMENTS)


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


_FAIL_PLAINTEXT_QUEUED = r"""
DO $$
DECLARE
  v_run ql_run%ROWTYPE;
  v_now bigint := ql__clock_ms();
BEGIN
  FOR v_run IN SELECT r.* FROM ql_run r JOIN ql_run_spec s ON s.run_id = r.id
                WHERE r.status = 'queued' AND r.current_attempt_id IS NULL FOR UPDATE OF r LOOP
    PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'run.failed', NULL, 'failed', NULL, 'SPEC_NOT_SEALED', v_now);
    UPDATE ql_run SET status = 'failed', reason = 'SPEC_NOT_SEALED', finished_at_ms = greatest(v_now, created_at_ms),
           updated_at_ms = v_now, version = version + 1, event_seq = event_seq + 1
     WHERE id = v_run.id;
  END LOOP;
END $$
"""

_SUBMIT = r"""
DROP FUNCTION ql_submit(text, text, jsonb, bigint, integer);

-- Control side: insert a queued run and its SEALED spec (one copy per allowed attempt, ordinal =
-- array index). Idempotent on run id ('exists'). The database never sees the spec in clear.
CREATE FUNCTION ql_submit(p_run_id text, p_name text, p_key_id text, p_sealed bytea[], p_timeout_ms bigint,
                          p_max_attempts integer,
                          OUT answer text, OUT created_at_ms bigint, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_i integer;
BEGIN
  PERFORM ql__check(ql__is_id(p_run_id), 'run_id');
  PERFORM ql__check(p_name IS NULL OR length(p_name) <= 200, 'name');
  PERFORM ql__check(p_timeout_ms IS NULL OR p_timeout_ms > 0, 'timeout_ms');
  PERFORM ql__check(p_max_attempts BETWEEN 1 AND 100, 'max_attempts');
  PERFORM ql__check(p_key_id ~ '^[0-9a-f]{16}$', 'key_id');
  PERFORM ql__check(array_ndims(p_sealed) = 1 AND array_length(p_sealed, 1) = p_max_attempts
                    AND array_lower(p_sealed, 1) = 1, 'sealed');
  FOR v_i IN 1 .. p_max_attempts LOOP
    -- nonce (12) + tag (16) + at most 128 KiB of spec
    PERFORM ql__check(octet_length(p_sealed[v_i]) BETWEEN 28 AND 131100, 'sealed');
  END LOOP;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  INSERT INTO ql_run (id, name, status, exit_code, reason, version, event_seq, current_attempt_id,
                      created_at_ms, updated_at_ms, finished_at_ms, deadline_at_ms, cancel_reason,
                      cancel_requested_at_ms, max_attempts, timeout_ms)
  VALUES (p_run_id, p_name, 'queued', NULL, NULL, 1, 1, NULL, v_now, v_now, NULL, NULL, NULL, NULL,
          p_max_attempts, p_timeout_ms)
  ON CONFLICT (id) DO NOTHING;
  IF NOT FOUND THEN
    answer := 'exists';
    SELECT r.created_at_ms INTO created_at_ms FROM ql_run r WHERE r.id = p_run_id;
    RETURN;
  END IF;
  INSERT INTO ql_run_spec (run_id, ordinal, key_id, sealed, created_at_ms)
  SELECT p_run_id, i, p_key_id, p_sealed[i], v_now FROM generate_series(1, p_max_attempts) AS i;
  PERFORM ql__event(p_run_id, 1, 'run.created', NULL, 'queued', NULL, NULL, v_now);
  answer := 'created';
  created_at_ms := v_now;
END $$;
"""

def _sibling(name: str):  # type: ignore[no-untyped-def]
    """An earlier revision's module, loaded from its file (the bodies this one amends, verbatim):
    this branch's, or core's (0003 stays in core: it also added ql_run's columns)."""
    import importlib.util
    from importlib import resources
    from pathlib import Path

    path = Path(__file__).with_name(f"{name}.py")
    if not path.exists():
        path = Path(str(resources.files("ql_core.db") / "migrations" / "versions" / f"{name}.py"))
    spec = importlib.util.spec_from_file_location(f"_ql_rev_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_LOSE_ERASE = (
    "    UPDATE ql_attempt_lease SET status = 'ended', ended_at_ms = p_now, end_reason = p_end_reason,\n"
    "           version = version + 1\n"
    "     WHERE attempt_id = p_attempt_id AND status <> 'ended';\n"
    "    RETURN 'requeued';\n")


def _lose() -> str:
    """0003's ql__lose, plus: the requeue path erases the copies of every ordinal already used."""
    base = _sibling("0003_cluster_control")
    block = base._TRANSITIONS
    start = block.index("CREATE FUNCTION ql__lose")
    end = block.index("-- The fence of a per-attempt call")
    body = block[start:end]
    assert _LOSE_ERASE in body, "0003's ql__lose changed: update 0005"
    erase = ("    -- 0005: the lost attempt's sealed copy (and any earlier ordinal's) is erased now.\n"
             "    DELETE FROM ql_run_spec s WHERE s.run_id = p_run_id AND s.ordinal <= ql__attempts_used(p_run_id);\n")
    return body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
        _LOSE_ERASE, _LOSE_ERASE.replace("    RETURN 'requeued';\n", erase + "    RETURN 'requeued';\n"))


def _claim() -> str:
    """0004's ql_claim, returning the sealed copy of the attempt's ordinal instead of a jsonb spec."""
    base = _sibling("0004_cluster_worker")
    body = base._CLAIM
    swaps = [
        ("CREATE OR REPLACE FUNCTION ql_claim",
         "DROP FUNCTION ql_claim(text, bigint, text, integer, integer, text, text[], text[], bigint);\n\n"
         "CREATE FUNCTION ql_claim"),
        ("lease_token text, spec jsonb, timeout_ms bigint,",
         "lease_token text, spec_key_id text, spec_ordinal integer, sealed_spec bytea, timeout_ms bigint,"),
        ("  v_ok boolean;\n", "  v_ok boolean;\n  v_ord integer;\n"),
        ("    v_gen := nextval('ql_lease_generation_seq');\n",
         "    v_gen := nextval('ql_lease_generation_seq');\n"
         "    -- 0005: the n-th attempt that may start gets sealed copy n (counted before it exists).\n"
         "    v_ord := ql__attempts_used(v_run.id) + 1;\n"),
        ("    SELECT s.spec INTO spec FROM ql_run_spec s WHERE s.run_id = v_run.id;\n",
         "    SELECT s.key_id, s.ordinal, s.sealed INTO spec_key_id, spec_ordinal, sealed_spec\n"
         "      FROM ql_run_spec s WHERE s.run_id = v_run.id AND s.ordinal = v_ord;\n"),
    ]
    for old, new in swaps:
        assert body.count(old) == 1, f"0004's ql_claim changed near {old[:40]!r}: update 0005"
        body = body.replace(old, new)
    return body


# Every public function except the pure ql_map_outcome runs as its owner with a pinned search_path
# (the schema ql was migrated into, then pg_temp so that no temporary object can shadow a table);
# nobody but the owner may execute any ql function until it is granted (ql db grant-worker).
_DEFINER = r"""
DO $$
DECLARE
  v_fn regprocedure;
BEGIN
  FOR v_fn IN SELECT p.oid::regprocedure FROM pg_proc p
               WHERE p.pronamespace = current_schema()::regnamespace
                 AND p.proname = ANY (ARRAY[%s]) LOOP
    EXECUTE format('ALTER FUNCTION %%s SECURITY DEFINER SET search_path = %%I, pg_temp', v_fn, current_schema());
  END LOOP;
END $$
""" % ", ".join(f"'{name}'" for name in DEFINER_FUNCTIONS)


#: Executed in order by :func:`upgrade` on PostgreSQL (after the new ql_run_spec exists).
SQL_STATEMENTS = split_statements(_SUBMIT, _claim(), _lose(), _DEFINER, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
