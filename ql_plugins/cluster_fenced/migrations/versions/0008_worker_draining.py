"""Cluster workers: a draining worker says so (``ql workers`` shows ``draining``).

PostgreSQL only (nothing changes on SQLite; no table or column changes — ``ql_worker.status`` is a
free ``VARCHAR(16)`` that held ``active`` (0003) and ``stopped`` (0004) and now also ``draining``):

- ``ql_drain(worker_id, generation, session)``: a worker that got SIGTERM (or ``ql worker``'s own
  stop) marks its session ``draining`` when its drain starts, before it finishes or hands back its
  attempts (for at most ``drain_timeout_s``). Answers ``ok`` (also on a replay: the call is idempotent)
  or ``fenced`` (another process holds the worker id now; nothing written). A ``stopped`` session
  stays ``stopped``. The session lease is not touched: heartbeats go on while the worker drains, so
  a worker that dies draining shows ``expired`` once its lease passes, as any other. ``ql_register``
  (a new process) sets ``active`` again, ``ql_deregister`` ``stopped``, as before.
- The state is for operators only: no fence, claim or completion reads it (a draining worker
  simply stops claiming on its own side).

``SECURITY DEFINER`` with ``search_path`` pinned like revision 0006; EXECUTE revoked from PUBLIC:
``ql db grant-worker ROLE`` (run again after this upgrade) grants it to the worker role. A worker
whose role was not granted it yet drains all the same and logs that it could not say so.

Revision ID: 0008_worker_draining
Revises: 0006_artifacts (depends on core's 0007_history)
"""

from alembic import op

from ql_core.db.pg_migration import REVOKE_QL_FUNCTIONS_FROM_PUBLIC, execute_statements, split_statements

revision = "0008_worker_draining"
down_revision = "0006_artifacts"
branch_labels = None
#: Databases of the single-chain schema (before the cluster branch) applied core's 0007 before
#: this one and name only this revision in alembic_version: depending on 0007 keeps it applied.
depends_on = "0007_history"

#: Placeholder in the function body below, replaced by :func:`upgrade` (as in 0006).
SEARCH_PATH = "pg_catalog, public"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # pg_temp LAST (0006): a SECURITY DEFINER function never resolves a name through a schema the
    # caller can write to.
    schema = op.get_bind().exec_driver_sql("SELECT quote_ident(current_schema())").scalar_one()
    execute_statements(op, SQL_STATEMENTS,
                       rewrite=lambda statement: statement.replace(SEARCH_PATH, f"pg_catalog, {schema}, pg_temp"))


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


_DRAIN = r"""
-- The current holder of a worker id starts draining: status 'draining' (unless already 'stopped').
-- 'ok' (also when it already was draining: replay-safe), 'fenced' when (generation, session) is not
-- the current holder's. The session lease and the run leases are not touched.
CREATE FUNCTION ql_drain(p_worker_id text, p_generation bigint, p_session text,
                         OUT answer text, OUT db_now_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
BEGIN
  db_now_ms := ql__clock_ms();
  UPDATE ql_worker w SET status = 'draining', version = w.version + 1
   WHERE w.id = p_worker_id AND w.generation = p_generation AND w.session = p_session
     AND w.status = 'active';
  IF FOUND THEN answer := 'ok'; RETURN; END IF;
  PERFORM 1 FROM ql_worker w
   WHERE w.id = p_worker_id AND w.generation = p_generation AND w.session = p_session
     AND w.status IN ('draining', 'stopped');
  answer := CASE WHEN FOUND THEN 'ok' ELSE 'fenced' END;
END $$;
"""

#: Executed in order by :func:`upgrade` on PostgreSQL; the last keeps ql_drain private to its owner
#: until `ql db grant-worker` grants it.
SQL_STATEMENTS = split_statements(_DRAIN, REVOKE_QL_FUNCTIONS_FROM_PUBLIC)
