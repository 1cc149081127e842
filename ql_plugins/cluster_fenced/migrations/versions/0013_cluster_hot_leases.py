"""Cluster HOT leases: a lease's start and running writes no longer touch its indexes.

PostgreSQL only (nothing changes on SQLite; no column changes; every row is kept):

Every completed run updates its ``ql_attempt_lease`` row three times (``ql_start``: claimed ->
starting, ``ql_running``: -> running, ``ql_complete``: -> ended). Both partial indexes of the table
had ``status`` in their predicate (``ix_ql_lease_live_expiry``: ``status IN ('claimed', 'starting',
'running')``; ``ix_ql_lease_ended``: ``status = 'ended'``), and PostgreSQL treats a column of an
index predicate as indexed: a write that changes it is never a HOT update, so each of the three
wrote a new entry into all three indexes (primary key, ``ux_ql_lease_generation``, the live one).
Measured on the protocol bench (pg_stat_user_tables, pg_waldump of the bench database only): 0 of
3 lease updates HOT, 38.6 B-tree leaf inserts and 68 WAL records per completed run.

Now:

- ``ck_ql_lease_ended``: ``(status = 'ended') = (ended_at_ms IS NOT NULL)`` — what every function
  that ends a lease already does (``ql__finish``, ``ql__lose``, ``ql__requeue_unstarted``,
  ``ql_complete_many``, ``ql_sweep`` set both in one statement; nothing else writes either column).
  Checked against every existing row when this revision runs (a row that breaks it stops the
  upgrade instead of being misfiled by the indexes below).
- Both partial indexes are rebuilt with predicates on ``ended_at_ms`` — by the constraint the same
  rows as before: ``ix_ql_lease_live_expiry`` ``WHERE ended_at_ms IS NULL``, ``ix_ql_lease_ended``
  ``WHERE ended_at_ms IS NOT NULL``. start and running change none of the indexed columns any more
  (status, started_at_ms, running_at_ms, version, intent_delivered_at_ms).
- ``fillfactor = 50`` on ``ql_attempt_lease``: a HOT update needs room on the row's own page; leases
  are inserted back to back by claims, so a full page had none (1.64 of the 2 possible HOT updates
  per run at the default 100, 1.99 at 50). Existing pages keep their layout; new ones get the room.
- ``ql_sweep`` is 0003's body with ``ended_at_ms IS NULL`` added to its expired-lease scan and
  ``ended_at_ms IS NOT NULL`` to its retention scan: the conditions the new predicates need for the
  planner to use the indexes (without them the bounded scans would read the whole table). Same
  rows (the constraint), same order, same locks; its search_path pinned as the revisions since 0006
  pin theirs (pg_catalog first, pg_temp last) instead of 0005's ``<schema>, pg_temp``.

Per completed run (protocol bench, 1 000 runs, this database's WAL only): lease updates HOT 0 -> 2
of 3; B-tree leaf inserts 38.6 -> 32.3; WAL records 68.5 -> 62.5. See docs/cluster.md.

Revision ID: 0013_cluster_hot_leases
Revises: 0012_cluster_set_based
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, no_downgrade, split_statements, upgrade_functions

revision = "0013_cluster_hot_leases"
down_revision = "0012_cluster_set_based"
branch_labels = None
depends_on = None


def upgrade() -> None:
    upgrade_functions(op, SQL_STATEMENTS)  # search_path pinned to this schema, pg_temp last


downgrade = no_downgrade


_LEASE_INDEXES = r"""
ALTER TABLE ql_attempt_lease ADD CONSTRAINT ck_ql_lease_ended CHECK ((status = 'ended') = (ended_at_ms IS NOT NULL))
DROP INDEX ix_ql_lease_live_expiry
CREATE INDEX ix_ql_lease_live_expiry ON ql_attempt_lease (expires_at_ms) WHERE ended_at_ms IS NULL
DROP INDEX ix_ql_lease_ended
CREATE INDEX ix_ql_lease_ended ON ql_attempt_lease (ended_at_ms) WHERE ended_at_ms IS NOT NULL
ALTER TABLE ql_attempt_lease SET (fillfactor = 50)
"""

_SWEEP = r"""
-- 0003's ql_sweep, statement for statement; its two lease scans name the ended_at_ms condition of
-- the partial index they are served by (the same rows: ck_ql_lease_ended).
CREATE OR REPLACE FUNCTION ql_sweep(p_limit integer DEFAULT 16, p_retention_ms bigint DEFAULT 3600000)
RETURNS TABLE (requeued integer, lost integer, retried integer, timeouts integer,
               leases_deleted integer, specs_deleted integer, skipped integer, db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
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
     WHERE l.ended_at_ms IS NULL AND l.status IN ('claimed', 'starting', 'running')
       AND l.expires_at_ms <= v_now
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
       WHERE l.ended_at_ms IS NOT NULL AND l.status = 'ended'
         AND l.ended_at_ms <= v_now - coalesce(p_retention_ms, 3600000)
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

SQL_STATEMENTS = [s.strip() for s in _LEASE_INDEXES.strip().splitlines()] + split_statements(
    _SWEEP, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
