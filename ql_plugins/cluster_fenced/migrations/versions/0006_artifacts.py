"""Cluster logs: the built-in PostgreSQL artifact store (tables + fenced worker functions).

PostgreSQL only (nothing changes on SQLite; a single node keeps its logs as files):

- ``ql_artifact``: one row per shipped attempt log — who may write it (the worker id, the worker
  generation that ran the attempt, the attempt's lease generation and the SHA-256 of its lease
  token, copied from the lease when the artifact is opened, so the proof outlives the lease row),
  its quota (``max_bytes``), the committed contiguous prefix (``committed_bytes``) and, once
  finalized, the total length and whole-file SHA-256;
- ``ql_artifact_chunk``: the bytes, ≤ 1 MiB per row, keyed by (attempt id, byte offset), with the
  SHA-256 the database computed itself on insert.

Worker functions (``SECURITY DEFINER``, ``search_path`` pinned to ``pg_catalog``, ql's schema and
``pg_temp`` last; granted to the least-privilege
worker role by ``ql db grant-worker``; their names are ``ARTIFACT_WORKER_FUNCTIONS`` in
``ql_plugins.cluster_fenced.artifact_store``):

- ``ql_artifact_open`` — create (or look up) the artifact of an attempt and return its committed
  offset (where a shipper resumes);
- ``ql_artifact_append`` — one chunk at one offset: its SHA-256 is checked by the database;
  an identical replay is a no-op (``duplicate``), a different chunk at a committed offset is
  refused (``conflict``), a chunk past the committed end is refused (``gap``), a chunk past the
  quota is refused (``quota``);
- ``ql_artifact_finalize`` — close it with its total length and whole-file SHA-256: the length
  must equal the committed contiguous prefix (and the chunks must sum to it).

The proof every worker function checks (``ql__artifact_proof``): the caller's worker session is
live (worker id + generation + session match ``ql_worker`` and its session lease has not expired)
AND it names the attempt's lease identity (same worker id, a worker generation ≥ the one that ran
the attempt, the lease generation and the lease token, whose SHA-256 must match). This holds while
the attempt runs and also after it ended — finalize after completion, resume after a restart of the
same worker (same data dir: same worker id and the token it persisted; a newer generation) — but
never for another worker id, a stale process of the same id (its session was replaced), or a
worker that did not receive the token. Another attempt of the same run is another artifact.

Control side: ``ql_artifact_sweep(limit, retention_ms)`` deletes at most ``limit`` chunks of
artifacts whose run ended (or is gone) longer than ``retention_ms`` ago, then the emptied
artifact rows. Readers (``ql logs``) select from the tables directly.

Revision ID: 0006_artifacts
Revises: 0004_cluster_worker
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, execute_statements, split_statements

revision = "0006_artifacts"
down_revision = "0005_worker_role"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # Pin the functions' search_path to the schema ql is installed in (current_schema() now), with
    # pg_temp LAST: a SECURITY DEFINER function must not resolve a name through a schema the caller
    # can write to (a temp table named ql_artifact would otherwise shadow the real one).
    schema = op.get_bind().exec_driver_sql("SELECT quote_ident(current_schema())").scalar_one()
    execute_statements(op, SQL_STATEMENTS,
                       rewrite=lambda statement: statement.replace(SEARCH_PATH, f"pg_catalog, {schema}, pg_temp"))


#: Placeholder in the function bodies below, replaced by :func:`upgrade`.
SEARCH_PATH = "pg_catalog, public"


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


_TABLES = r"""
CREATE TABLE ql_artifact (
  attempt_id text PRIMARY KEY,
  run_id text NOT NULL,
  worker_id text NOT NULL,
  worker_generation bigint NOT NULL,
  lease_generation bigint NOT NULL,
  token_digest text NOT NULL,
  max_bytes bigint NOT NULL CHECK (max_bytes >= 0),
  committed_bytes bigint NOT NULL DEFAULT 0 CHECK (committed_bytes >= 0 AND committed_bytes <= max_bytes),
  chunk_count integer NOT NULL DEFAULT 0,
  status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'final')),
  total_bytes bigint,
  sha256 text,
  created_at_ms bigint NOT NULL,
  updated_at_ms bigint NOT NULL,
  finalized_at_ms bigint
);

