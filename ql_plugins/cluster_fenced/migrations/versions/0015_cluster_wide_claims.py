"""Cluster: a claim may take up to 64 runs (was 8), and the protocol's functions make fewer calls per run.

PostgreSQL only (no table, column, index or row changes; ``ql_claim``, ``ql_complete_many`` and
``ql__fence`` keep their signatures, owners and grants — ``CREATE OR REPLACE``):

A batch's fixed cost does not shrink with the batch: its commit's WAL flush, the executor start of
each statement, the function's settings. Measured per call on the protocol bench's loop (claim,
``ql_start_many``, ``ql_running_many``, ``ql_complete_many``; one client; backend CPU from /proc):
about 0.27 ms of PostgreSQL CPU per call whatever its size, and 0.245 ms per completed run on top.
With 8 runs per claim half of a completion's backend CPU was the four calls' fixed cost. The batched
functions take up to 256 calls (``MAX_BATCH``); only ``ql_claim`` stopped at 8. A worker with more
free slots (``claim_batch``, the bench's protocol clients) now claims up to 64 per call — a worker
still never claims more than it asks for nor more than its free slots, and a worker that asks for 8
or fewer is answered exactly as before. Backend + client CPU per completed run on that loop: 0.49 ms
at 8 per claim (0012), 0.29 at 32, 0.24 at 64 (64 and 32 measured side by side under the same load). The
batch calls that follow a claim of 64 stay far below ``MAX_BATCH``.

``ql_claim`` is 0012's statement with:

- the cap 64 (and ``ROWS 64``, the planner's estimate of the answer);
- each claimed run's earlier attempts read once for both numbers it needs (the new attempt's number
  and the sealed copy's ordinal: ``max(attempt_no)`` and the count of attempts that may have started,
  0005's rule), where 0012 read them twice — the second time through ``ql__attempts_used``, a PL/pgSQL
  call running its own statement per claimed run (the function stays, unchanged, for its other callers);
- the ids a claim may use checked in one statement instead of one statement per id (same ids, same
  error).

Its checks, queue scan (``ql__queued_runs``, oldest first, ``SKIP LOCKED``), lock order (runs, then the
worker ``FOR SHARE``), rows written and answers are 0012's.

``ql__fence`` (0003) is the same rules, in the same order, as one SQL ``CASE`` expression that
PostgreSQL inlines into the statement calling it — the batch functions' per-call CTEs and the single
functions' PL/pgSQL assignments — instead of a PL/pgSQL call per call with both rows passed as
composite values. ``ql_complete_many`` is 0012's with the outcome of a completion without a cancel
intent (nearly all) computed in its statement — ``ql_map_outcome``'s answer when there is no intent:
``timed_out`` if the attempt finished at or past its deadline, else by its exit code, never moot —
and ``ql_map_outcome`` itself called only for completions with an intent. No fence, answer, row or
event changes (tests/cluster/test_set_based_batches.py compares the batched and single paths).
See docs/cluster.md.

Revision ID: 0015_cluster_wide_claims
Revises: 0014_cluster_one_search_path
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, no_downgrade, split_statements, upgrade_functions

revision = "0015_cluster_wide_claims"
down_revision = "0014_cluster_one_search_path"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_functions(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


downgrade = no_downgrade


_FENCE = r"""
-- 0003's ql__fence, rule for rule in the same order, as ONE SQL expression: PostgreSQL inlines it into
-- the statement that calls it (the batch functions' per-call CTEs, the single functions' PL/pgSQL
-- assignments), where the PL/pgSQL version was a function call per call of a batch, with both rows
-- built as composite values to pass in. Same arguments, same answers (NULL = not fenced); a missing
-- lease or worker row is all NULLs either way. Not SECURITY DEFINER, no SET: what inlining needs.
CREATE OR REPLACE FUNCTION ql__fence(v_lease ql_attempt_lease, v_worker ql_worker, p_worker_id text,
                                     p_worker_generation bigint, p_session text, p_lease_generation bigint,
                                     p_token_digest text, p_now bigint, p_identity_only boolean)
