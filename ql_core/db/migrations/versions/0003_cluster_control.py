"""Cluster control plane: workers, run leases, run specs and the fenced PL/pgSQL operations.

Both dialects:
- ``ql_run.max_attempts`` (retry policy, default 1: never run twice) and ``ql_run.timeout_ms``;
- ``ql_run_event.dedupe_key`` (nullable, unique) for idempotent worker-submitted events;
- ``ix_ql_run_queued``: the queue, oldest first (partial: ``status = 'queued'``).

PostgreSQL only (the cluster-fenced journal backend; see docs/cluster-control-db.md):
- tables ``ql_worker``, ``ql_attempt_lease``, ``ql_run_spec`` and sequence ``ql_lease_generation_seq``;
- the operations as functions, each ONE transaction deciding with the database clock:
  ``ql_submit``, ``ql_request_cancel`` (control side), ``ql_register``, ``ql_heartbeat``,
  ``ql_claim``, ``ql_start``, ``ql_running``, ``ql_renew``, ``ql_complete``,
  ``ql_end_without_completion`` (worker side), ``ql_sweep`` (``ql control``) and the pure
  ``ql_map_outcome``. Functions named ``ql__*`` are private helpers.

Lock order in every function: ql_run → ql_run_attempt → ql_attempt_lease → ql_worker. The only
out-of-order locks are taken with SKIP LOCKED (they never wait, so they cannot close a cycle).

Revision ID: 0003_cluster_control
Revises: 0002_plugin_seams
"""

import sqlalchemy as sa
from alembic import op

from ql_core.db.pg_migration import execute_statements, split_statements
from sqlalchemy.dialects import postgresql

