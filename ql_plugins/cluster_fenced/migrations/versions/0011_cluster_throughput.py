"""Cluster throughput: the claim's queue scan is bounded whatever the planner's statistics, and the
helpers every protocol call runs keep their plans.

PostgreSQL only (nothing changes on SQLite; no table or column changes — what the functions answer
and write is exactly what it was):

- ``ux_ql_event_dedupe`` becomes partial, ``WHERE dedupe_key IS NOT NULL``, as core's 0010 made it on
  SQLite: only the fenced audits set a key (``late:…``, ``fenced:…``), yet every one of the 4-5
  events of an attempt wrote a NULL entry into it. Same uniqueness for every key that exists; the
  audits' lookups (``dedupe_key = key``) use it as before; no statement relies on the NULL entries
  (no ``ON CONFLICT`` names this column).

- ``ql_start_many``, ``ql_running_many``, ``ql_renew_many``, ``ql_complete_many``: N calls of
  ``ql_start`` … ``ql_complete`` (their arguments as arrays) in ONE statement, where a worker's batch
  was N pipelined statements. Each element is the single function itself, called as is — the
  fencing rules stay in one place —, in order of attempt id (a fixed lock order), its row returned
  with its index (``ord``). Granted to the worker role by ``ql db grant-worker`` (roles.py); a client
  on a database without them, or a role not granted them yet, pipelines the single calls as before.

- ``ql__queued_runs(n)``: the oldest ``n`` runs queued for workers, locked (``FOR NO KEY UPDATE SKIP
  LOCKED``), oldest first — the statement ``ql_claim`` ran inline. It is pinned to an ordered index
  scan (``enable_sort``/``enable_seqscan``/``enable_bitmapscan`` off for this statement only): on
  a table without statistics (a fresh database, a burst before autovacuum's ANALYZE) the planner
  took a bitmap scan of every queued run plus a sort — each claim read the whole queue (1.4-5.8 ms
  for 3,000 queued runs against 0.04 ms) — and, with statistics of a mostly-queued table, a scan of
  ``ix_ql_run_created`` that reads every finished run before the first queued one once the history
  grows. Ordered, it reads at most ``n`` live queued entries (plus dead ones vacuum has not
  removed yet).
- ``ql_claim`` reads each locked run by its primary key in that order, instead of
  ``WHERE id = ANY (...) ORDER BY ...`` (without statistics that was a sequential scan of all of
  ``ql_run`` per claim). Everything else is 0005's body, statement for statement.
- ``ql__event`` and ``ql__attempts_used`` are PL/pgSQL instead of SQL: PostgreSQL 15 parses and
  plans a SQL function's body again in every transaction that calls it (its plan is not cached),
  PL/pgSQL keeps the plan for the session. ql__event runs 4-5 times per attempt; same statement,
  same rows. ``ql__digest`` (the token's SHA-256, 7 times per attempt) is declared ``STABLE`` instead
  of ``IMMUTABLE`` — what its body (``convert_to``) really is — so that it is inlined: an IMMUTABLE
  SQL function with a STABLE body is never inlined and was parsed and planned on every call.

Revision ID: 0011_cluster_throughput
Revises: 0008_worker_draining
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, no_downgrade, split_statements, upgrade_functions

revision = "0011_cluster_throughput"
down_revision = "0008_worker_draining"
branch_labels = None
depends_on = None

def upgrade() -> None:
    upgrade_functions(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


downgrade = no_downgrade


_INDEXES = r"""
DROP INDEX ux_ql_event_dedupe;
CREATE UNIQUE INDEX ux_ql_event_dedupe ON ql_run_event (dedupe_key) WHERE dedupe_key IS NOT NULL;
"""

_HELPERS = r"""
-- Same expression as 0003's; STABLE, not IMMUTABLE: convert_to() is only stable, and an IMMUTABLE SQL
-- function whose body is not is never inlined — every call parsed and planned the body again (0.01-0.05
-- ms, 7 calls per attempt). STABLE lets the planner inline it into the calling statement.
CREATE OR REPLACE FUNCTION ql__digest(p_token text) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT encode(sha256(convert_to(coalesce(p_token, ''), 'UTF8')), 'hex')
$$;