RETURNS text LANGUAGE sql STABLE AS $$
  SELECT CASE
    WHEN (v_lease).attempt_id IS NULL THEN 'NO_LEASE'
    WHEN (v_lease).worker_id IS DISTINCT FROM p_worker_id THEN 'WRONG_WORKER'
    WHEN (v_lease).worker_generation IS DISTINCT FROM p_worker_generation THEN 'STALE_WORKER_GENERATION'
    WHEN (v_lease).lease_generation IS DISTINCT FROM p_lease_generation THEN 'STALE_LEASE_GENERATION'
    WHEN (v_lease).token_digest IS DISTINCT FROM p_token_digest THEN 'WRONG_TOKEN'
    WHEN p_identity_only THEN NULL
    WHEN (v_worker).id IS NULL OR (v_worker).generation IS DISTINCT FROM p_worker_generation
      THEN 'STALE_WORKER_GENERATION'
    WHEN (v_worker).session IS DISTINCT FROM p_session THEN 'WRONG_SESSION'
    WHEN (v_lease).status = 'ended' THEN 'LEASE_ENDED'
    WHEN (v_lease).expires_at_ms <= p_now THEN 'LEASE_EXPIRED'
  END
$$;
"""

_COMPLETE = r"""
-- 0012's ql_complete_many, statement for statement, but the outcome of a completion without a cancel
-- intent (nearly all of them) is computed in the statement instead of by a call of ql_map_outcome per
-- completion: the timeout if the attempt finished at or past its deadline, else its exit code, never
-- moot — ql_map_outcome's answer when p_cancel_reason is NULL. With an intent, ql_map_outcome itself.
-- ql_complete for every call. Set-based: the holder's completion of a live attempt (lease starting
-- or running, full fence passed, the run running it) named once in the batch, one per run — the
-- terminal transition ql_complete + ql__finish make: events [run.cancel_moot], attempt.<status>,
-- run.<status>; attempt and run terminal (the deadline from the reported start when ql_running
-- never committed); lease ended 'completed' with the digest; the run's sealed spec erased. Every
-- other call (replay, late, fenced with its audit event, unknown attempt, an attempt named twice)
-- is the single ql_complete itself, afterwards, in attempt-id order.
CREATE OR REPLACE FUNCTION ql_complete_many(p_worker_ids text[], p_worker_generations bigint[], p_sessions text[],
                                            p_attempt_ids text[], p_lease_generations bigint[], p_lease_tokens text[],
                                            p_exit_codes integer[], p_started_at_ms bigint[],
                                            p_finished_at_ms bigint[], p_signalled boolean[],
                                            p_completion_digests text[])
