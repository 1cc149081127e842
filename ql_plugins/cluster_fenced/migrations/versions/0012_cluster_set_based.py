"""Cluster throughput: the batched calls are set-based — a few statements per batch, not ~15 per call.

PostgreSQL only (nothing changes on SQLite; no table, column or index changes; the functions keep
their signatures, owners and grants — ``CREATE OR REPLACE``):

0011's ``ql_start_many``, ``ql_running_many`` and ``ql_complete_many`` called the single function
once per attempt: for a batch of 8, 8 x (4 row locks + fence + 3-9 writes) statements, each one
started, planned-from-cache and finished by the PL/pgSQL executor on its own; ``ql_claim`` ran
~10 statements per claimed run. Measured with pg_stat_statements (track = all) on the protocol
bench (claim, start, running, complete; 8 runs per claim): 52 statements inside the functions per
completed run, ~1 ms of backend CPU per completion, where a bare ``UPDATE … RETURNING`` row costs
~0.1 ms. With this revision: 12 statements per run; see docs/cluster.md for the CPU.

Now each batch:

1. locks every attempt's run, attempt and lease in ONE statement (``ql__lock_attempts``), in
   attempt-id order and run → attempt → lease within an attempt: the lock order of 0011's loop,
   then the workers ``FOR SHARE``;
2. evaluates the fence of every call with the same ``ql__fence`` (the rules stay in one place)
   against the rows it just locked, and writes all the calls that pass with one statement per
   table (``UPDATE … FROM``, ``INSERT … SELECT``) — the same rows, columns and events the single
   function writes;
3. answers each call from those rows (start and running in the statement that writes: they
   change nothing an answer reads but the deadline, computed once for both).

``ql_start_many`` and ``ql_running_many`` are set-based for every call: a fenced call writes
nothing, whatever it is fenced for. ``ql_complete_many`` applies set-based the common case — the
holder's completion of a live, consistent attempt, its attempt named once in the batch — and hands
every other call (replays, late or fenced completions with their audit events, unknown attempts,
an attempt named twice) to the single ``ql_complete`` afterwards, in attempt-id order as before:
those paths are rare and keep exactly one implementation. ``ql_renew_many`` stays 0011's loop
(one lease write per call, no events). ``ql_claim`` writes the attempts, leases, events and run
updates of all the runs it locked in one statement (its checks, queue scan and lock order are
0011's).

The batch functions and ``ql_claim`` plan under ``enable_seqscan``/``enable_bitmapscan``/
``enable_hashjoin``/``enable_mergejoin`` off: every row they read is found by key from the call
arrays (at most ``MAX_BATCH``); on tables without statistics (a fresh database, a burst before
autovacuum's ANALYZE) the planner otherwise hashed the claimed runs against a sequential scan of
``ql_run`` (auto_explain) — no unbounded scan (tests/cluster/test_set_based_batches.py).

One database clock reading per batch (after the locks) where the loop read it per call.

Revision ID: 0012_cluster_set_based
Revises: 0011_cluster_throughput
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, no_downgrade, split_statements, upgrade_functions

revision = "0012_cluster_set_based"
down_revision = "0011_cluster_throughput"
branch_labels = None
depends_on = None

def upgrade() -> None:
    upgrade_functions(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


downgrade = no_downgrade


#: Every batch function's settings: its own pinned search_path, and key lookups as the only plans.
_SETTINGS = ("SET search_path = pg_catalog, public SET enable_seqscan = off SET enable_bitmapscan = off "
             "SET enable_hashjoin = off SET enable_mergejoin = off SET plan_cache_mode = force_generic_plan")

_LOCK = r"""
-- Lock what the single functions lock, for all the calls of a batch at once: each attempt's run,
-- attempt and lease (FOR NO KEY UPDATE, in attempt-id order — the order 0011's loop locked them in),
-- then the callers' worker rows (FOR SHARE). An attempt without a lease (retention removed it)
-- is not locked here: the calls that find one never write through the set-based path.
CREATE FUNCTION ql__lock_attempts(p_attempt_ids text[], p_worker_ids text[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM 1 FROM ql_run_attempt a
            JOIN ql_run r ON r.id = a.run_id
            JOIN ql_attempt_lease l ON l.attempt_id = a.id
   WHERE a.id = ANY (p_attempt_ids)
   ORDER BY a.id FOR NO KEY UPDATE OF r, a, l;
  PERFORM 1 FROM ql_worker w WHERE w.id = ANY (p_worker_ids) ORDER BY w.id FOR SHARE;
END $$;
"""

#: The fence arguments, one array each (as 0011).
_FENCE_ARRAYS = ("p_worker_ids text[], p_worker_generations bigint[], p_sessions text[], p_attempt_ids text[], "
                 "p_lease_generations bigint[], p_lease_tokens text[]")
_LENGTHS = ("array_length(p_worker_ids, 1), array_length(p_worker_generations, 1), array_length(p_sessions, 1), "
            "array_length(p_lease_generations, 1), array_length(p_lease_tokens, 1)")
_LEASE_ANSWER = ("ord integer, answer text, reason text, lease_expires_at_ms bigint, db_now_ms bigint, "
                 "cancel_reason text, cancel_requested_at_ms bigint, deadline_at_ms bigint")


def _calls(extra: str = "", extra_columns: str = "") -> str:
    """The batch's calls (``c``, one row each, ``c.i`` = its index) with the rows each single call
    reads: its lease ``l``, attempt ``a``, run ``r`` and worker ``w`` (NULL when missing, as the single
    function's ``SELECT … INTO`` finds nothing)."""
    return (f"unnest(p_worker_ids, p_worker_generations, p_sessions, p_attempt_ids, p_lease_generations, "
            f"p_lease_tokens{extra}) WITH ORDINALITY AS c(worker_id, worker_generation, session, attempt_id, "
            f"lease_generation, lease_token{extra_columns}, i)\n"
            "      LEFT JOIN ql_run_attempt a ON a.id = c.attempt_id\n"
            "      LEFT JOIN ql_run r ON r.id = a.run_id\n"
            "      LEFT JOIN ql_attempt_lease l ON l.attempt_id = c.attempt_id\n"
            "      LEFT JOIN ql_worker w ON w.id = c.worker_id")


#: The single functions' full fence of call ``c`` (ql__fence, as ql_start/ql_running/ql_complete call it).
_FENCE = ("ql__fence(l, w, c.worker_id, c.worker_generation, c.session, c.lease_generation, "
          "ql__digest(c.lease_token), v_now, false)")

#: start's and running's answers, one per call in attempt-id order, from the rows ``f`` as locked.
_ANSWERS = """  SELECT f.i::integer, CASE WHEN f.why IS NULL THEN 'ok' ELSE 'fenced' END, f.why,
         CASE WHEN f.why IS NULL THEN f.expires END, v_now,
         CASE WHEN f.why IS NULL THEN f.cancel::text END,
         CASE WHEN f.why IS NULL THEN f.cancel_at END,
         CASE WHEN f.why IS NULL THEN f.deadline END
    FROM f ORDER BY f.attempt_id, f.i;"""

_START = f"""
-- ql_start for every call, in ONE statement after the locks: claimed -> starting, and the cancel
-- intent's first delivery, under the fence; a replay (already starting/running) changes nothing.
-- Answers from the rows as locked: start changes nothing an answer reads.
CREATE OR REPLACE FUNCTION ql_start_many({_FENCE_ARRAYS})
RETURNS TABLE({_LEASE_ANSWER})
LANGUAGE plpgsql VOLATILE SECURITY DEFINER {_SETTINGS} AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
BEGIN
  PERFORM ql__batch_check(p_attempt_ids, {_LENGTHS});
  PERFORM ql__lock_attempts(p_attempt_ids, p_worker_ids);
  v_now := ql__clock_ms();
  RETURN QUERY
  WITH f AS (
    SELECT c.i, c.attempt_id, l.expires_at_ms AS expires, r.cancel_reason AS cancel,
           r.cancel_requested_at_ms AS cancel_at, r.deadline_at_ms AS deadline, {_FENCE} AS why
      FROM {_calls()}
  ), upd AS (
    UPDATE ql_attempt_lease t
       SET status = CASE WHEN t.status = 'claimed' THEN 'starting' ELSE t.status END,
           started_at_ms = CASE WHEN t.status = 'claimed' THEN v_now ELSE t.started_at_ms END,
           version = t.version + CASE WHEN t.status = 'claimed' THEN 1 ELSE 0 END,
           intent_delivered_at_ms = CASE WHEN g.cancel IS NOT NULL
                                         THEN coalesce(t.intent_delivered_at_ms, v_now)
                                         ELSE t.intent_delivered_at_ms END
      FROM (SELECT DISTINCT f.attempt_id, f.cancel FROM f WHERE f.why IS NULL) g
     WHERE t.attempt_id = g.attempt_id
       AND (t.status = 'claimed' OR (g.cancel IS NOT NULL AND t.intent_delivered_at_ms IS NULL))
  )
{_ANSWERS}
END $$;
"""

_RUNNING = f"""
-- ql_running for every call, in ONE statement after the locks: a starting lease -> running
-- (attempt running with its clamped start, deadline = db now + timeout, event attempt.spawned, the
-- run's deadline), and the cancel intent's first delivery, under the fence; a claimed lease is
-- fenced NOT_STARTED; a replay changes nothing. An attempt named twice is written once, for its
-- first call (the loop's first call wrote it, the second was a replay). Answers from the rows as
-- locked, but the deadline: the one this call (or the first call of its attempt) writes. Two live
-- attempts of one run (never, under the locks) would write one event number twice: an error.
CREATE OR REPLACE FUNCTION ql_running_many({_FENCE_ARRAYS}, p_started_at_ms bigint[])
RETURNS TABLE({_LEASE_ANSWER})
LANGUAGE plpgsql VOLATILE SECURITY DEFINER {_SETTINGS} AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
BEGIN
  PERFORM ql__batch_check(p_attempt_ids, {_LENGTHS}, array_length(p_started_at_ms, 1));
  PERFORM ql__lock_attempts(p_attempt_ids, p_worker_ids);
  v_now := ql__clock_ms();
  RETURN QUERY
  WITH f AS (
    SELECT c.i, c.attempt_id, c.started_at_ms AS started, a.created_at_ms AS created, r.id AS run,
           r.event_seq, r.cancel_reason AS cancel, r.cancel_requested_at_ms AS cancel_at,
           l.expires_at_ms AS expires, l.status = 'starting' AS spawn,
           CASE WHEN l.status <> 'starting' THEN r.deadline_at_ms
                WHEN r.timeout_ms IS NOT NULL THEN v_now + r.timeout_ms END AS deadline,
           coalesce(x.fenced, CASE WHEN l.status = 'claimed' THEN 'NOT_STARTED' END) AS why
      FROM {_calls(", p_started_at_ms", ", started_at_ms")}
      CROSS JOIN LATERAL (SELECT {_FENCE} AS fenced) x
  ), go AS (
    SELECT DISTINCT ON (f.attempt_id) f.* FROM f WHERE f.why IS NULL ORDER BY f.attempt_id, f.i
  ), spawned AS (
    SELECT * FROM go WHERE go.spawn
  ), lease AS (
    UPDATE ql_attempt_lease t
       SET status = CASE WHEN go.spawn THEN 'running' ELSE t.status END,
           running_at_ms = CASE WHEN go.spawn THEN v_now ELSE t.running_at_ms END,
           version = t.version + CASE WHEN go.spawn THEN 1 ELSE 0 END,
           intent_delivered_at_ms = CASE WHEN go.cancel IS NOT NULL
                                         THEN coalesce(t.intent_delivered_at_ms, v_now)
                                         ELSE t.intent_delivered_at_ms END
      FROM go
     WHERE t.attempt_id = go.attempt_id
       AND (go.spawn OR (go.cancel IS NOT NULL AND t.intent_delivered_at_ms IS NULL))
  ), att AS (
    UPDATE ql_run_attempt t
       SET status = 'running', started_at_ms = ql__clamp_ms(s.started, v_now, s.created),
           deadline_at_ms = s.deadline, version = t.version + 1
      FROM spawned s WHERE t.id = s.attempt_id
  ), ev AS (
    INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, exit_code, reason, at_ms)
    SELECT s.run, s.event_seq + 1, 'attempt.spawned', s.attempt_id, 'running', NULL, NULL, v_now FROM spawned s
  ), upd AS (
    UPDATE ql_run t
       SET deadline_at_ms = s.deadline, updated_at_ms = v_now, version = t.version + 1, event_seq = t.event_seq + 1
      FROM spawned s WHERE t.id = s.run
  )
{_ANSWERS}
END $$;
"""

_COMPLETE_ARRAYS = ("p_exit_codes integer[], p_started_at_ms bigint[], p_finished_at_ms bigint[], "
                    "p_signalled boolean[], p_completion_digests text[]")
_COMPLETE_ARGS = ("p_worker_ids[v_i], p_worker_generations[v_i], p_sessions[v_i], p_attempt_ids[v_i], "
                  "p_lease_generations[v_i], p_lease_tokens[v_i], p_exit_codes[v_i], p_started_at_ms[v_i], "
                  "p_finished_at_ms[v_i], p_signalled[v_i], p_completion_digests[v_i]")

_COMPLETE = f"""
-- ql_complete for every call. Set-based: the holder's completion of a live attempt (lease starting
-- or running, full fence passed, the run running it) named once in the batch, one per run — the
-- terminal transition ql_complete + ql__finish make: events [run.cancel_moot], attempt.<status>,
-- run.<status>; attempt and run terminal (the deadline from the reported start when ql_running
-- never committed); lease ended 'completed' with the digest; the run's sealed spec erased. Every
-- other call (replay, late, fenced with its audit event, unknown attempt, an attempt named twice)
-- is the single ql_complete itself, afterwards, in attempt-id order.
CREATE OR REPLACE FUNCTION ql_complete_many({_FENCE_ARRAYS}, {_COMPLETE_ARRAYS})
RETURNS TABLE(ord integer, answer text, status text, reason text, fence_reason text, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER {_SETTINGS} AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_i integer;
  v_ords integer[];
  v_statuses text[];
  v_reasons text[];
  v_runs integer;
BEGIN
  PERFORM ql__batch_check(p_attempt_ids, {_LENGTHS}, array_length(p_exit_codes, 1),
                          array_length(p_started_at_ms, 1), array_length(p_finished_at_ms, 1),
                          array_length(p_signalled, 1), array_length(p_completion_digests, 1));
  -- ql_complete's argument checks, for every call before anything is written (a failure rolls the
  -- batch back, as it did from inside the loop).
  PERFORM ql__check(coalesce(bool_and(coalesce(d ~ '^[0-9a-f]{{64}}$', false)), true), 'completion_digest')
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
           l.status IN ('starting', 'running') AND {_FENCE} IS NULL
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
              FROM live CROSS JOIN LATERAL ql_map_outcome(live.cancel_reason, live.cancel_requested_at_ms,
                                                          live.deadline, live.signalled, live.exit_code,
                                                          live.finished) o) x
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
              WHERE k <> ALL (coalesce(v_ords, '{{}}'::integer[]))
              ORDER BY p_attempt_ids[k], k LOOP
    RETURN QUERY SELECT v_i, s.answer, s.status, s.reason, s.fence_reason, s.db_now_ms
                   FROM ql_complete({_COMPLETE_ARGS}) s;
  END LOOP;
END $$;
"""

_CLAIM = r"""
-- 0011's ql_claim with its per-run loop (~10 statements per run) replaced by ONE statement for all
-- the locked runs: attempts, leases, attempt.claimed events and run updates written per table,
-- the answers (with each run's sealed copy) returned by the same statement. Same rows, same
-- values: attempt numbers and the sealed copy's ordinal counted before the new attempts exist,
-- lease generations drawn oldest run first, one token per attempt. The checks, the queue scan and
-- the lock order (runs, then the worker FOR SHARE) are 0011's, statement for statement. Planned as
-- the batch functions (key lookups only): without statistics the planner hashed the locked runs
-- against a sequential scan of all of ql_run (auto_explain, 3,000 queued runs, autovacuum off).
CREATE OR REPLACE FUNCTION ql_claim(p_worker_id text, p_generation bigint, p_session text, p_max_n integer,
                                    p_free_slots integer, p_executor text, p_attempt_ids text[],
                                    p_log_ids text[], p_lease_ttl_ms bigint)
RETURNS TABLE(answer text, run_id text, attempt_id text, attempt_no integer, lease_generation bigint,
              lease_token text, spec_key_id text, spec_ordinal integer, sealed_spec bytea, timeout_ms bigint,
              lease_expires_at_ms bigint, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 8 SET search_path = pg_catalog, public
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_n integer;
  v_run_ids text[];
  v_i integer := 0;
  v_ok boolean;
BEGIN
  PERFORM ql__check(p_lease_ttl_ms BETWEEN 1000 AND 3600000, 'lease_ttl_ms');
  PERFORM ql__check(length(p_executor) BETWEEN 1 AND 64, 'executor');
  PERFORM ql__check(coalesce(array_length(p_attempt_ids, 1), 0) = coalesce(array_length(p_log_ids, 1), 0),
                    'attempt_ids/log_ids');
  v_n := least(coalesce(p_max_n, 0), coalesce(p_free_slots, 0), 8, coalesce(array_length(p_attempt_ids, 1), 0));
  FOR v_i IN 1 .. greatest(v_n, 0) LOOP
    PERFORM ql__check(ql__is_id(p_attempt_ids[v_i]) AND ql__is_id(p_log_ids[v_i]), 'attempt_ids/log_ids');
  END LOOP;
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
           (SELECT coalesce(max(a.attempt_no), 0) + 1 FROM ql_run_attempt a WHERE a.run_id = r.id) AS no,
           -- 0005: the n-th attempt that may start gets sealed copy n (counted before it exists).
           ql__attempts_used(r.id) + 1 AS copy
      FROM unnest(v_run_ids) WITH ORDINALITY AS k(id, i)
      JOIN ql_run r ON r.id = k.id
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

SQL_STATEMENTS = split_statements(_LOCK, _START, _RUNNING, _COMPLETE, _CLAIM, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
