"""Cluster logs: a task that printed nothing costs the artifact store no call of its own.

PostgreSQL only (no table, column or index change). One new fenced worker function,
``ql_artifact_empty_many``: for each of up to 256 attempts, record its log as a FINALIZED artifact of
0 bytes (the empty file's SHA-256) — what ``ql_artifact_open`` followed by an empty
``ql_artifact_finalize`` leaves, with the same proof (``ql__artifact_proof``, 0006) checked for each.

The worker calls it in the transaction (and round trip) of the completions it sends anyway, for the
attempts whose local log is final and empty (their attempt ended locally, nothing was written) and
whose artifact its log shipper has not opened. Before this revision every such task cost the worker's
log shipper an open and a finalize (a share of two batched calls: their round trips, commits and
per-statement work, ~0.6 ms of worker + backend CPU per task measured at 8f33c95). Readers
(``ql logs``, ``ql logs -f``, ``ql run``'s stream, the web host) see what they saw before: a
finalized 0-byte artifact, committed with (not after) the run's end.

Per attempt, under the artifact's row lock:

- no artifact yet: it is created final, 0 bytes (``finalized``), and readers are notified
  (``NOTIFY ql_artifact``; 0006's trigger fires on UPDATE only);
- an open artifact with no byte and no chunk (the shipper opened it while the task ran): finalized
  (``finalized``; 0006's trigger notifies);
- a final artifact of 0 bytes with the empty SHA-256: ``already_finalized`` (a replay);
- anything else (bytes were shipped, another length): ``mismatch`` — nothing written, the shipper
  goes on as before;
- a proof that does not hold: ``fenced`` with the reason (nothing written).

Revision ID: 0016_cluster_empty_logs
Revises: 0015_cluster_wide_claims
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, no_downgrade, split_statements, upgrade_functions

revision = "0016_cluster_empty_logs"
down_revision = "0015_cluster_wide_claims"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_functions(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


downgrade = no_downgrade


_EMPTY_MANY = r"""
CREATE FUNCTION ql_artifact_empty_many(p_worker_id text[], p_worker_generation bigint[], p_session text[],
                                       p_attempt_id text[], p_lease_generation bigint[], p_lease_token text[],
                                       p_max_bytes bigint)
RETURNS TABLE (ord integer, answer text, fence_reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
  v_art ql_artifact%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_now bigint;
  v_n integer;
  v_reason text;
  v_empty constant text := 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';
BEGIN
  v_n := coalesce(cardinality(p_attempt_id), 0);
  PERFORM ql__check(v_n <= 256 AND coalesce(cardinality(p_worker_id), 0) = v_n
                    AND coalesce(cardinality(p_worker_generation), 0) = v_n
                    AND coalesce(cardinality(p_session), 0) = v_n
                    AND coalesce(cardinality(p_lease_generation), 0) = v_n
                    AND coalesce(cardinality(p_lease_token), 0) = v_n, 'calls');
  PERFORM ql__check(p_max_bytes BETWEEN 0 AND 1099511627776, 'max_bytes');
  v_now := ql__clock_ms();
  FOR i IN 1 .. v_n LOOP
    PERFORM ql__check(ql__is_id(p_attempt_id[i]), 'attempt_id');
    ord := i;
    answer := NULL;
    SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id[i] FOR NO KEY UPDATE;
    v_reason := ql__artifact_proof(v_art, p_worker_id[i], p_worker_generation[i], p_session[i], p_attempt_id[i],
                                   p_lease_generation[i], ql__digest(p_lease_token[i]), v_now);
    fence_reason := v_reason;
    IF v_reason IS NOT NULL THEN
      answer := 'fenced';
    ELSIF v_art.attempt_id IS NULL THEN
      SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id[i];
      INSERT INTO ql_artifact (attempt_id, run_id, worker_id, worker_generation, lease_generation, token_digest,
                               max_bytes, committed_bytes, chunk_count, status, total_bytes, sha256,
                               created_at_ms, updated_at_ms, finalized_at_ms)
      VALUES (p_attempt_id[i], v_lease.run_id, v_lease.worker_id, v_lease.worker_generation,
              v_lease.lease_generation, v_lease.token_digest, p_max_bytes, 0, 0, 'final', 0, v_empty,
              v_now, v_now, v_now)
      ON CONFLICT (attempt_id) DO NOTHING;
      IF FOUND THEN
        PERFORM pg_notify('ql_artifact', p_attempt_id[i]);
        answer := 'finalized';
      ELSE
        -- The shipper opened it meanwhile: decide on that row, locked.
        SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id[i] FOR NO KEY UPDATE;
      END IF;
    END IF;
    IF answer IS NULL THEN
      IF v_art.status = 'final' THEN
        answer := CASE WHEN v_art.total_bytes = 0 AND v_art.sha256 = v_empty
                       THEN 'already_finalized' ELSE 'mismatch' END;
      ELSIF v_art.committed_bytes = 0 AND v_art.chunk_count = 0 THEN
        UPDATE ql_artifact a SET status = 'final', total_bytes = 0, sha256 = v_empty,
               finalized_at_ms = v_now, updated_at_ms = v_now
         WHERE a.attempt_id = p_attempt_id[i];
        answer := 'finalized';
      ELSE
        answer := 'mismatch';
      END IF;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;
"""

SQL_STATEMENTS = split_statements(_EMPTY_MANY, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