RETURNS TABLE(ord integer, answer text, status text, reason text, fence_reason text, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_i integer;
  v_ords integer[];
  v_statuses text[];
  v_reasons text[];
  v_runs integer;
BEGIN
  PERFORM ql__batch_check(p_attempt_ids, array_length(p_worker_ids, 1), array_length(p_worker_generations, 1),
                          array_length(p_sessions, 1), array_length(p_lease_generations, 1),
                          array_length(p_lease_tokens, 1), array_length(p_exit_codes, 1),
                          array_length(p_started_at_ms, 1), array_length(p_finished_at_ms, 1),
                          array_length(p_signalled, 1), array_length(p_completion_digests, 1));
  -- ql_complete's argument checks, for every call before anything is written (a failure rolls the
  -- batch back, as it did from inside the loop).
  PERFORM ql__check(coalesce(bool_and(coalesce(d ~ '^[0-9a-f]{64}$', false)), true), 'completion_digest')
     FROM unnest(p_completion_digests) AS d;
  PERFORM ql__check(coalesce(bool_and(e IS NOT NULL AND f IS NOT NULL), true), 'exit_code/finished_at_ms')
     FROM unnest(p_exit_codes, p_finished_at_ms) AS x(e, f);
  PERFORM ql__lock_attempts(p_attempt_ids, p_worker_ids);
  v_now := ql__clock_ms();
  WITH calls AS (
    SELECT c.*, count(*) OVER (PARTITION BY c.attempt_id) AS named
      FROM unnest(p_worker_ids, p_worker_generations, p_sessions, p_attempt_ids, p_lease_generations,
                  p_lease_tokens, p_exit_codes, p_started_at_ms, p_finished_at_ms, p_signalled,
                  p_completion_digests)
           WITH ORDINALITY AS c(worker_id, worker_generation, session, attempt_id, lease_generation, lease_token,
                                exit_code, started_at_ms, finished_at_ms, signalled, completion_digest, i)
  ), found AS MATERIALIZED (
    -- Every row by its key only; the conditions below filter these rows afterwards (MATERIALIZED:
    -- pushed down, a condition on a status would let the planner scan a status index instead).
    SELECT c.i, c.named, c.attempt_id, c.exit_code, c.completion_digest, r.id AS run_id, r.event_seq,
           r.cancel_reason, r.cancel_requested_at_ms, r.timeout_ms, l.status = 'starting' AS unspawned, t.started,
           ql__clamp_ms(c.finished_at_ms, v_now, greatest(t.started, a.created_at_ms)) AS finished,
           CASE WHEN l.status = 'starting' AND r.timeout_ms IS NOT NULL THEN t.started + r.timeout_ms
                ELSE r.deadline_at_ms END AS deadline,
           coalesce(c.signalled, false) AND l.intent_delivered_at_ms IS NOT NULL AS signalled,
           l.status IN ('starting', 'running')
             AND ql__fence(l, w, c.worker_id, c.worker_generation, c.session, c.lease_generation,
                           ql__digest(c.lease_token), v_now, false) IS NULL
             AND r.current_attempt_id = c.attempt_id AND r.status = 'running'
             AND a.status IN ('starting', 'running') AS applies
      FROM calls c
      JOIN ql_attempt_lease l ON l.attempt_id = c.attempt_id
      JOIN ql_run_attempt a ON a.id = c.attempt_id
      JOIN ql_run r ON r.id = a.run_id
      LEFT JOIN ql_worker w ON w.id = c.worker_id
      CROSS JOIN LATERAL (SELECT coalesce(a.started_at_ms,
                                          ql__clamp_ms(c.started_at_ms, v_now, a.created_at_ms)) AS started) t
  ), live AS (
    SELECT * FROM found WHERE found.named = 1 AND found.applies IS TRUE
  ), go AS (
    SELECT x.*, x.event_seq + CASE WHEN x.moot THEN 1 ELSE 0 END AS base
      FROM (SELECT live.*, o.status AS new_status, o.reason AS new_reason, o.moot,
                   count(*) OVER (PARTITION BY live.run_id) AS per_run
              FROM live CROSS JOIN LATERAL (
                     -- ql_map_outcome's answer without a cancel intent, in the statement (0015): the
                     -- deadline if the attempt finished at or past it, else its exit code; moot false.
                     SELECT CASE WHEN live.deadline IS NOT NULL AND live.finished >= live.deadline THEN 'timed_out'
                                 WHEN live.exit_code = 0 THEN 'succeeded' ELSE 'failed' END AS status,
                            CASE WHEN live.deadline IS NOT NULL AND live.finished >= live.deadline
                                 THEN 'timeout' END AS reason,
                            false AS moot
                      WHERE live.cancel_reason IS NULL
                     UNION ALL
                     -- With one, ql_map_outcome itself (the rule's one implementation for intents).
                     SELECT m.status, m.reason, m.moot
                       FROM ql_map_outcome(live.cancel_reason, live.cancel_requested_at_ms, live.deadline,
                                           live.signalled, live.exit_code, live.finished) m
                      WHERE live.cancel_reason IS NOT NULL) o) x
     WHERE x.per_run = 1
  ), ev AS (
    INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, exit_code, reason, at_ms)
    SELECT go.run_id, e.seq, e.type, go.attempt_id, e.status, e.exit_code, e.reason, v_now
      FROM go CROSS JOIN LATERAL (VALUES
             (go.event_seq + 1, 'run.cancel_moot', NULL::text, NULL::integer, go.cancel_reason, go.moot),
             (go.base + 1, 'attempt.' || go.new_status, go.new_status, go.exit_code, go.new_reason, true),
             (go.base + 2, 'run.' || go.new_status, go.new_status, go.exit_code, go.new_reason, true))
           AS e(seq, type, status, exit_code, reason, written)
     WHERE e.written
  ), att AS (
    UPDATE ql_run_attempt t
       SET status = go.new_status, exit_code = go.exit_code, reason = go.new_reason,
           started_at_ms = coalesce(t.started_at_ms, go.started), finished_at_ms = go.finished,
           deadline_at_ms = CASE WHEN go.unspawned AND go.timeout_ms IS NOT NULL THEN go.deadline
                                 ELSE t.deadline_at_ms END,
           version = t.version + 1
      FROM go WHERE t.id = go.attempt_id
  ), run AS (
    UPDATE ql_run t
       SET status = go.new_status, exit_code = go.exit_code, reason = go.new_reason,
           finished_at_ms = greatest(go.finished, t.created_at_ms), updated_at_ms = v_now,
           deadline_at_ms = CASE WHEN go.unspawned AND go.timeout_ms IS NOT NULL THEN go.deadline
                                 ELSE t.deadline_at_ms END,
           version = t.version + 1, event_seq = go.base + 2
      FROM go WHERE t.id = go.run_id AND t.event_seq = go.event_seq
    RETURNING t.id
  ), lease AS (
    UPDATE ql_attempt_lease t
       SET status = 'ended', ended_at_ms = v_now, end_reason = 'completed',
           completion_digest = go.completion_digest, version = t.version + 1
      FROM go WHERE t.attempt_id = go.attempt_id AND t.status <> 'ended'
  ), spec AS (
    DELETE FROM ql_run_spec s USING go WHERE s.run_id = go.run_id
  )
  SELECT array_agg(go.i::integer ORDER BY go.attempt_id), array_agg(go.new_status ORDER BY go.attempt_id),
         array_agg(go.new_reason ORDER BY go.attempt_id), (SELECT count(*) FROM run)
    INTO v_ords, v_statuses, v_reasons, v_runs FROM go;
  IF v_runs <> coalesce(array_length(v_ords, 1), 0) THEN
    RAISE EXCEPTION 'ql: run changed under its lock' USING ERRCODE = '40001';
  END IF;
  RETURN QUERY SELECT x.i, 'applied'::text, x.s, x.r, NULL::text, v_now
                 FROM unnest(v_ords, v_statuses, v_reasons) AS x(i, s, r);
  FOR v_i IN SELECT k FROM generate_subscripts(p_attempt_ids, 1) AS k
              WHERE k <> ALL (coalesce(v_ords, '{}'::integer[]))
              ORDER BY p_attempt_ids[k], k LOOP
    RETURN QUERY SELECT v_i, s.answer, s.status, s.reason, s.fence_reason, s.db_now_ms
                   FROM ql_complete(p_worker_ids[v_i], p_worker_generations[v_i], p_sessions[v_i], p_attempt_ids[v_i],
                                    p_lease_generations[v_i], p_lease_tokens[v_i], p_exit_codes[v_i],
                                    p_started_at_ms[v_i], p_finished_at_ms[v_i], p_signalled[v_i],
                                    p_completion_digests[v_i]) s;
  END LOOP;
END $$;
"""

_CLAIM = r"""
CREATE OR REPLACE FUNCTION ql_claim(p_worker_id text, p_generation bigint, p_session text, p_max_n integer,
                                    p_free_slots integer, p_executor text, p_attempt_ids text[],
                                    p_log_ids text[], p_lease_ttl_ms bigint)
RETURNS TABLE(answer text, run_id text, attempt_id text, attempt_no integer, lease_generation bigint,
              lease_token text, spec_key_id text, spec_ordinal integer, sealed_spec bytea, timeout_ms bigint,
              lease_expires_at_ms bigint, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 64 SET search_path = pg_catalog, public
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
  v_n := least(coalesce(p_max_n, 0), coalesce(p_free_slots, 0), 64, coalesce(array_length(p_attempt_ids, 1), 0));
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

SQL_STATEMENTS = split_statements(_FENCE, _COMPLETE, _CLAIM, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
