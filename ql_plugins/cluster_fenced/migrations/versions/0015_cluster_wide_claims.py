"""Cluster: a claim may take up to 32 runs (was 8), and costs one statement less per run.

PostgreSQL only (no table, column, index or row changes; ``ql_claim`` keeps its signature, owner and
grants — ``CREATE OR REPLACE``):

A batch's fixed cost does not shrink with the batch: its commit's WAL flush, the executor start of
each statement, the function's settings. Measured per call on the protocol bench's loop (claim,
``ql_start_many``, ``ql_running_many``, ``ql_complete_many``; one client; backend CPU from /proc):
about 0.27 ms of PostgreSQL CPU per call whatever its size, and 0.245 ms per completed run on top.
With 8 runs per claim half of a completion's backend CPU was the four calls' fixed cost. The batched
functions take up to 256 calls (``MAX_BATCH``); only ``ql_claim`` stopped at 8. A worker with more
free slots (``claim_batch``, the bench's protocol clients) now claims up to 32 per call — a worker
still never claims more than it asks for nor more than its free slots, and a worker that asks for 8
or fewer is answered exactly as before.

The same statement, 0012's, with:

- the cap 32 (and ``ROWS 32``, the planner's estimate of the answer);
- each claimed run's earlier attempts read once for both numbers it needs (the new attempt's number
  and the sealed copy's ordinal: ``max(attempt_no)`` and the count of attempts that may have started,
  0005's rule), where 0012 read them twice — the second time through ``ql__attempts_used``, a PL/pgSQL
  call running its own statement per claimed run (the function stays, unchanged, for its other callers);
- the ids a claim may use checked in one statement instead of one statement per id (same ids, same
  error).

The checks, the queue scan (``ql__queued_runs``, oldest first, ``SKIP LOCKED``), the lock order (runs,
then the worker ``FOR SHARE``), the rows written and the answers are 0012's. See docs/cluster.md.

Revision ID: 0015_cluster_wide_claims
Revises: 0014_cluster_one_search_path
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, execute_pinned_statements, split_statements

revision = "0015_cluster_wide_claims"
down_revision = "0014_cluster_one_search_path"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    execute_pinned_statements(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


_CLAIM = r"""
CREATE OR REPLACE FUNCTION ql_claim(p_worker_id text, p_generation bigint, p_session text, p_max_n integer,
                                    p_free_slots integer, p_executor text, p_attempt_ids text[],
                                    p_log_ids text[], p_lease_ttl_ms bigint)
