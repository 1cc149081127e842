"""Cluster: one search_path for every ql function, so a backend's cached plans stay valid.

PostgreSQL only (no table, row or function body changes):

A cached plan remembers the ``search_path`` it was analysed under, and PostgreSQL (15 and older)
re-analyses and re-plans it whenever it runs under a different one. 0005 pinned the worker functions
of its time to ``<schema>, pg_temp``; the revisions since 0006 pin theirs to ``pg_catalog, <schema>,
pg_temp``. The same name order (pg_catalog is searched first either way), but not the same path to
the plan cache — and one worker's control connection alternates between them on every task
(``ql_claim``, ``ql_start_many``, ``ql_running_many``, ``ql_complete_many`` on one side, ``ql_start``,
``ql_running``, ``ql_complete`` on the other). Every plan shared by both sides was thrown away on each
switch: the foreign-key checks' (one per event, attempt and lease row written) and those of the
helpers both sides call (``ql__event``, ``ql__check``, ``ql__fence`` …). perf on the protocol loop
of one attempt per call: 4 % of the backend's CPU in the planner, 10 % in ``GetCachedPlan``, 7.6 %
in the foreign-key triggers; 0 %, 3.9 % and 2.7 % with one path.

Now every function still pinned to ``<schema>, pg_temp`` is pinned to ``pg_catalog, <schema>,
pg_temp`` (ql_register, ql_heartbeat, ql_deregister, ql_start, ql_running, ql_renew, ql_complete,
ql_end_without_completion, ql_request_cancel, ql_submit). Same name resolution, still SECURITY
DEFINER, pg_temp still last. ``ql db grant-worker`` pins this path too (it used to re-pin 0005's).

Revision ID: 0014_cluster_one_search_path
Revises: 0013_cluster_hot_leases
"""

from alembic import op

from ql_core.db.pg_migration import execute_statements

revision = "0014_cluster_one_search_path"
down_revision = "0013_cluster_hot_leases"
branch_labels = None
depends_on = None

#: Every ql function of this schema pinned to 0005's path gets the path of the revisions since 0006.
#: Only names the catalog lists (regprocedure, quote_ident): nothing here comes from a value.
_REPIN = r"""
DO $$
DECLARE
  v_fn regprocedure;
BEGIN
  FOR v_fn IN SELECT p.oid::regprocedure FROM pg_proc p
               WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'ql\_%'
                 AND p.proconfig @> ARRAY[format('search_path=%s, pg_temp', quote_ident(current_schema()))]
               ORDER BY p.oid LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', v_fn, current_schema());
  END LOOP;
END $$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    execute_statements(op, [_REPIN])


def downgrade() -> None:
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")