-- Same INSERT as 0003's SQL function; PL/pgSQL caches its plan for the session.
CREATE OR REPLACE FUNCTION ql__event(p_run_id text, p_seq integer, p_type text, p_attempt_id text,
                                     p_status text, p_exit_code integer, p_reason text, p_at_ms bigint,
                                     p_dedupe_key text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, exit_code, reason, at_ms, dedupe_key)
  VALUES (p_run_id, p_seq, p_type, p_attempt_id, p_status, p_exit_code, p_reason, p_at_ms, p_dedupe_key);
END $$;

-- Same count as 0003's SQL function (attempts that may have started); plan cached as above.
CREATE OR REPLACE FUNCTION ql__attempts_used(p_run_id text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN (SELECT count(*)::integer FROM ql_run_attempt a
           WHERE a.run_id = p_run_id AND coalesce(a.reason, '') NOT IN ('CLAIM_EXPIRED', 'RELEASED'));
END $$;

-- The oldest p_n runs queued for workers, locked, oldest first. The settings make the ordered index
-- scan (ix_ql_run_queued, or another index ordered by created_at_ms, id) the only plan: it stops
-- after p_n rows, where a sort or a bitmap scan reads the whole queue (see the revision's notes).
-- They hold for this function's statement only and are restored when it returns.
CREATE FUNCTION ql__queued_runs(p_n integer) RETURNS text[]
LANGUAGE plpgsql VOLATILE
SET enable_sort = off SET enable_seqscan = off SET enable_bitmapscan = off AS $$
BEGIN
  RETURN ARRAY(SELECT r.id FROM ql_run r
                WHERE r.status = 'queued' AND r.current_attempt_id IS NULL
                ORDER BY r.created_at_ms, r.id LIMIT p_n FOR NO KEY UPDATE SKIP LOCKED);
END $$;
"""

_CLAIM = r"""
-- 0005's ql_claim; the queue scan is ql__queued_runs and each locked run is read by its key.
CREATE OR REPLACE FUNCTION ql_claim(p_worker_id text, p_generation bigint, p_session text, p_max_n integer,
                                    p_free_slots integer, p_executor text, p_attempt_ids text[],
                                    p_log_ids text[], p_lease_ttl_ms bigint)
RETURNS TABLE(answer text, run_id text, attempt_id text, attempt_no integer, lease_generation bigint,
              lease_token text, spec_key_id text, spec_ordinal integer, sealed_spec bytea, timeout_ms bigint,
              lease_expires_at_ms bigint, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 8 SET search_path = pg_catalog, public AS $$
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
  v_ord integer;
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
  -- Oldest first, as locked: attempt ids are handed out in that order.
  FOR v_i IN 1 .. coalesce(array_length(v_run_ids, 1), 0) LOOP
    SELECT * INTO STRICT v_run FROM ql_run r WHERE r.id = v_run_ids[v_i];
    v_token := ql__new_token();
    v_digest := ql__digest(v_token);
    SELECT coalesce(max(a.attempt_no), 0) + 1 INTO v_no FROM ql_run_attempt a WHERE a.run_id = v_run.id;
    v_gen := nextval('ql_lease_generation_seq');
    -- 0005: the n-th attempt that may start gets sealed copy n (counted before it exists).
    v_ord := ql__attempts_used(v_run.id) + 1;
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
    SELECT s.key_id, s.ordinal, s.sealed INTO spec_key_id, spec_ordinal, sealed_spec
      FROM ql_run_spec s WHERE s.run_id = v_run.id AND s.ordinal = v_ord;
    timeout_ms := v_run.timeout_ms;
    lease_expires_at_ms := v_now + p_lease_ttl_ms;
    db_now_ms := v_now;
    RETURN NEXT;
  END LOOP;
END $$;
"""

_BATCHES = r"""
-- The batched calls: ql_start_many, ql_running_many, ql_renew_many, ql_complete_many take the
-- arguments of N calls of ql_start, ql_running, ql_renew, ql_complete as arrays (element i is call
-- i) and make exactly those N calls, in ONE statement: each call is the single function itself,
-- fenced on its own (the fencing rules live in ONE place, the single functions), its row returned
-- with ord = i. The calls run in order of attempt id (then i), so two batches that touch the same
-- attempts lock them in the same order; rows come back in that order too (the client puts them
-- back by ord). Any error rolls the whole batch back, as for the pipelined calls it replaces.
CREATE FUNCTION ql__batch_check(p_attempt_ids text[], VARIADIC p_lengths integer[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  v_n integer := array_length(p_attempt_ids, 1);
BEGIN
  PERFORM ql__check(v_n BETWEEN 1 AND 256 AND array_ndims(p_attempt_ids) = 1
                    AND array_lower(p_attempt_ids, 1) = 1, 'batch');
  PERFORM ql__check(v_n = ALL (p_lengths), 'batch');
END $$;

"""

#: The fenced arguments every call starts with (one array each).
_FENCE_ARGS = (("p_worker_ids", "text"), ("p_worker_generations", "bigint"), ("p_sessions", "text"),
               ("p_attempt_ids", "text"), ("p_lease_generations", "bigint"), ("p_lease_tokens", "text"))
_LEASE_ANSWER = (("answer", "text"), ("reason", "text"), ("lease_expires_at_ms", "bigint"), ("db_now_ms", "bigint"),
                 ("cancel_reason", "text"), ("cancel_requested_at_ms", "bigint"), ("deadline_at_ms", "bigint"))


def _many(single: str, per_call: tuple[tuple[str, str], ...], answer: tuple[tuple[str, str], ...],
          shared: tuple[tuple[str, str], ...] = ()) -> str:
    """``<single>_many``: the arguments of N calls of ``single`` as arrays (``shared`` ones once), and
    exactly those N calls of the single function — written once here, so the four batched functions
    cannot drift apart."""
    arrays = _FENCE_ARGS + per_call
    params = ", ".join([f"{name} {kind}[]" for name, kind in arrays] + [f"{name} {kind}" for name, kind in shared])
    returns = ", ".join(f"{name} {kind}" for name, kind in answer)
    lengths = ", ".join(f"array_length({name}, 1)" for name, _ in arrays if name != "p_attempt_ids")
    args = ", ".join([f"{name}[v_i]" for name, _ in arrays] + [name for name, _ in shared])
    columns = ", ".join(f"s.{name}" for name, _ in answer)
    return f"""
CREATE FUNCTION {single}_many({params})
RETURNS TABLE(ord integer, {returns})
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_i integer;
BEGIN
  PERFORM ql__batch_check(p_attempt_ids, {lengths});
  FOR v_i IN SELECT i FROM generate_subscripts(p_attempt_ids, 1) AS i
              ORDER BY p_attempt_ids[i], i LOOP
    RETURN QUERY SELECT v_i, {columns}
      FROM {single}({args}) s;
  END LOOP;
END $$;
"""


_BATCHES += "".join((
    _many("ql_start", (), _LEASE_ANSWER),
    _many("ql_running", (("p_started_at_ms", "bigint"),), _LEASE_ANSWER),
    _many("ql_renew", (), _LEASE_ANSWER, shared=(("p_ttl_ms", "bigint"),)),
    _many("ql_complete", (("p_exit_codes", "integer"), ("p_started_at_ms", "bigint"), ("p_finished_at_ms", "bigint"),
                          ("p_signalled", "boolean"), ("p_completion_digests", "text")),
          (("answer", "text"), ("status", "text"), ("reason", "text"), ("fence_reason", "text"), ("db_now_ms", "bigint"))),
))

SQL_STATEMENTS = split_statements(_INDEXES, _HELPERS, _CLAIM, _BATCHES, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