RETURNS TABLE(answer text, run_id text, attempt_id text, attempt_no integer, lease_generation bigint,
              lease_token text, spec_key_id text, spec_ordinal integer, sealed_spec bytea, timeout_ms bigint,
              lease_expires_at_ms bigint, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 32 SET search_path = pg_catalog, public
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_n integer;
  v_run_ids text[];
  v_ok boolean;
BEGIN
  PERFORM ql__check(p_lease_ttl_ms BETWEEN 1000 AND 3600000, 'lease_ttl_ms');
  PERFORM ql__check(length(p_executor) BETWEEN 1 AND 64, 'executor');
  PERFORM ql__check(coalesce(array_length(p_attempt_ids, 1), 0) = coalesce(array_length(p_log_ids, 1), 0),
                    'attempt_ids/log_ids');
  v_n := least(coalesce(p_max_n, 0), coalesce(p_free_slots, 0), 32, coalesce(array_length(p_attempt_ids, 1), 0));
  -- Every id the claim may use, in one statement (0012: one statement per id).
  PERFORM ql__check(coalesce(bool_and(ql__is_id(p_attempt_ids[k.i]) AND ql__is_id(p_log_ids[k.i])), true),
                    'attempt_ids/log_ids')
     FROM generate_series(1, greatest(v_n, 0)) AS k(i);
  -- Cheap unlocked check first: a fenced worker locks nothing.
  SELECT (w.generation = p_generation AND w.session = p_session AND w.lease_expires_at_ms > ql__clock_ms())
    INTO v_ok FROM ql_worker w WHERE w.id = p_worker_id;
  IF v_ok IS NOT TRUE THEN
    answer := 'fenced'; db_now_ms := ql__clock_ms(); RETURN NEXT; RETURN;
  END IF;
  IF v_n <= 0 THEN RETURN; END IF;
  v_run_ids := ql__queued_runs(v_n);
  -- Lock order: runs, then the worker (FOR SHARE: registration waits for this claim to commit).
  SELECT (w.generation = p_generation AND w.session = p_session AND w.lease_expires_at_ms > ql__clock_ms())
    INTO v_ok FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  IF v_ok IS NOT TRUE THEN
    answer := 'fenced'; db_now_ms := v_now; RETURN NEXT; RETURN;
  END IF;
  -- Oldest first, as locked: attempt ids (and lease generations) are handed out in that order.
  RETURN QUERY
  WITH picked AS (
    SELECT k.i, r.id AS run, r.event_seq, r.timeout_ms AS timeout, p_attempt_ids[k.i] AS attempt,
           p_log_ids[k.i] AS log, ql__new_token() AS token,
           n.no, n.copy
      FROM unnest(v_run_ids) WITH ORDINALITY AS k(id, i)
      JOIN ql_run r ON r.id = k.id
      -- One read of the run's earlier attempts for both numbers (0012 read them twice, the second
      -- time through ql__attempts_used: a PL/pgSQL call and its own statement per claimed run).
      -- 0005: the n-th attempt that may start gets sealed copy n (counted before it exists).
      CROSS JOIN LATERAL (
        SELECT coalesce(max(a.attempt_no), 0) + 1 AS no,
               (count(*) FILTER (WHERE coalesce(a.reason, '') NOT IN ('CLAIM_EXPIRED', 'RELEASED')))::integer + 1
                 AS copy
          FROM ql_run_attempt a WHERE a.run_id = r.id) n
     ORDER BY k.i
  ), g AS (
    SELECT p.*, ql__digest(p.token) AS digest, nextval('ql_lease_generation_seq') AS gen FROM picked p
  ), att AS (
    INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, exit_code, reason,
                                log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms,
                                created_at_ms, started_at_ms, finished_at_ms, handle, host_handle, version)
    SELECT g.attempt, g.run, g.no, p_executor, p_worker_id, 'starting', NULL, NULL, g.log, g.digest, 0, NULL,
           v_now, NULL, NULL, NULL, NULL, 1
      FROM g
  ), lease AS (
    INSERT INTO ql_attempt_lease (attempt_id, run_id, status, version, lease_generation, token_digest,
                                  worker_id, worker_generation, expires_at_ms, claimed_at_ms)
    SELECT g.attempt, g.run, 'claimed', 1, g.gen, g.digest, p_worker_id, p_generation, v_now + p_lease_ttl_ms, v_now
      FROM g
  ), ev AS (
    INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, exit_code, reason, at_ms)
    SELECT g.run, g.event_seq + 1, 'attempt.claimed', g.attempt, 'starting', NULL, NULL, v_now FROM g
  ), upd AS (
    UPDATE ql_run r SET status = 'running', current_attempt_id = g.attempt, deadline_at_ms = NULL,
           updated_at_ms = v_now, version = r.version + 1, event_seq = r.event_seq + 1
      FROM g WHERE r.id = g.run
  )
  SELECT 'claimed'::text, g.run::text, g.attempt, g.no, g.gen, g.token, s.key_id::text, s.ordinal, s.sealed,
         g.timeout, v_now + p_lease_ttl_ms, v_now
    FROM g LEFT JOIN ql_run_spec s ON s.run_id = g.run AND s.ordinal = g.copy
   ORDER BY g.i;
END $$;
"""

SQL_STATEMENTS = split_statements(_CLAIM, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
