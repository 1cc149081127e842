"""Cluster: a completion carries its attempt's spawn, so a short task costs no ``running`` call.

PostgreSQL only (no table, column, index or row changes). One new fenced worker function,
``ql_spawn_complete_many``: ``ql_complete_many`` (0015) with one more array, each completion's process
start on the database's clock (``p_spawned_at_ms``, NULL for a completion whose ``running`` report
was made already). A worker whose round carries an attempt's completion used to send that attempt's
``running`` report in the same statement just before it (``ql_running_many``, then
``ql_complete_many``): two function calls, and per attempt the lease, attempt and run each written
twice. Backend CPU per task is dominated by each call's own cost (locks, fence checks, statements),
so the worker now sends the spawn with the completion and this function makes both transitions.

Exactly what the two calls did, in order, in one statement per table: for a call with a spawn time
whose completion takes the set-based path (0015's conditions: the holder's completion of a live
attempt, full fence passed, the run running it, named once in the batch) on a lease still
``starting`` and a run without a cancel intent — the running transition (event ``attempt.spawned``;
attempt ``running`` from the clamped spawn time; deadline = db now + the run's timeout on attempt
and run; lease ``running_at_ms``) and then 0015's terminal transition from there (events
``attempt.<status>``, ``run.<status>`` after it; outcome from the new deadline; every row's version
counts both writes). Every other call with a spawn time (a cancel intent to deliver, a replay, a
fenced or late call, an attempt named twice): ``ql_running_many`` for those calls first, exactly as
the worker's separate report, then the completion as ``ql_complete_many`` makes it. One clock reading
for both transitions (the two calls read it twice, microseconds apart). The answers are the
completions' (the worker treats a completion's answer as its spawn report's too).

Revision ID: 0017_cluster_spawn_complete
Revises: 0016_cluster_empty_logs
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, no_downgrade, split_statements, upgrade_functions

revision = "0017_cluster_spawn_complete"
down_revision = "0016_cluster_empty_logs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_functions(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


downgrade = no_downgrade


_SPAWN_COMPLETE = r"""
-- 0015's ql_complete_many, statement for statement, plus each call's spawn time (module docstring):
-- the joint calls (v_joint) get the running transition in the same statements as their completion;
-- the other calls with a spawn time get ql_running_many first, as their own report would have.
CREATE FUNCTION ql_spawn_complete_many(p_worker_ids text[], p_worker_generations bigint[], p_sessions text[],
                                       p_attempt_ids text[], p_lease_generations bigint[], p_lease_tokens text[],
                                       p_exit_codes integer[], p_started_at_ms bigint[],
                                       p_finished_at_ms bigint[], p_signalled boolean[],
                                       p_completion_digests text[], p_spawned_at_ms bigint[])
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
  v_joint integer[];
  v_alone integer[];
