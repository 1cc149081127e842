"""Cluster control plane, second step: worker-queue guard, queue wake-ups, worker deregistration.

PostgreSQL only (nothing changes on SQLite):

- ``ql_claim`` takes only runs queued *for workers* — ``status = 'queued'`` and no current attempt.
  A standalone node with ``journal = "cluster-fenced"`` creates its own runs ``queued`` with their
  first attempt already set (between its create and spawned commits); a worker must never take one.
- ``ql_request_cancel`` ends a queued run at once only when it is a worker-queue run; a standalone
  node's run gets the intent only (its own completion converges to it).
- ``ql__queue_notify`` + trigger ``ql_run_queued_notify``: every run that enters the worker queue
  (``ql_submit``, a requeue) sends ``NOTIFY ql_queue``; idle workers ``LISTEN`` and claim at once
  instead of waiting for their next poll. ``ql__intent_notify`` + ``ql_run_intent_notify``: a
  committed cancel/timeout intent sends ``NOTIFY ql_intent`` with the attempt id; its lease holder
  renews at once and learns the intent from that renew. Wake-ups only: workers still poll and renew
  at half life, and the tables stay the truth.
- ``ql_end_without_completion`` audits a fenced report (``lost``/``released`` from a worker that no
  longer holds the lease) as ``attempt.completion_fenced``, exactly like a fenced completion.
- ``ql_deregister(worker_id, generation, session)``: a drained worker ends its session lease
  (status ``stopped``); its row is kept, so generations stay monotonic per worker id.

Same conventions as 0003: one transaction per call, the database clock, no dynamic SQL, unqualified
names (ready for ``SECURITY DEFINER``), errors never echo a value.

Revision ID: 0004_cluster_worker
Revises: 0003_cluster_control
"""

from alembic import op

from ql_core.db.pg_migration import execute_statements, split_statements

revision = "0004_cluster_worker"
down_revision = "0003_cluster_control"
#: The cluster plugin's own Alembic branch starts here, on core's 0003 (its ql_run columns).
branch_labels = ("cluster_fenced",)
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    execute_statements(op, SQL_STATEMENTS)


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


_CLAIM = r"""
-- Claim up to least(max_n, free_slots, 8, #ids) queued runs, oldest first, FOR UPDATE SKIP
-- LOCKED. Only runs queued for workers (no current attempt): a standalone node's own run is
-- 'queued' between its create and spawned commits and is never a worker's (revision 0004). Per run: a new attempt ('starting', id and log id from the caller), a lease ('claimed',
-- a fresh lease_generation, a random token returned ONCE — only its SHA-256 is stored, also as
-- the attempt's callback_token_hash), run → 'running', event attempt.claimed.
-- Zero rows: nothing to claim. One row with answer 'fenced': the worker's fence is stale or its
-- session lease expired (nothing claimed).
CREATE OR REPLACE FUNCTION ql_claim(p_worker_id text, p_generation bigint, p_session text, p_max_n integer,
                         p_free_slots integer, p_executor text, p_attempt_ids text[], p_log_ids text[],
                         p_lease_ttl_ms bigint)
RETURNS TABLE (answer text, run_id text, attempt_id text, attempt_no integer, lease_generation bigint,
               lease_token text, spec jsonb, timeout_ms bigint, lease_expires_at_ms bigint,
               db_now_ms bigint)
LANGUAGE plpgsql VOLATILE ROWS 8 AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_n integer;
  v_run_ids text[];
  v_run ql_run%ROWTYPE;
  v_i integer := 0;
  v_token text;
  v_digest text;
  v_no integer;
  v_gen bigint;
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
  SELECT array_agg(q.id ORDER BY q.created_at_ms, q.id) INTO v_run_ids FROM (
    SELECT r.id, r.created_at_ms FROM ql_run r WHERE r.status = 'queued' AND r.current_attempt_id IS NULL
     ORDER BY r.created_at_ms, r.id LIMIT v_n FOR NO KEY UPDATE SKIP LOCKED) q;
  -- Lock order: runs, then the worker (FOR SHARE: registration waits for this claim to commit).
  SELECT (w.generation = p_generation AND w.session = p_session AND w.lease_expires_at_ms > ql__clock_ms())
    INTO v_ok FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  IF v_ok IS NOT TRUE THEN
    answer := 'fenced'; db_now_ms := v_now; RETURN NEXT; RETURN;
  END IF;
  IF v_run_ids IS NULL THEN RETURN; END IF;
  v_i := 0;
  FOR v_run IN SELECT * FROM ql_run r WHERE r.id = ANY (v_run_ids) ORDER BY r.created_at_ms, r.id LOOP
    v_i := v_i + 1;
    v_token := ql__new_token();
    v_digest := ql__digest(v_token);
    SELECT coalesce(max(a.attempt_no), 0) + 1 INTO v_no FROM ql_run_attempt a WHERE a.run_id = v_run.id;
    v_gen := nextval('ql_lease_generation_seq');
    INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, exit_code, reason,
                                log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms,
                                created_at_ms, started_at_ms, finished_at_ms, handle, host_handle, version)
    VALUES (p_attempt_ids[v_i], v_run.id, v_no, p_executor, p_worker_id, 'starting', NULL, NULL,
            p_log_ids[v_i], v_digest, 0, NULL, v_now, NULL, NULL, NULL, NULL, 1);
    INSERT INTO ql_attempt_lease (attempt_id, run_id, status, version, lease_generation, token_digest,
                                  worker_id, worker_generation, expires_at_ms, claimed_at_ms)
    VALUES (p_attempt_ids[v_i], v_run.id, 'claimed', 1, v_gen, v_digest, p_worker_id, p_generation,
            v_now + p_lease_ttl_ms, v_now);
    PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'attempt.claimed', p_attempt_ids[v_i], 'starting',
                      NULL, NULL, v_now);
    UPDATE ql_run r SET status = 'running', current_attempt_id = p_attempt_ids[v_i], deadline_at_ms = NULL,
           updated_at_ms = v_now, version = r.version + 1, event_seq = r.event_seq + 1
     WHERE r.id = v_run.id;
    answer := 'claimed';
    run_id := v_run.id;
    attempt_id := p_attempt_ids[v_i];
    attempt_no := v_no;
    lease_generation := v_gen;
    lease_token := v_token;
    SELECT s.spec INTO spec FROM ql_run_spec s WHERE s.run_id = v_run.id;
    timeout_ms := v_run.timeout_ms;
    lease_expires_at_ms := v_now + p_lease_ttl_ms;
    db_now_ms := v_now;
    RETURN NEXT;
  END LOOP;
END $$;
"""