revision = "0003_cluster_control"
down_revision = "0002_plugin_seams"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ql_run") as batch:
        batch.add_column(sa.Column("max_attempts", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("timeout_ms", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("ql_run_event") as batch:
        batch.add_column(sa.Column("dedupe_key", sa.String(length=160), nullable=True))
    op.create_index("ux_ql_event_dedupe", "ql_run_event", ["dedupe_key"], unique=True)
    op.create_index("ix_ql_run_queued", "ql_run", ["created_at_ms", "id"], unique=False,
                    postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))

    if op.get_bind().dialect.name != "postgresql":
        return

    op.create_table(
        "ql_worker",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("session", sa.String(length=36), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("lease_expires_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("registered_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("ql_version", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "ql_attempt_lease",
        sa.Column("attempt_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("lease_generation", sa.BigInteger(), nullable=False),
        sa.Column("token_digest", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("worker_generation", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("claimed_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("started_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("running_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("renewed_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("intent_delivered_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("ended_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("end_reason", sa.String(length=16), nullable=True),
        sa.Column("completion_digest", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["ql_run_attempt.id"]),
        sa.PrimaryKeyConstraint("attempt_id"),
    )
    op.create_index("ix_ql_lease_live_expiry", "ql_attempt_lease", ["expires_at_ms"], unique=False,
                    postgresql_where=sa.text("status IN ('claimed', 'starting', 'running')"))
    op.create_index("ix_ql_lease_ended", "ql_attempt_lease", ["ended_at_ms"], unique=False,
                    postgresql_where=sa.text("status = 'ended'"))
    op.create_index("ux_ql_lease_generation", "ql_attempt_lease", ["lease_generation"], unique=True)
    op.create_table(
        "ql_run_spec",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["ql_run.id"]),
        sa.PrimaryKeyConstraint("run_id"),
    )
    execute_statements(op, SQL_STATEMENTS)


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


# ---------------------------------------------------------------------------------------------
# PL/pgSQL. Conventions: every function body starts with "#variable_conflict use_column" (an
# OUT parameter named like a column never shadows the column); no dynamic SQL, no temp tables,
# unqualified names only — so a later revision can ALTER them to SECURITY DEFINER with a pinned
# search_path without a rewrite. Error messages never echo a parameter's value.
# ---------------------------------------------------------------------------------------------

_PRIVATE = r"""
CREATE SEQUENCE ql_lease_generation_seq AS bigint START 1;

CREATE FUNCTION ql__clock_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
  SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

CREATE FUNCTION ql__digest(p_token text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT encode(sha256(convert_to(coalesce(p_token, ''), 'UTF8')), 'hex')
$$;

-- 64 characters of [A-Za-z0-9_-]: three v4 UUIDs = 366 random bits from pg_strong_random().
CREATE FUNCTION ql__new_token() RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
                          || uuid_send(gen_random_uuid()), 'base64'), '+/=' || chr(10), '-_')
$$;

CREATE FUNCTION ql__is_id(p text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
  SELECT p IS NOT NULL
     AND p ~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
$$;

CREATE FUNCTION ql__check(p_ok boolean, p_what text) RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_ok IS NOT TRUE THEN
    RAISE EXCEPTION 'ql: invalid argument: %', p_what USING ERRCODE = '22023';
  END IF;
END $$;

CREATE FUNCTION ql__event(p_run_id text, p_seq integer, p_type text, p_attempt_id text,
                          p_status text, p_exit_code integer, p_reason text, p_at_ms bigint,
                          p_dedupe_key text DEFAULT NULL) RETURNS void LANGUAGE sql VOLATILE AS $$
  INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, exit_code, reason, at_ms, dedupe_key)
  VALUES (p_run_id, p_seq, p_type, p_attempt_id, p_status, p_exit_code, p_reason, p_at_ms, p_dedupe_key)
$$;

-- Clamp a worker-reported time to the database clock: later than now + 5 min → now; never
-- earlier than p_floor.
CREATE FUNCTION ql__clamp_ms(p_ms bigint, p_now bigint, p_floor bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT greatest(CASE WHEN p_ms IS NULL OR p_ms > p_now + 300000 THEN p_now ELSE p_ms END,
                  coalesce(p_floor, p_ms, p_now))
$$;

-- Attempts of a run that may have started (the retry policy's count). Attempts ended while
-- provably never started (their lease was still 'claimed', or the holder released them before
-- spawning) do not count.
CREATE FUNCTION ql__attempts_used(p_run_id text) RETURNS integer LANGUAGE sql STABLE AS $$
  SELECT count(*)::integer FROM ql_run_attempt
   WHERE run_id = p_run_id AND coalesce(reason, '') NOT IN ('CLAIM_EXPIRED', 'RELEASED')
$$;
"""

_MAP_OUTCOME = r"""
-- The outcome rule (DESIGN.md §2; the same table as core's Python). Pure.
--   natural = succeeded if exit 0 else failed.
--   Intents: a user/policy/shutdown cancel (cancel_requested_at_ms, cancelled, reason); the deadline
--   whenever set (deadline_at_ms, timed_out, timeout); a timeout cancel without deadline
--   (cancel_requested_at_ms, timed_out, timeout). An intent whose time is unknown (NULL) applies.
--   1. signalled and a cancel intent committed → that intent (never moot).
--   2. else the applicable intents are those with finished_at_ms >= their time; the earliest
--      wins, a tie goes to the committed cancel intent.
--   3. none applicable → natural; a committed cancel intent is then moot.
CREATE FUNCTION ql_map_outcome(p_cancel_reason text, p_cancel_requested_at_ms bigint,
                               p_deadline_at_ms bigint, p_signalled boolean, p_exit_code integer,
                               p_finished_at_ms bigint,
                               OUT status text, OUT reason text, OUT moot boolean)
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
DECLARE
  v_natural text := CASE WHEN p_exit_code = 0 THEN 'succeeded' ELSE 'failed' END;
  v_c_status text;
  v_c_time bigint;
  v_found boolean := false;
  v_best_time bigint;
BEGIN
  moot := false;
  IF p_cancel_reason IS NOT NULL THEN
    IF p_cancel_reason = 'timeout' THEN
      v_c_status := 'timed_out';
      v_c_time := coalesce(p_deadline_at_ms, p_cancel_requested_at_ms);
    ELSE
      v_c_status := 'cancelled';
      v_c_time := p_cancel_requested_at_ms;
    END IF;
    IF p_signalled THEN
      status := v_c_status; reason := p_cancel_reason; RETURN;
    END IF;
    IF v_c_time IS NULL OR p_finished_at_ms >= v_c_time THEN
      v_found := true; v_best_time := v_c_time;
      status := v_c_status; reason := p_cancel_reason;
    END IF;
  END IF;
  IF p_deadline_at_ms IS NOT NULL AND p_finished_at_ms >= p_deadline_at_ms
     AND (NOT v_found OR (v_best_time IS NOT NULL AND p_deadline_at_ms < v_best_time)) THEN
    v_found := true; v_best_time := p_deadline_at_ms;
    status := 'timed_out'; reason := 'timeout';
  END IF;
  IF NOT v_found THEN
    status := v_natural; reason := NULL; moot := p_cancel_reason IS NOT NULL;
  END IF;
END $$;
"""

_TRANSITIONS = r"""
-- End an attempt and its run in one terminal transition (rows locked by the caller):
-- events [run.cancel_moot], attempt.<status>, run.<status>; the lease ends; the spec is erased.
CREATE FUNCTION ql__finish(p_run_id text, p_attempt_id text, p_status text, p_exit_code integer,
                           p_reason text, p_started_at_ms bigint, p_finished_at_ms bigint,
                           p_moot boolean, p_end_reason text, p_completion_digest text,
                           p_now bigint) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
  v_seq integer;
BEGIN
  SELECT * INTO STRICT v_run FROM ql_run WHERE id = p_run_id;
  v_seq := v_run.event_seq;
  IF p_moot THEN
    v_seq := v_seq + 1;
    PERFORM ql__event(p_run_id, v_seq, 'run.cancel_moot', p_attempt_id, NULL, NULL, v_run.cancel_reason, p_now);
  END IF;
  PERFORM ql__event(p_run_id, v_seq + 1, 'attempt.' || p_status, p_attempt_id, p_status, p_exit_code, p_reason, p_now);
  PERFORM ql__event(p_run_id, v_seq + 2, 'run.' || p_status, p_attempt_id, p_status, p_exit_code, p_reason, p_now);
  UPDATE ql_run_attempt
     SET status = p_status, exit_code = p_exit_code, reason = p_reason,
         started_at_ms = coalesce(started_at_ms, p_started_at_ms),
         finished_at_ms = p_finished_at_ms, version = version + 1
   WHERE id = p_attempt_id;
  UPDATE ql_run
     SET status = p_status, exit_code = p_exit_code, reason = p_reason,
         finished_at_ms = greatest(p_finished_at_ms, created_at_ms), updated_at_ms = p_now,
         version = version + 1, event_seq = v_seq + 2
   WHERE id = p_run_id AND version = v_run.version AND event_seq = v_run.event_seq;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ql: run changed under its lock' USING ERRCODE = '40001';
  END IF;
  UPDATE ql_attempt_lease
     SET status = 'ended', ended_at_ms = p_now, end_reason = p_end_reason,
         completion_digest = p_completion_digest, version = version + 1
   WHERE attempt_id = p_attempt_id AND status <> 'ended';
  DELETE FROM ql_run_spec WHERE run_id = p_run_id;
END $$;

-- An attempt that provably never started (lease 'claimed', or released by its holder before
-- spawning) goes back to the queue without consuming a retry: attempt 'lost' with p_reason,
-- run 'queued', events attempt.lost + run.requeued.
CREATE FUNCTION ql__requeue_unstarted(p_run_id text, p_attempt_id text, p_reason text,
                                      p_end_reason text, p_now bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
BEGIN
  SELECT * INTO STRICT v_run FROM ql_run WHERE id = p_run_id;
  PERFORM ql__event(p_run_id, v_run.event_seq + 1, 'attempt.lost', p_attempt_id, 'lost', NULL, p_reason, p_now);
  PERFORM ql__event(p_run_id, v_run.event_seq + 2, 'run.requeued', p_attempt_id, 'queued', NULL, p_reason, p_now);
  UPDATE ql_run_attempt SET status = 'lost', reason = p_reason,
         finished_at_ms = greatest(p_now, created_at_ms), version = version + 1
   WHERE id = p_attempt_id;
  UPDATE ql_run SET status = 'queued', current_attempt_id = NULL, deadline_at_ms = NULL,
         updated_at_ms = p_now, version = version + 1, event_seq = v_run.event_seq + 2
   WHERE id = p_run_id AND version = v_run.version;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ql: run changed under its lock' USING ERRCODE = '40001';
  END IF;
  UPDATE ql_attempt_lease SET status = 'ended', ended_at_ms = p_now, end_reason = p_end_reason,
         version = version + 1
   WHERE attempt_id = p_attempt_id AND status <> 'ended';
END $$;

-- An attempt that may have started ends 'lost' (p_reason). The run gets another attempt (back to
-- 'queued', event run.requeued) only when no cancel intent is committed and its retry policy
-- allows; else the run ends 'lost'. Returns 'requeued' or 'lost'.
CREATE FUNCTION ql__lose(p_run_id text, p_attempt_id text, p_reason text, p_end_reason text,
                         p_now bigint) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
  v_att ql_run_attempt%ROWTYPE;
  v_finished bigint;
BEGIN
  SELECT * INTO STRICT v_run FROM ql_run WHERE id = p_run_id;
  SELECT * INTO STRICT v_att FROM ql_run_attempt WHERE id = p_attempt_id;
  v_finished := greatest(p_now, v_att.created_at_ms, coalesce(v_att.started_at_ms, 0));
  IF v_run.cancel_reason IS NULL AND ql__attempts_used(p_run_id) < v_run.max_attempts THEN
    PERFORM ql__event(p_run_id, v_run.event_seq + 1, 'attempt.lost', p_attempt_id, 'lost', NULL, p_reason, p_now);
    PERFORM ql__event(p_run_id, v_run.event_seq + 2, 'run.requeued', p_attempt_id, 'queued', NULL, p_reason, p_now);
    UPDATE ql_run_attempt SET status = 'lost', reason = p_reason, finished_at_ms = v_finished,
           version = version + 1
     WHERE id = p_attempt_id;
    UPDATE ql_run SET status = 'queued', current_attempt_id = NULL, deadline_at_ms = NULL,
           updated_at_ms = p_now, version = version + 1, event_seq = v_run.event_seq + 2
     WHERE id = p_run_id AND version = v_run.version;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'ql: run changed under its lock' USING ERRCODE = '40001';
    END IF;
    UPDATE ql_attempt_lease SET status = 'ended', ended_at_ms = p_now, end_reason = p_end_reason,
           version = version + 1
     WHERE attempt_id = p_attempt_id AND status <> 'ended';
    RETURN 'requeued';
  END IF;
  PERFORM ql__finish(p_run_id, p_attempt_id, 'lost', NULL, p_reason, NULL, v_finished, false,
                     p_end_reason, NULL, p_now);
  RETURN 'lost';
END $$;

-- The fence of a per-attempt call, checked against rows the caller has locked. Returns NULL when
-- the caller holds the lease and it grants something now, else the reason it is fenced.
-- p_identity_only: check only that the caller is the holder the lease recorded (for replays).
CREATE FUNCTION ql__fence(v_lease ql_attempt_lease, v_worker ql_worker, p_worker_id text,
                          p_worker_generation bigint, p_session text, p_lease_generation bigint,
                          p_token_digest text, p_now bigint, p_identity_only boolean)
RETURNS text LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
  IF v_lease.attempt_id IS NULL THEN RETURN 'NO_LEASE'; END IF;
  IF v_lease.worker_id IS DISTINCT FROM p_worker_id THEN RETURN 'WRONG_WORKER'; END IF;
  IF v_lease.worker_generation IS DISTINCT FROM p_worker_generation THEN
    RETURN 'STALE_WORKER_GENERATION';
  END IF;
  IF v_lease.lease_generation IS DISTINCT FROM p_lease_generation THEN
    RETURN 'STALE_LEASE_GENERATION';
  END IF;
  IF v_lease.token_digest IS DISTINCT FROM p_token_digest THEN RETURN 'WRONG_TOKEN'; END IF;
  IF p_identity_only THEN RETURN NULL; END IF;
  IF v_worker.id IS NULL OR v_worker.generation IS DISTINCT FROM p_worker_generation THEN
    RETURN 'STALE_WORKER_GENERATION';
  END IF;
  IF v_worker.session IS DISTINCT FROM p_session THEN RETURN 'WRONG_SESSION'; END IF;
  IF v_lease.status = 'ended' THEN RETURN 'LEASE_ENDED'; END IF;
  IF v_lease.expires_at_ms <= p_now THEN RETURN 'LEASE_EXPIRED'; END IF;
  RETURN NULL;
END $$;
"""

_CONTROL = r"""
-- Control side: insert a queued run and its spec. Idempotent on run id ('exists').
CREATE FUNCTION ql_submit(p_run_id text, p_name text, p_spec jsonb, p_timeout_ms bigint,
                          p_max_attempts integer,
                          OUT answer text, OUT created_at_ms bigint, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
BEGIN
  PERFORM ql__check(ql__is_id(p_run_id), 'run_id');
  PERFORM ql__check(p_name IS NULL OR length(p_name) <= 200, 'name');
  PERFORM ql__check(jsonb_typeof(p_spec) = 'object', 'spec');
  PERFORM ql__check(p_timeout_ms IS NULL OR p_timeout_ms > 0, 'timeout_ms');
  PERFORM ql__check(p_max_attempts BETWEEN 1 AND 100, 'max_attempts');
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
  INSERT INTO ql_run_spec (run_id, spec, created_at_ms) VALUES (p_run_id, p_spec, v_now);
  PERFORM ql__event(p_run_id, 1, 'run.created', NULL, 'queued', NULL, NULL, v_now);
  answer := 'created';
  created_at_ms := v_now;
END $$;

-- Control side: commit a cancel intent (reason user|policy|shutdown|timeout).
--   queued run, or its attempt's lease still 'claimed' (provably never spawned) → ended at once
--   ('cancelled'); a started attempt → intent only ('requested'), the lease holder learns it on
--   renew; a run with an intent → 'already_requested'; terminal → 'already_terminal' (no event).
CREATE FUNCTION ql_request_cancel(p_run_id text, p_reason text,
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
  IF v_run.status = 'queued' THEN
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

_WORKER_SESSION = r"""
-- A worker process starts: a new session takes the worker id and bumps its generation (fencing
-- the older process); the same session again (a retry after a lost response) keeps it.
CREATE FUNCTION ql_register(p_worker_id text, p_session text, p_slots integer, p_ql_version text,
                            p_ttl_ms bigint,
                            OUT generation bigint, OUT lease_expires_at_ms bigint, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
BEGIN
  PERFORM ql__check(p_worker_id ~ '^[A-Za-z0-9._:-]{1,64}$', 'worker_id');
  PERFORM ql__check(p_session ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$', 'session');
  PERFORM ql__check(p_slots BETWEEN 1 AND 4096, 'slots');
  PERFORM ql__check(length(p_ql_version) BETWEEN 1 AND 32, 'ql_version');
  PERFORM ql__check(p_ttl_ms BETWEEN 1000 AND 3600000, 'ttl_ms');
  v_now := ql__clock_ms();
  INSERT INTO ql_worker AS w (id, session, generation, status, version, slots, lease_expires_at_ms,
                              registered_at_ms, heartbeat_at_ms, ql_version)
  VALUES (p_worker_id, p_session, 1, 'active', 1, p_slots, v_now + p_ttl_ms, v_now, v_now, p_ql_version)
  ON CONFLICT (id) DO UPDATE
     SET generation = CASE WHEN w.session = EXCLUDED.session THEN w.generation ELSE w.generation + 1 END,
         registered_at_ms = CASE WHEN w.session = EXCLUDED.session THEN w.registered_at_ms ELSE v_now END,
         session = EXCLUDED.session, status = 'active', version = w.version + 1,
         slots = EXCLUDED.slots, lease_expires_at_ms = EXCLUDED.lease_expires_at_ms,
         heartbeat_at_ms = v_now, ql_version = EXCLUDED.ql_version
  RETURNING w.generation, w.lease_expires_at_ms INTO generation, lease_expires_at_ms;
  db_now_ms := v_now;
END $$;

-- The worker session lease: 'ok' + new expiry, or 'fenced' (another process registered the id).
CREATE FUNCTION ql_heartbeat(p_worker_id text, p_generation bigint, p_session text, p_ttl_ms bigint,
                             OUT answer text, OUT lease_expires_at_ms bigint, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
BEGIN
  PERFORM ql__check(p_ttl_ms BETWEEN 1000 AND 3600000, 'ttl_ms');
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  UPDATE ql_worker w SET lease_expires_at_ms = v_now + p_ttl_ms, heartbeat_at_ms = v_now,
         version = w.version + 1
   WHERE w.id = p_worker_id AND w.generation = p_generation AND w.session = p_session
  RETURNING w.lease_expires_at_ms INTO lease_expires_at_ms;
  answer := CASE WHEN FOUND THEN 'ok' ELSE 'fenced' END;
END $$;
"""

_CLAIM = r"""
-- Claim up to least(max_n, free_slots, 8, #ids) queued runs, oldest first, FOR UPDATE SKIP
-- LOCKED. Per run: a new attempt ('starting', id and log id from the caller), a lease ('claimed',
-- a fresh lease_generation, a random token returned ONCE — only its SHA-256 is stored, also as
-- the attempt's callback_token_hash), run → 'running', event attempt.claimed.
-- Zero rows: nothing to claim. One row with answer 'fenced': the worker's fence is stale or its
-- session lease expired (nothing claimed).
CREATE FUNCTION ql_claim(p_worker_id text, p_generation bigint, p_session text, p_max_n integer,
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
    SELECT r.id, r.created_at_ms FROM ql_run r WHERE r.status = 'queued'
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

_LEASE_OPS = r"""
-- start / running / renew share one answer shape: 'ok' or 'fenced' (+ reason), the lease expiry,
-- the database clock and the run's intents (cancel_reason, cancel_requested_at_ms, deadline).

-- claimed → starting under a live lease; the worker calls it BEFORE spawning. Replays of a
-- started lease answer 'ok' without a change.
CREATE FUNCTION ql_start(p_worker_id text, p_worker_generation bigint, p_session text,
                         p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                         OUT answer text, OUT reason text, OUT lease_expires_at_ms bigint,
                         OUT db_now_ms bigint, OUT cancel_reason text,
                         OUT cancel_requested_at_ms bigint, OUT deadline_at_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_worker ql_worker%ROWTYPE;
  v_now bigint;
BEGIN
  SELECT * INTO v_run FROM ql_run r WHERE r.id = (SELECT a.run_id FROM ql_run_attempt a WHERE a.id = p_attempt_id)
     FOR NO KEY UPDATE;
  PERFORM 1 FROM ql_run_attempt a WHERE a.id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_worker FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session, p_lease_generation,
                      ql__digest(p_lease_token), v_now, false);
  IF reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;
  IF v_lease.status = 'claimed' THEN
    UPDATE ql_attempt_lease l SET status = 'starting', started_at_ms = v_now, version = l.version + 1
     WHERE l.attempt_id = p_attempt_id;
  END IF;
  IF v_run.cancel_reason IS NOT NULL AND v_lease.intent_delivered_at_ms IS NULL THEN
    UPDATE ql_attempt_lease l SET intent_delivered_at_ms = v_now WHERE l.attempt_id = p_attempt_id;
  END IF;
  answer := 'ok';
  lease_expires_at_ms := v_lease.expires_at_ms;
  cancel_reason := v_run.cancel_reason;
  cancel_requested_at_ms := v_run.cancel_requested_at_ms;
  deadline_at_ms := v_run.deadline_at_ms;
END $$;

-- starting → running: the worker reports the process spawned (its start time, clamped to the
-- database clock). Attempt 'running', event attempt.spawned, deadline = db now + timeout_ms.
-- A replay of a running lease answers 'ok' without a change; a 'claimed' lease is fenced
-- (NOT_STARTED: ql_start must come first).
CREATE FUNCTION ql_running(p_worker_id text, p_worker_generation bigint, p_session text,
                           p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                           p_started_at_ms bigint,
                           OUT answer text, OUT reason text, OUT lease_expires_at_ms bigint,
                           OUT db_now_ms bigint, OUT cancel_reason text,
                           OUT cancel_requested_at_ms bigint, OUT deadline_at_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
  v_att ql_run_attempt%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_worker ql_worker%ROWTYPE;
  v_now bigint;
  v_deadline bigint;
BEGIN
  SELECT * INTO v_run FROM ql_run r WHERE r.id = (SELECT a.run_id FROM ql_run_attempt a WHERE a.id = p_attempt_id)
     FOR NO KEY UPDATE;
  SELECT * INTO v_att FROM ql_run_attempt a WHERE a.id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_worker FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session, p_lease_generation,
                      ql__digest(p_lease_token), v_now, false);
  IF reason IS NULL AND v_lease.status = 'claimed' THEN reason := 'NOT_STARTED'; END IF;
  IF reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;
  v_deadline := v_run.deadline_at_ms;
  IF v_lease.status = 'starting' THEN
    v_deadline := CASE WHEN v_run.timeout_ms IS NULL THEN NULL ELSE v_now + v_run.timeout_ms END;
    UPDATE ql_attempt_lease l SET status = 'running', running_at_ms = v_now, version = l.version + 1
     WHERE l.attempt_id = p_attempt_id;
    UPDATE ql_run_attempt a SET status = 'running',
           started_at_ms = ql__clamp_ms(p_started_at_ms, v_now, v_att.created_at_ms),
           deadline_at_ms = v_deadline, version = a.version + 1
     WHERE a.id = p_attempt_id;
    PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'attempt.spawned', p_attempt_id, 'running', NULL, NULL, v_now);
    UPDATE ql_run r SET deadline_at_ms = v_deadline, updated_at_ms = v_now, version = r.version + 1,
           event_seq = r.event_seq + 1
     WHERE r.id = v_run.id;
  END IF;
  IF v_run.cancel_reason IS NOT NULL AND v_lease.intent_delivered_at_ms IS NULL THEN
    UPDATE ql_attempt_lease l SET intent_delivered_at_ms = v_now WHERE l.attempt_id = p_attempt_id;
  END IF;
  answer := 'ok';
  lease_expires_at_ms := v_lease.expires_at_ms;
  cancel_reason := v_run.cancel_reason;
  cancel_requested_at_ms := v_run.cancel_requested_at_ms;
  deadline_at_ms := v_deadline;
END $$;

-- Extend a live lease to db now + ttl and hand the holder the run's intents (recording when a
-- cancel intent was first delivered). An expired lease is never revived: 'fenced'.
CREATE FUNCTION ql_renew(p_worker_id text, p_worker_generation bigint, p_session text,
                         p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                         p_ttl_ms bigint,
                         OUT answer text, OUT reason text, OUT lease_expires_at_ms bigint,
                         OUT db_now_ms bigint, OUT cancel_reason text,
                         OUT cancel_requested_at_ms bigint, OUT deadline_at_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_run ql_run%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_worker ql_worker%ROWTYPE;
  v_now bigint;
BEGIN
  PERFORM ql__check(p_ttl_ms BETWEEN 1000 AND 3600000, 'ttl_ms');
  SELECT * INTO v_run FROM ql_run r WHERE r.id = (SELECT a.run_id FROM ql_run_attempt a WHERE a.id = p_attempt_id)
     FOR NO KEY UPDATE;
  PERFORM 1 FROM ql_run_attempt a WHERE a.id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_worker FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session, p_lease_generation,
                      ql__digest(p_lease_token), v_now, false);
  IF reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;
  UPDATE ql_attempt_lease l
     SET expires_at_ms = v_now + p_ttl_ms, renewed_at_ms = v_now, version = l.version + 1,
         intent_delivered_at_ms = CASE WHEN v_run.cancel_reason IS NOT NULL
                                       THEN coalesce(l.intent_delivered_at_ms, v_now) END
   WHERE l.attempt_id = p_attempt_id;
  answer := 'ok';
  lease_expires_at_ms := v_now + p_ttl_ms;
  cancel_reason := v_run.cancel_reason;
  cancel_requested_at_ms := v_run.cancel_requested_at_ms;
  deadline_at_ms := v_run.deadline_at_ms;
END $$;
"""

_COMPLETE = r"""
-- The lease holder's completion (from its receipt). Answers, all final:
--   applied           the terminal transition committed now;
--   already_completed an exact replay (same completion_digest) of the completion that was applied;
--   already_terminal  the holder ended this attempt before with another payload / without a
--                     receipt (one attempt.late_callback_ignored event per payload);
--   fenced            anything else: stale worker generation, stale lease generation, wrong token,
--                     another worker, lease expired or ended by someone else, never started.
--                     One attempt.completion_fenced audit event per (attempt, payload); the run and
--                     attempt never change.
-- Worker times are clamped to the database clock. ``signalled`` counts only when the run's cancel
-- intent was delivered to this lease holder (the worker cannot have signalled for it otherwise).
CREATE FUNCTION ql_complete(p_worker_id text, p_worker_generation bigint, p_session text,
                            p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                            p_exit_code integer, p_started_at_ms bigint, p_finished_at_ms bigint,
                            p_signalled boolean, p_completion_digest text,
                            OUT answer text, OUT status text, OUT reason text, OUT fence_reason text,
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
  v_started bigint;
  v_finished bigint;
  v_deadline bigint;
  v_signalled boolean;
  v_moot boolean;
  v_key text;
BEGIN
  PERFORM ql__check(p_completion_digest ~ '^[0-9a-f]{64}$', 'completion_digest');
  PERFORM ql__check(p_exit_code IS NOT NULL AND p_finished_at_ms IS NOT NULL, 'exit_code/finished_at_ms');
  SELECT * INTO v_run FROM ql_run r WHERE r.id = (SELECT a.run_id FROM ql_run_attempt a WHERE a.id = p_attempt_id)
     FOR NO KEY UPDATE;
  SELECT * INTO v_att FROM ql_run_attempt a WHERE a.id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  SELECT * INTO v_worker FROM ql_worker w WHERE w.id = p_worker_id FOR SHARE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  IF v_att.id IS NULL OR v_run.id IS NULL THEN
    answer := 'fenced'; fence_reason := 'UNKNOWN_ATTEMPT'; RETURN;
  END IF;
  v_digest := ql__digest(p_lease_token);
  IF v_lease.attempt_id IS NULL THEN
    -- The lease row is gone (retention): only the attempt's token hash and owner are left.
    IF v_att.callback_token_hash = v_digest AND v_att.runtime_owner = p_worker_id
       AND v_att.status NOT IN ('starting', 'running') THEN
      answer := 'already_terminal'; status := v_att.status; reason := v_att.reason; RETURN;
    END IF;
    fence_reason := 'NO_LEASE';
  ELSE
    fence_reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session,
                              p_lease_generation, v_digest, v_now, true);
  END IF;
  IF fence_reason IS NULL AND v_lease.status = 'ended' THEN
    IF v_lease.end_reason = 'completed' AND v_lease.completion_digest = p_completion_digest THEN
      answer := 'already_completed'; status := v_att.status; reason := v_att.reason; RETURN;
    END IF;
    IF v_lease.end_reason IN ('completed', 'worker_lost') THEN
      answer := 'already_terminal'; status := v_att.status; reason := v_att.reason;
      v_key := 'late:' || p_attempt_id || ':' || p_completion_digest;
      IF NOT EXISTS (SELECT 1 FROM ql_run_event e WHERE e.dedupe_key = v_key) THEN
        PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'attempt.late_callback_ignored', p_attempt_id,
                          v_att.status, p_exit_code, NULL, v_now, v_key);
        UPDATE ql_run r SET event_seq = r.event_seq + 1 WHERE r.id = v_run.id;
      END IF;
      RETURN;
    END IF;
    fence_reason := 'LEASE_' || upper(v_lease.end_reason);
  END IF;
  IF fence_reason IS NULL THEN
    fence_reason := ql__fence(v_lease, v_worker, p_worker_id, p_worker_generation, p_session,
                              p_lease_generation, v_digest, v_now, false);
  END IF;
  IF fence_reason IS NULL AND v_lease.status = 'claimed' THEN fence_reason := 'NOT_STARTED'; END IF;
  IF fence_reason IS NULL AND (v_run.current_attempt_id IS DISTINCT FROM p_attempt_id
                               OR v_run.status <> 'running' OR v_att.status NOT IN ('starting', 'running')) THEN
    fence_reason := 'INCONSISTENT_STATE';
  END IF;
  IF fence_reason IS NOT NULL THEN
    answer := 'fenced';
    v_key := 'fenced:' || p_attempt_id || ':' || p_completion_digest;
    IF NOT EXISTS (SELECT 1 FROM ql_run_event e WHERE e.dedupe_key = v_key) THEN
      PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'attempt.completion_fenced', p_attempt_id, NULL,
                        p_exit_code, fence_reason, v_now, v_key);
      UPDATE ql_run r SET event_seq = r.event_seq + 1 WHERE r.id = v_run.id;
    END IF;
    RETURN;
  END IF;

  -- Apply. Times: clamped to the database clock, never before what the database committed.
  v_started := coalesce(v_att.started_at_ms, ql__clamp_ms(p_started_at_ms, v_now, v_att.created_at_ms));
  v_finished := ql__clamp_ms(p_finished_at_ms, v_now, greatest(v_started, v_att.created_at_ms));
  v_deadline := v_run.deadline_at_ms;
  IF v_lease.status = 'starting' AND v_run.timeout_ms IS NOT NULL THEN
    -- ql_running never committed: the deadline runs from the (clamped) reported start.
    v_deadline := v_started + v_run.timeout_ms;
    UPDATE ql_run r SET deadline_at_ms = v_deadline WHERE r.id = v_run.id;
    UPDATE ql_run_attempt a SET deadline_at_ms = v_deadline WHERE a.id = p_attempt_id;
  END IF;
  v_signalled := coalesce(p_signalled, false) AND v_lease.intent_delivered_at_ms IS NOT NULL;
  SELECT o.status, o.reason, o.moot INTO status, reason, v_moot
    FROM ql_map_outcome(v_run.cancel_reason, v_run.cancel_requested_at_ms, v_deadline, v_signalled,
                        p_exit_code, v_finished) o;
  PERFORM ql__finish(v_run.id, p_attempt_id, status, p_exit_code, reason, v_started, v_finished, v_moot,
                     'completed', p_completion_digest, v_now);
  answer := 'applied';
END $$;

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
CREATE FUNCTION ql_end_without_completion(p_worker_id text, p_worker_generation bigint, p_session text,
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
  IF fence_reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;

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

_SWEEP = r"""
-- ql control's bounded sweeper; one transaction, at most p_limit (default 16, hard cap 64) rows
-- per step, FOR UPDATE SKIP LOCKED so that concurrent sweepers split the work and never both act:
--  (a) expired 'claimed' leases: never started → run back to 'queued' (CLAIM_EXPIRED, no retry
--      consumed; events attempt.lost + run.requeued);
--  (b) expired 'starting'/'running' leases: attempt 'lost' (LEASE_EXPIRED); run 'queued' for a new
--      attempt when its retry policy allows and no cancel intent is committed, else run 'lost';
--  (c) running attempts past their deadline and no intent yet: commit the timeout intent
--      (cancel_reason 'timeout', event run.cancel_requested); the lease holder learns it on renew;
--  (d) retention: ended leases older than p_retention_ms; specs of runs that ended elsewhere.
-- Each candidate is re-checked after its rows are locked (someone may have renewed or ended it).
CREATE FUNCTION ql_sweep(p_limit integer DEFAULT 16, p_retention_ms bigint DEFAULT 3600000)
RETURNS TABLE (requeued integer, lost integer, retried integer, timeouts integer,
               leases_deleted integer, specs_deleted integer, skipped integer, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_limit integer := least(greatest(coalesce(p_limit, 16), 1), 64);
  v_now bigint := ql__clock_ms();
  v_cand record;
  v_lease ql_attempt_lease%ROWTYPE;
  v_run ql_run%ROWTYPE;
  v_att ql_run_attempt%ROWTYPE;
  v_result text;
BEGIN
  PERFORM ql__check(p_retention_ms IS NULL OR p_retention_ms >= 0, 'retention_ms');
  requeued := 0; lost := 0; retried := 0; timeouts := 0; leases_deleted := 0; specs_deleted := 0;
  skipped := 0;
  -- (a) + (b). The lease is locked before its run, but only with SKIP LOCKED, and the run after
  -- it too: neither ever waits, so no cycle with the run → attempt → lease order can form.
  FOR v_cand IN
    SELECT l.attempt_id, l.run_id FROM ql_attempt_lease l
     WHERE l.status IN ('claimed', 'starting', 'running') AND l.expires_at_ms <= v_now
     ORDER BY l.expires_at_ms LIMIT v_limit FOR NO KEY UPDATE SKIP LOCKED
  LOOP
    SELECT * INTO v_run FROM ql_run r WHERE r.id = v_cand.run_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN skipped := skipped + 1; CONTINUE; END IF;
    SELECT * INTO v_att FROM ql_run_attempt a WHERE a.id = v_cand.attempt_id FOR NO KEY UPDATE;
    SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = v_cand.attempt_id;
    v_now := ql__clock_ms();
    IF v_lease.status NOT IN ('claimed', 'starting', 'running') OR v_lease.expires_at_ms > v_now THEN
      CONTINUE;
    END IF;
    IF v_run.current_attempt_id IS DISTINCT FROM v_cand.attempt_id OR v_run.status <> 'running'
       OR v_att.status NOT IN ('starting', 'running') THEN
      -- Not this lease's run any more (ended through another path): just close the lease.
      UPDATE ql_attempt_lease l SET status = 'ended', ended_at_ms = v_now, end_reason = 'expired',
             version = l.version + 1 WHERE l.attempt_id = v_cand.attempt_id;
      CONTINUE;
    END IF;
    IF v_lease.status = 'claimed' THEN
      PERFORM ql__requeue_unstarted(v_run.id, v_cand.attempt_id, 'CLAIM_EXPIRED', 'expired', v_now);
      requeued := requeued + 1;
    ELSE
      v_result := ql__lose(v_run.id, v_cand.attempt_id, 'LEASE_EXPIRED', 'expired', v_now);
      IF v_result = 'requeued' THEN retried := retried + 1; ELSE lost := lost + 1; END IF;
    END IF;
  END LOOP;

  -- (c) deadlines.
  v_now := ql__clock_ms();
  FOR v_cand IN
    SELECT a.id AS attempt_id, a.run_id FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id
     WHERE a.status = 'running' AND a.deadline_at_ms <= v_now AND r.cancel_reason IS NULL
       AND r.status = 'running'
     ORDER BY a.deadline_at_ms LIMIT v_limit
  LOOP
    SELECT * INTO v_run FROM ql_run r WHERE r.id = v_cand.run_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN skipped := skipped + 1; CONTINUE; END IF;
    v_now := ql__clock_ms();
    IF v_run.status <> 'running' OR v_run.cancel_reason IS NOT NULL
       OR v_run.current_attempt_id IS DISTINCT FROM v_cand.attempt_id
       OR v_run.deadline_at_ms IS NULL OR v_run.deadline_at_ms > v_now THEN
      CONTINUE;
    END IF;
    PERFORM ql__event(v_run.id, v_run.event_seq + 1, 'run.cancel_requested', v_cand.attempt_id, NULL, NULL,
                      'timeout', v_now);
    UPDATE ql_run r SET cancel_reason = 'timeout', cancel_requested_at_ms = v_now, updated_at_ms = v_now,
           version = r.version + 1, event_seq = r.event_seq + 1
     WHERE r.id = v_run.id;
    timeouts := timeouts + 1;
  END LOOP;

  -- (d) retention.
  v_now := ql__clock_ms();
  WITH gone AS (
    DELETE FROM ql_attempt_lease d WHERE d.attempt_id IN (
      SELECT l.attempt_id FROM ql_attempt_lease l
       WHERE l.status = 'ended' AND l.ended_at_ms <= v_now - coalesce(p_retention_ms, 3600000)
       ORDER BY l.ended_at_ms LIMIT v_limit FOR UPDATE SKIP LOCKED)
    RETURNING 1)
  SELECT count(*) INTO leases_deleted FROM gone;
  WITH gone AS (
    DELETE FROM ql_run_spec d WHERE d.run_id IN (
      SELECT s.run_id FROM ql_run_spec s JOIN ql_run r ON r.id = s.run_id
       WHERE r.status NOT IN ('queued', 'running')
       LIMIT v_limit FOR UPDATE OF s SKIP LOCKED)
    RETURNING 1)
  SELECT count(*) INTO specs_deleted FROM gone;
  db_now_ms := v_now;
  RETURN NEXT;
END $$;
"""



#: Executed in order by :func:`upgrade` on PostgreSQL.
SQL_STATEMENTS = split_statements(_PRIVATE, _MAP_OUTCOME, _TRANSITIONS, _CONTROL, _WORKER_SESSION, _CLAIM,
                             _LEASE_OPS, _COMPLETE, _SWEEP)