BEGIN
  PERFORM ql__batch_check(p_attempt_ids, array_length(p_worker_ids, 1), array_length(p_worker_generations, 1),
                          array_length(p_sessions, 1), array_length(p_lease_generations, 1),
                          array_length(p_lease_tokens, 1), array_length(p_exit_codes, 1),
                          array_length(p_started_at_ms, 1), array_length(p_finished_at_ms, 1),
                          array_length(p_signalled, 1), array_length(p_completion_digests, 1),
                          array_length(p_spawned_at_ms, 1));
  PERFORM ql__check(coalesce(bool_and(coalesce(d ~ '^[0-9a-f]{64}$', false)), true), 'completion_digest')
     FROM unnest(p_completion_digests) AS d;
  PERFORM ql__check(coalesce(bool_and(e IS NOT NULL AND f IS NOT NULL), true), 'exit_code/finished_at_ms')
     FROM unnest(p_exit_codes, p_finished_at_ms) AS x(e, f);
  PERFORM ql__lock_attempts(p_attempt_ids, p_worker_ids);
  v_now := ql__clock_ms();
  -- Which calls with a spawn time take the joint path (decided once, on the rows as locked), and
  -- which get their own running report first.
  SELECT array_agg(c.i::integer ORDER BY c.i) FILTER (WHERE c.joint),
         array_agg(c.i::integer ORDER BY c.i) FILTER (WHERE NOT c.joint)
    INTO v_joint, v_alone
    FROM (SELECT c.i,
                 coalesce(count(*) OVER (PARTITION BY c.attempt_id) = 1 AND l.status = 'starting'
                          AND a.status = 'starting' AND r.status = 'running' AND r.current_attempt_id = c.attempt_id
                          AND r.cancel_reason IS NULL
                          AND ql__fence(l, w, c.worker_id, c.worker_generation, c.session, c.lease_generation,
                                        ql__digest(c.lease_token), v_now, false) IS NULL, false) AS joint,
                 c.spawned_at_ms
            FROM unnest(p_worker_ids, p_worker_generations, p_sessions, p_attempt_ids, p_lease_generations,
                        p_lease_tokens, p_spawned_at_ms)
                 WITH ORDINALITY AS c(worker_id, worker_generation, session, attempt_id, lease_generation,
                                      lease_token, spawned_at_ms, i)
            LEFT JOIN ql_run_attempt a ON a.id = c.attempt_id
            LEFT JOIN ql_run r ON r.id = a.run_id
            LEFT JOIN ql_attempt_lease l ON l.attempt_id = c.attempt_id
            LEFT JOIN ql_worker w ON w.id = c.worker_id) c
   WHERE c.spawned_at_ms IS NOT NULL;
  IF v_alone IS NOT NULL THEN
    PERFORM ql_running_many(array_agg(p_worker_ids[k] ORDER BY k), array_agg(p_worker_generations[k] ORDER BY k),
                            array_agg(p_sessions[k] ORDER BY k), array_agg(p_attempt_ids[k] ORDER BY k),
                            array_agg(p_lease_generations[k] ORDER BY k), array_agg(p_lease_tokens[k] ORDER BY k),
                            array_agg(p_spawned_at_ms[k] ORDER BY k))
       FROM unnest(v_alone) AS k;
  END IF;
  v_joint := coalesce(v_joint, '{}'::integer[]);
  WITH calls AS (
    SELECT c.*, count(*) OVER (PARTITION BY c.attempt_id) AS named, c.i = ANY (v_joint) AS joint
      FROM unnest(p_worker_ids, p_worker_generations, p_sessions, p_attempt_ids, p_lease_generations,
                  p_lease_tokens, p_exit_codes, p_started_at_ms, p_finished_at_ms, p_signalled,
                  p_completion_digests, p_spawned_at_ms)
           WITH ORDINALITY AS c(worker_id, worker_generation, session, attempt_id, lease_generation, lease_token,
                                exit_code, started_at_ms, finished_at_ms, signalled, completion_digest,
                                spawned_at_ms, i)
  ), found AS MATERIALIZED (
    SELECT c.i, c.named, c.joint, c.attempt_id, c.exit_code, c.completion_digest, r.id AS run_id, r.event_seq,
           r.cancel_reason, r.cancel_requested_at_ms, r.timeout_ms,
           l.status = 'starting' AND NOT c.joint AS unspawned, t.started,
           ql__clamp_ms(c.finished_at_ms, v_now, greatest(t.started, a.created_at_ms)) AS finished,
           CASE WHEN c.joint THEN v_now + r.timeout_ms
                WHEN l.status = 'starting' AND r.timeout_ms IS NOT NULL THEN t.started + r.timeout_ms
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
      -- A joint call's attempt starts at its spawn (ql_running's clamp); the others as in 0015.
      CROSS JOIN LATERAL (SELECT CASE WHEN c.joint THEN ql__clamp_ms(c.spawned_at_ms, v_now, a.created_at_ms)
                                      ELSE coalesce(a.started_at_ms,
                                                    ql__clamp_ms(c.started_at_ms, v_now, a.created_at_ms))
                                 END AS started) t
  ), live AS (
    SELECT * FROM found WHERE found.named = 1 AND found.applies IS TRUE
  ), go AS (
    -- base: the event number before the outcome's events (after attempt.spawned and run.cancel_moot).
    SELECT x.*, x.event_seq + CASE WHEN x.joint THEN 1 ELSE 0 END + CASE WHEN x.moot THEN 1 ELSE 0 END AS base,
           CASE WHEN x.joint THEN 2 ELSE 1 END AS writes
      FROM (SELECT live.*, o.status AS new_status, o.reason AS new_reason, o.moot,
                   count(*) OVER (PARTITION BY live.run_id) AS per_run
              FROM live CROSS JOIN LATERAL (
                     SELECT CASE WHEN live.deadline IS NOT NULL AND live.finished >= live.deadline THEN 'timed_out'
                                 WHEN live.exit_code = 0 THEN 'succeeded' ELSE 'failed' END AS status,
                            CASE WHEN live.deadline IS NOT NULL AND live.finished >= live.deadline
                                 THEN 'timeout' END AS reason,
                            false AS moot
                      WHERE live.cancel_reason IS NULL
                     UNION ALL
                     SELECT m.status, m.reason, m.moot
                       FROM ql_map_outcome(live.cancel_reason, live.cancel_requested_at_ms, live.deadline,
                                           live.signalled, live.exit_code, live.finished) m
                      WHERE live.cancel_reason IS NOT NULL) o) x
     WHERE x.per_run = 1
  ), ev AS (
    INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, exit_code, reason, at_ms)
    SELECT go.run_id, e.seq, e.type, go.attempt_id, e.status, e.exit_code, e.reason, v_now
      FROM go CROSS JOIN LATERAL (VALUES
             (go.event_seq + 1, 'attempt.spawned', 'running', NULL::integer, NULL::text, go.joint),
             (go.event_seq + 1, 'run.cancel_moot', NULL::text, NULL::integer, go.cancel_reason, go.moot),
             (go.base + 1, 'attempt.' || go.new_status, go.new_status, go.exit_code, go.new_reason, true),
             (go.base + 2, 'run.' || go.new_status, go.new_status, go.exit_code, go.new_reason, true))
           AS e(seq, type, status, exit_code, reason, written)
     WHERE e.written
  ), att AS (
    UPDATE ql_run_attempt t
       SET status = go.new_status, exit_code = go.exit_code, reason = go.new_reason,
           started_at_ms = CASE WHEN go.joint THEN go.started ELSE coalesce(t.started_at_ms, go.started) END,
           finished_at_ms = go.finished,
           deadline_at_ms = CASE WHEN go.joint OR (go.unspawned AND go.timeout_ms IS NOT NULL) THEN go.deadline
                                 ELSE t.deadline_at_ms END,
           version = t.version + go.writes
      FROM go WHERE t.id = go.attempt_id
  ), run AS (
    UPDATE ql_run t
       SET status = go.new_status, exit_code = go.exit_code, reason = go.new_reason,
           finished_at_ms = greatest(go.finished, t.created_at_ms), updated_at_ms = v_now,
           deadline_at_ms = CASE WHEN go.joint OR (go.unspawned AND go.timeout_ms IS NOT NULL) THEN go.deadline
                                 ELSE t.deadline_at_ms END,
           version = t.version + go.writes, event_seq = go.base + 2
      FROM go WHERE t.id = go.run_id AND t.event_seq = go.event_seq
    RETURNING t.id
  ), lease AS (
    UPDATE ql_attempt_lease t
       SET status = 'ended', ended_at_ms = v_now, end_reason = 'completed',
           running_at_ms = CASE WHEN go.joint THEN v_now ELSE t.running_at_ms END,
           completion_digest = go.completion_digest, version = t.version + go.writes
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

SQL_STATEMENTS = split_statements(_SPAWN_COMPLETE, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