_CANCEL = r"""
-- Control side: commit a cancel intent (reason user|policy|shutdown|timeout).
-- (0004: a run 'queued' WITH a current attempt is a standalone node's, between its create and
-- spawned commits: only the intent is committed; that node's own completion converges to it.)
--   queued run, or its attempt's lease still 'claimed' (provably never spawned) → ended at once
--   ('cancelled'); a started attempt → intent only ('requested'), the lease holder learns it on
--   renew; a run with an intent → 'already_requested'; terminal → 'already_terminal' (no event).
CREATE OR REPLACE FUNCTION ql_request_cancel(p_run_id text, p_reason text,
                                  OUT answer text, OUT status text, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_run ql_run%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_status text;
BEGIN
  PERFORM ql__check(p_reason IN ('user', 'policy', 'shutdown', 'timeout'), 'reason');
  SELECT * INTO v_run FROM ql_run WHERE id = p_run_id FOR NO KEY UPDATE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  IF NOT FOUND THEN answer := 'not_found'; RETURN; END IF;
  status := v_run.status;
  IF v_run.status NOT IN ('queued', 'running') THEN answer := 'already_terminal'; RETURN; END IF;
  IF v_run.cancel_reason IS NOT NULL THEN answer := 'already_requested'; RETURN; END IF;
  v_status := CASE WHEN p_reason = 'timeout' THEN 'timed_out' ELSE 'cancelled' END;
  IF v_run.current_attempt_id IS NOT NULL THEN
    PERFORM 1 FROM ql_run_attempt WHERE id = v_run.current_attempt_id FOR NO KEY UPDATE;
    SELECT * INTO v_lease FROM ql_attempt_lease WHERE attempt_id = v_run.current_attempt_id
       FOR NO KEY UPDATE;
  END IF;
  UPDATE ql_run SET cancel_reason = p_reason, cancel_requested_at_ms = v_now, updated_at_ms = v_now,
         version = version + 1, event_seq = event_seq + 1
   WHERE id = p_run_id;
  PERFORM ql__event(p_run_id, v_run.event_seq + 1, 'run.cancel_requested', v_run.current_attempt_id,
                    NULL, NULL, p_reason, v_now);
  IF v_run.status = 'queued' AND v_run.current_attempt_id IS NULL THEN
    PERFORM ql__event(p_run_id, v_run.event_seq + 2, 'run.' || v_status, NULL, v_status, NULL, p_reason, v_now);
    UPDATE ql_run SET status = v_status, reason = p_reason, finished_at_ms = v_now,
           version = version + 1, event_seq = event_seq + 1
     WHERE id = p_run_id;
    DELETE FROM ql_run_spec WHERE run_id = p_run_id;
    answer := 'cancelled'; status := v_status; RETURN;
  END IF;
  IF v_lease.attempt_id IS NOT NULL AND v_lease.status = 'claimed' THEN
    PERFORM ql__finish(p_run_id, v_lease.attempt_id, v_status, NULL, p_reason, NULL, v_now, false,
                       'cancelled', NULL, v_now);
    answer := 'cancelled'; status := v_status; RETURN;
  END IF;
  answer := 'requested';
END $$;
"""