CREATE INDEX ix_ql_artifact_run ON ql_artifact (run_id);

CREATE INDEX ix_ql_artifact_created ON ql_artifact (created_at_ms);

CREATE TABLE ql_artifact_chunk (
  attempt_id text NOT NULL,
  byte_offset bigint NOT NULL CHECK (byte_offset >= 0),
  length integer NOT NULL CHECK (length BETWEEN 1 AND 1048576),
  sha256 text NOT NULL,
  data bytea NOT NULL,
  PRIMARY KEY (attempt_id, byte_offset)
);

-- Readers (ql logs, the web host) wait on this: a chunk was committed or an artifact finalized.
CREATE FUNCTION ql__artifact_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ql_artifact', NEW.attempt_id);
  RETURN NULL;
END $$;

CREATE TRIGGER ql_artifact_changed AFTER UPDATE OF committed_bytes, status ON ql_artifact
  FOR EACH ROW EXECUTE FUNCTION ql__artifact_notify();
"""

_PROOF = r"""
-- NULL when the caller may write the artifact of p_attempt_id, else the fence reason. v_art is
-- the artifact row (NULL before the first open: then the lease row is the reference).
CREATE FUNCTION ql__artifact_proof(v_art ql_artifact, p_worker_id text, p_worker_generation bigint,
                                   p_session text, p_attempt_id text, p_lease_generation bigint,
                                   p_token_digest text, p_now bigint)
RETURNS text LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
  v_worker ql_worker%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_owner text;
  v_gen bigint;
  v_lgen bigint;
  v_digest text;
BEGIN
  SELECT * INTO v_worker FROM ql_worker w WHERE w.id = p_worker_id;
  IF v_worker.id IS NULL THEN RETURN 'UNKNOWN_WORKER'; END IF;
  IF v_worker.generation IS DISTINCT FROM p_worker_generation THEN RETURN 'STALE_WORKER_GENERATION'; END IF;
  IF v_worker.session IS DISTINCT FROM p_session THEN RETURN 'WRONG_SESSION'; END IF;
  IF v_worker.lease_expires_at_ms <= p_now THEN RETURN 'SESSION_EXPIRED'; END IF;
  IF v_art.attempt_id IS NOT NULL THEN
    v_owner := v_art.worker_id; v_gen := v_art.worker_generation;
    v_lgen := v_art.lease_generation; v_digest := v_art.token_digest;
  ELSE
    SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id;
    IF v_lease.attempt_id IS NULL THEN RETURN 'NO_LEASE'; END IF;
    v_owner := v_lease.worker_id; v_gen := v_lease.worker_generation;
    v_lgen := v_lease.lease_generation; v_digest := v_lease.token_digest;
  END IF;
  IF v_owner IS DISTINCT FROM p_worker_id THEN RETURN 'WRONG_WORKER'; END IF;
  IF v_gen > p_worker_generation THEN RETURN 'STALE_WORKER_GENERATION'; END IF;
  IF v_lgen IS DISTINCT FROM p_lease_generation THEN RETURN 'STALE_LEASE_GENERATION'; END IF;
  IF v_digest IS DISTINCT FROM p_token_digest THEN RETURN 'WRONG_TOKEN'; END IF;
  RETURN NULL;