_END = r"""
-- (0004: a fenced report is audited as attempt.completion_fenced, like a fenced completion.)
-- The holder ends its attempt without a completion receipt:
--   p_status 'lost'     the task provably exited without a receipt (attempt starting/running):
--                       attempt 'lost' (p_reason, default RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
--                       — or the committed intent's status when the holder signalled for it —;
--                       then a new attempt only if the retry policy allows, else run 'lost';
--   p_status 'released' hand a claimed/starting attempt that was NOT spawned back to the queue
--                       (drain): no retry consumed; 'refused' for a running attempt (wait for it
--                       or stop it and submit its completion).
-- Answers: applied (+ outcome 'requeued' | the run's terminal status), already_ended (replay),
-- already_terminal, fenced, refused.
CREATE OR REPLACE FUNCTION ql_end_without_completion(p_worker_id text, p_worker_generation bigint, p_session text,
                                          p_attempt_id text, p_lease_generation bigint,
                                          p_lease_token text, p_status text, p_reason text,
                                          p_signalled boolean,
                                          OUT answer text, OUT outcome text, OUT fence_reason text,
                                          OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
  v_att ql_run_attempt%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_worker ql_worker%ROWTYPE;
  v_now bigint;
  v_digest text;
  v_reason text;
  v_end text;
  v_status text;
  v_key text;
BEGIN
  PERFORM ql__check(p_status IN ('lost', 'released'), 'status');
  PERFORM ql__check(p_reason IS NULL OR p_reason ~ '^[A-Z][A-Z0-9_]{0,79}$', 'reason');
  v_end := CASE WHEN p_status = 'lost' THEN 'worker_lost' ELSE 'released' END;
  SELECT * INTO v_run FROM ql_run r WHERE r.id = (SELECT a.run_id FROM ql_run_attempt a WHERE a.id = p_attempt_id)
     FOR NO KEY UPDATE;
  SELECT * INTO v_att FROM ql_run_attempt a WHERE a.id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_worker FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  IF v_att.id IS NULL THEN answer := 'fenced'; fence_reason := 'UNKNOWN_ATTEMPT'; RETURN; END IF;
  v_digest := ql__digest(p_lease_token);
  fence_reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session,
                            p_lease_generation, v_digest, v_now, true);
  IF fence_reason IS NULL AND v_lease.status = 'ended' THEN
    outcome := CASE WHEN v_run.status = 'queued' THEN 'requeued' ELSE v_run.status END;
    IF v_lease.end_reason = v_end THEN answer := 'already_ended'; RETURN; END IF;
    IF v_lease.end_reason IN ('completed', 'worker_lost', 'released') THEN
      answer := 'already_terminal'; RETURN;
    END IF;
    fence_reason := 'LEASE_' || upper(v_lease.end_reason);
  END IF;
  IF fence_reason IS NULL THEN
    fence_reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session,
                              p_lease_generation, v_digest, v_now, false);
  END IF;
  IF fence_reason IS NULL AND (v_run.current_attempt_id IS DISTINCT FROM p_attempt_id
                               OR v_run.status <> 'running') THEN
    fence_reason := 'INCONSISTENT_STATE';
  END IF;
  IF fence_reason IS NOT NULL THEN
    -- 0004: audited like a fenced completion (once per attempt and report; the run never changes).
    answer := 'fenced';
    v_key := 'fenced:' || p_attempt_id || ':end:' || p_status || ':' || coalesce(p_reason, '');
    IF v_run.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ql_run_event e WHERE e.dedupe_key = v_key) THEN
      PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'attempt.completion_fenced', p_attempt_id, NULL, NULL,
                        fence_reason, v_now, v_key);
      UPDATE ql_run r SET event_seq = r.event_seq + 1 WHERE r.id = v_run.id;
    END IF;
    RETURN;
  END IF;

  IF p_status = 'released' THEN
    IF v_lease.status = 'running' THEN answer := 'refused'; fence_reason := 'RUNNING'; RETURN; END IF;
    IF v_run.cancel_reason IS NOT NULL THEN
      -- Never spawned and the run is being cancelled: end it with the intent's status.
      v_status := CASE WHEN v_run.cancel_reason = 'timeout' THEN 'timed_out' ELSE 'cancelled' END;
      PERFORM ql__finish(v_run.id, p_attempt_id, v_status, NULL, v_run.cancel_reason, NULL,
                         greatest(v_now, v_att.created_at_ms), false, 'released', NULL, v_now);
      answer := 'applied'; outcome := v_status; RETURN;
    END IF;
    PERFORM ql__requeue_unstarted(v_run.id, p_attempt_id, 'RELEASED', 'released', v_now);
    answer := 'applied'; outcome := 'requeued'; RETURN;
  END IF;

  IF v_lease.status = 'claimed' THEN answer := 'refused'; fence_reason := 'NOT_STARTED'; RETURN; END IF;
  v_reason := coalesce(p_reason, 'RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT');
  IF coalesce(p_signalled, false) AND v_lease.intent_delivered_at_ms IS NOT NULL
     AND v_run.cancel_reason IS NOT NULL THEN
    v_status := CASE WHEN v_run.cancel_reason = 'timeout' THEN 'timed_out' ELSE 'cancelled' END;
    PERFORM ql__finish(v_run.id, p_attempt_id, v_status, NULL, v_run.cancel_reason, NULL,
                       greatest(v_now, v_att.created_at_ms, coalesce(v_att.started_at_ms, 0)), false,
                       'worker_lost', NULL, v_now);
    answer := 'applied'; outcome := v_status; RETURN;
  END IF;
  outcome := ql__lose(v_run.id, p_attempt_id, v_reason, 'worker_lost', v_now);
  answer := 'applied';
END $$;
"""

_QUEUE_NOTIFY = r"""
-- A run entered the worker queue (submitted, or requeued): wake idle workers (LISTEN ql_queue).
CREATE FUNCTION ql__queue_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ql_queue', '');
  RETURN NULL;
END $$;

CREATE TRIGGER ql_run_queued_notify AFTER INSERT OR UPDATE OF status ON ql_run
  FOR EACH ROW WHEN (NEW.status = 'queued' AND NEW.current_attempt_id IS NULL)
  EXECUTE FUNCTION ql__queue_notify();

-- A cancel or timeout intent was committed for a running attempt: wake its lease holder (LISTEN
-- ql_intent, payload = the attempt id), which renews at once and learns the intent from the renew.
CREATE FUNCTION ql__intent_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ql_intent', NEW.current_attempt_id);
  RETURN NULL;
END $$;

CREATE TRIGGER ql_run_intent_notify AFTER UPDATE OF cancel_reason ON ql_run
  FOR EACH ROW WHEN (OLD.cancel_reason IS NULL AND NEW.cancel_reason IS NOT NULL
                     AND NEW.current_attempt_id IS NOT NULL)
  EXECUTE FUNCTION ql__intent_notify();
"""

_DEREGISTER = r"""
-- A drained worker ends its session: status 'stopped', session lease expired now (it may not claim).
-- Its run leases are not touched (fenced calls still need the row). 'fenced': not the current holder.
CREATE FUNCTION ql_deregister(p_worker_id text, p_generation bigint, p_session text,
                              OUT answer text, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
BEGIN
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  UPDATE ql_worker w SET status = 'stopped', lease_expires_at_ms = least(w.lease_expires_at_ms, v_now),
         heartbeat_at_ms = v_now, version = w.version + 1
   WHERE w.id = p_worker_id AND w.generation = p_generation AND w.session = p_session;
  answer := CASE WHEN FOUND THEN 'ok' ELSE 'fenced' END;
END $$;
"""


#: Executed in order by :func:`upgrade` on PostgreSQL.
SQL_STATEMENTS = split_statements(_CLAIM, _CANCEL, _END, _QUEUE_NOTIFY, _DEREGISTER)