END $$;
"""

_OPEN = r"""
-- Open (or look up) the artifact of an attempt. Answers: 'ok' (committed_bytes = where to resume;
-- status 'open' or 'final'), 'fenced' (fence_reason says why; nothing created).
-- p_max_bytes (the worker's log quota) is recorded at the first open and never raised later.
CREATE FUNCTION ql_artifact_open(p_worker_id text, p_worker_generation bigint, p_session text,
                                 p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                                 p_max_bytes bigint,
                                 OUT answer text, OUT fence_reason text, OUT committed_bytes bigint,
                                 OUT max_bytes bigint, OUT status text, OUT total_bytes bigint,
                                 OUT sha256 text, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
  v_art ql_artifact%ROWTYPE;
  v_lease ql_attempt_lease%ROWTYPE;
  v_now bigint;
  v_digest text;
BEGIN
  PERFORM ql__check(ql__is_id(p_attempt_id), 'attempt_id');
  PERFORM ql__check(p_max_bytes BETWEEN 0 AND 1099511627776, 'max_bytes');
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  v_digest := ql__digest(p_lease_token);
  SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id;
  fence_reason := ql__artifact_proof(v_art, p_worker_id, p_worker_generation, p_session, p_attempt_id,
                                     p_lease_generation, v_digest, v_now);
  IF fence_reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;
  IF v_art.attempt_id IS NULL THEN
    SELECT * INTO v_lease FROM ql_attempt_lease l WHERE l.attempt_id = p_attempt_id;
    INSERT INTO ql_artifact (attempt_id, run_id, worker_id, worker_generation, lease_generation, token_digest,
                             max_bytes, created_at_ms, updated_at_ms)
    VALUES (p_attempt_id, v_lease.run_id, v_lease.worker_id, v_lease.worker_generation, v_lease.lease_generation,
            v_lease.token_digest, p_max_bytes, v_now, v_now)
    ON CONFLICT (attempt_id) DO NOTHING;
    SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id;
  END IF;
  answer := 'ok';
  committed_bytes := v_art.committed_bytes;
  max_bytes := v_art.max_bytes;
  status := v_art.status;
  total_bytes := v_art.total_bytes;
  sha256 := v_art.sha256;
END $$;
"""

_APPEND = r"""
-- One chunk (1 byte .. 1 MiB) at p_offset. The database computes the chunk's SHA-256 and compares
-- it with the caller's: a mismatch is 'corrupt' (nothing written). Then, under the artifact's row
-- lock: an identical chunk already at that offset is 'duplicate' (a replay: no-op); any other
-- chunk at or inside committed bytes is 'conflict'; a chunk past the committed end is 'gap';
-- past the quota 'quota'; a finalized artifact 'finalized'. Else 'appended'. committed_bytes is
-- always the committed contiguous prefix after the call (where the shipper goes on).
CREATE FUNCTION ql_artifact_append(p_worker_id text, p_worker_generation bigint, p_session text,
                                   p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                                   p_offset bigint, p_data bytea, p_sha256 text,
                                   OUT answer text, OUT fence_reason text, OUT committed_bytes bigint,
                                   OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
  v_art ql_artifact%ROWTYPE;
  v_now bigint;
  v_len integer;
  v_sha text;
  v_old ql_artifact_chunk%ROWTYPE;
BEGIN
  PERFORM ql__check(ql__is_id(p_attempt_id), 'attempt_id');
  PERFORM ql__check(p_offset >= 0, 'offset');
  v_len := coalesce(length(p_data), 0);
  PERFORM ql__check(v_len BETWEEN 1 AND 1048576, 'data');
  PERFORM ql__check(p_sha256 ~ '^[0-9a-f]{64}$', 'sha256');
  SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  IF v_art.attempt_id IS NULL THEN answer := 'fenced'; fence_reason := 'NOT_OPENED'; RETURN; END IF;
  fence_reason := ql__artifact_proof(v_art, p_worker_id, p_worker_generation, p_session, p_attempt_id,
                                     p_lease_generation, ql__digest(p_lease_token), v_now);
  IF fence_reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;
  committed_bytes := v_art.committed_bytes;
  v_sha := encode(sha256(p_data), 'hex');
  IF v_sha <> p_sha256 THEN answer := 'corrupt'; RETURN; END IF;
  IF p_offset < v_art.committed_bytes THEN
    SELECT * INTO v_old FROM ql_artifact_chunk c WHERE c.attempt_id = p_attempt_id AND c.byte_offset = p_offset;
    IF v_old.attempt_id IS NOT NULL AND v_old.length = v_len AND v_old.sha256 = v_sha THEN
      answer := 'duplicate';
    ELSE
      answer := 'conflict';
    END IF;
    RETURN;
  END IF;
  IF v_art.status = 'final' THEN answer := 'finalized'; RETURN; END IF;
  IF p_offset > v_art.committed_bytes THEN answer := 'gap'; RETURN; END IF;
  IF p_offset + v_len > v_art.max_bytes THEN answer := 'quota'; RETURN; END IF;
  INSERT INTO ql_artifact_chunk (attempt_id, byte_offset, length, sha256, data)
  VALUES (p_attempt_id, p_offset, v_len, v_sha, p_data);
  UPDATE ql_artifact a SET committed_bytes = a.committed_bytes + v_len, chunk_count = a.chunk_count + 1,
         updated_at_ms = v_now
   WHERE a.attempt_id = p_attempt_id;
  committed_bytes := v_art.committed_bytes + v_len;
  answer := 'appended';
END $$;
"""

_FINALIZE = r"""
-- Close the artifact: p_total_bytes must equal the committed contiguous prefix, and the chunks
-- must cover exactly [0, total) (count and sum of lengths agree). The whole-file SHA-256 is
-- recorded (the store verified it against the stored bytes before calling). Answers: 'finalized',
-- 'already_finalized' (same length and SHA: a replay), 'mismatch' (length/coverage/another SHA),
-- 'fenced'.
CREATE FUNCTION ql_artifact_finalize(p_worker_id text, p_worker_generation bigint, p_session text,
                                     p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                                     p_total_bytes bigint, p_sha256 text,
                                     OUT answer text, OUT fence_reason text, OUT committed_bytes bigint,
                                     OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
DECLARE
  v_art ql_artifact%ROWTYPE;
  v_now bigint;
  v_n bigint;
  v_sum bigint;
BEGIN
  PERFORM ql__check(ql__is_id(p_attempt_id), 'attempt_id');
  PERFORM ql__check(p_total_bytes >= 0, 'total_bytes');
  PERFORM ql__check(p_sha256 ~ '^[0-9a-f]{64}$', 'sha256');
  SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id FOR NO KEY UPDATE;
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  IF v_art.attempt_id IS NULL THEN answer := 'fenced'; fence_reason := 'NOT_OPENED'; RETURN; END IF;
  fence_reason := ql__artifact_proof(v_art, p_worker_id, p_worker_generation, p_session, p_attempt_id,
                                     p_lease_generation, ql__digest(p_lease_token), v_now);
  IF fence_reason IS NOT NULL THEN answer := 'fenced'; RETURN; END IF;
  committed_bytes := v_art.committed_bytes;
  IF v_art.status = 'final' THEN
    answer := CASE WHEN v_art.total_bytes = p_total_bytes AND v_art.sha256 = p_sha256
                   THEN 'already_finalized' ELSE 'mismatch' END;
    RETURN;
  END IF;
  SELECT count(*), coalesce(sum(c.length), 0) INTO v_n, v_sum FROM ql_artifact_chunk c
   WHERE c.attempt_id = p_attempt_id;
  IF p_total_bytes <> v_art.committed_bytes OR v_sum <> v_art.committed_bytes OR v_n <> v_art.chunk_count THEN
    answer := 'mismatch'; RETURN;
  END IF;
  UPDATE ql_artifact a SET status = 'final', total_bytes = p_total_bytes, sha256 = p_sha256,
         finalized_at_ms = v_now, updated_at_ms = v_now
   WHERE a.attempt_id = p_attempt_id;
  answer := 'finalized';
END $$;
"""

_SWEEP = r"""
-- Control side (ql control): delete at most p_limit (1..4096) chunks of artifacts whose run ended
-- (or was forgotten) more than p_retention_ms ago, then those artifacts' rows once they have no
-- chunk left. Returns how many chunks and artifacts were deleted. Oldest artifacts first.
CREATE FUNCTION ql_artifact_sweep(p_limit integer, p_retention_ms bigint,
                                  OUT chunks_deleted integer, OUT artifacts_deleted integer,
                                  OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  v_now bigint;
  v_ids text[];
BEGIN
  PERFORM ql__check(p_limit BETWEEN 1 AND 4096, 'limit');
  PERFORM ql__check(p_retention_ms >= 0, 'retention_ms');
  v_now := ql__clock_ms();
  db_now_ms := v_now;
  SELECT array_agg(q.attempt_id) INTO v_ids FROM (
    SELECT a.attempt_id FROM ql_artifact a LEFT JOIN ql_run r ON r.id = a.run_id
     WHERE r.id IS NULL OR (r.finished_at_ms IS NOT NULL AND r.finished_at_ms < v_now - p_retention_ms)
     ORDER BY a.created_at_ms, a.attempt_id LIMIT p_limit
       FOR UPDATE OF a SKIP LOCKED) q;
  IF v_ids IS NULL THEN chunks_deleted := 0; artifacts_deleted := 0; RETURN; END IF;
  WITH doomed AS (
    SELECT c.attempt_id, c.byte_offset FROM ql_artifact_chunk c WHERE c.attempt_id = ANY (v_ids)
     ORDER BY c.attempt_id, c.byte_offset LIMIT p_limit)
  DELETE FROM ql_artifact_chunk c USING doomed d
   WHERE c.attempt_id = d.attempt_id AND c.byte_offset = d.byte_offset;
  GET DIAGNOSTICS chunks_deleted = ROW_COUNT;
  DELETE FROM ql_artifact a WHERE a.attempt_id = ANY (v_ids)
     AND NOT EXISTS (SELECT 1 FROM ql_artifact_chunk c WHERE c.attempt_id = a.attempt_id);
  GET DIAGNOSTICS artifacts_deleted = ROW_COUNT;
END $$;
"""


_CHUNKS = r"""
-- The writer reads back what it stored (to check the whole-file SHA-256 against its local log
-- before it finalizes), with the same proof as every write: a worker role has no SELECT on the
-- tables, and nobody without the attempt's lease token reads its log through here. A caller
-- without the proof gets no rows. At most 16 chunks per call (bounded memory on both sides).
CREATE FUNCTION ql_artifact_chunks(p_worker_id text, p_worker_generation bigint, p_session text,
                                   p_attempt_id text, p_lease_generation bigint, p_lease_token text,
                                   p_from bigint, p_limit integer)
RETURNS TABLE (chunk_offset bigint, chunk_length integer, chunk_data bytea)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_art ql_artifact%ROWTYPE;
BEGIN
  SELECT * INTO v_art FROM ql_artifact a WHERE a.attempt_id = p_attempt_id;
  IF v_art.attempt_id IS NULL
     OR ql__artifact_proof(v_art, p_worker_id, p_worker_generation, p_session, p_attempt_id,
                           p_lease_generation, ql__digest(p_lease_token), ql__clock_ms()) IS NOT NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT c.byte_offset, c.length, c.data FROM ql_artifact_chunk c
    WHERE c.attempt_id = p_attempt_id AND c.byte_offset >= p_from
    ORDER BY c.byte_offset LIMIT least(greatest(p_limit, 1), 16);
END $$;
"""

#: Executed in order by :func:`upgrade` on PostgreSQL; the last one keeps the new functions private
#: to their owner until `ql db grant-worker` grants them, as revision 0005 does for the earlier ones.
SQL_STATEMENTS = split_statements(_TABLES, _PROOF, _OPEN, _APPEND, _FINALIZE, _CHUNKS, _SWEEP,
                                  REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
