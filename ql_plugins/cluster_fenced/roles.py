"""``ql db grant-worker ROLE``: a least-privilege PostgreSQL role for ``ql worker``.

A worker connected as that role may call exactly the fenced worker functions — which run as their
owner (``SECURITY DEFINER``, ``search_path`` pinned; revision 0005) and check the caller's fence in
the database — and nothing else: no table privilege at all (no SELECT of a spec, no UPDATE of a
run), no other ql function (no ``ql_submit``, no ``ql_sweep``, no private ``ql__*`` helper).
LISTEN (the queue and intent wake-ups) needs no privilege.

The grant is idempotent and run by an admin (the owner of the ql tables, or a superuser) against
the control database, in ONE transaction:

1. refuse a role that is missing, a superuser, BYPASSRLS, the owner of the ql tables or a member
   of that owner (it would inherit everything);
2. make sure every worker function is ``SECURITY DEFINER`` with the pinned ``search_path`` (already
   so after revision 0005; functions added later by other revisions are covered the same way);
3. revoke EXECUTE on every ``ql`` function from PUBLIC and from the role, and every privilege on
   ql's tables and sequences from the role (and from PUBLIC on ql's own tables);
4. grant CONNECT on the database, USAGE on the schema and EXECUTE on :data:`GRANTED_TO_WORKERS`.

Run it again after every ``ql db upgrade``: a new revision's functions are created executable by
PUBLIC (PostgreSQL's default) until a grant revokes that.
"""

from __future__ import annotations

import re
from typing import Any

from ql_core.errors import ConfigError, DatabaseError

from .artifact_store import ARTIFACT_WORKER_FUNCTIONS

__all__ = ["WORKER_FUNCTIONS", "ARTIFACT_FUNCTION_NAMES", "GRANTED_TO_WORKERS", "ROLE_PATTERN", "grant_worker", "grant_worker_url"]

#: The fenced functions ``ql worker`` calls (control_db.py), and nothing else.
WORKER_FUNCTIONS = ("ql_register", "ql_heartbeat", "ql_drain", "ql_deregister", "ql_claim", "ql_start",
                    "ql_running", "ql_renew", "ql_complete", "ql_end_without_completion",
                    # revision 0011: the same calls batched (a role without them gets them pipelined)
                    "ql_start_many", "ql_running_many", "ql_renew_many", "ql_complete_many",
                    # revision 0017: a completion with its attempt's spawn (round_call.py)
                    "ql_spawn_complete_many")
#: The log shipper's fenced artifact-store functions (artifact_store.py, revision 0006), by name.
ARTIFACT_FUNCTION_NAMES = tuple(sig.partition("(")[0] for sig in ARTIFACT_WORKER_FUNCTIONS)
#: What ``grant-worker`` grants: the worker's fenced run functions and its log-shipping functions.
GRANTED_TO_WORKERS: tuple[str, ...] = WORKER_FUNCTIONS + ARTIFACT_FUNCTION_NAMES

#: Role names ql accepts (quoted as identifiers anyway; this keeps them readable in every message).
ROLE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")

_FUNCTIONS = (r"SELECT p.oid::regprocedure::text, p.proname, p.prosecdef, coalesce(p.proconfig, '{}')"
              r" FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace"
              r" AND p.proname LIKE 'ql\_%' ORDER BY 1")
_TABLES = (r"SELECT c.oid::regclass::text, c.relkind FROM pg_class c"
           r" WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v', 'm')"
           r" AND (c.relname LIKE 'ql\_%' OR c.relname = 'alembic_version') ORDER BY 1")


def _check_role(conn: Any, role: str) -> None:
    row = conn.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if row is None:
        raise ConfigError(f"role {role} does not exist in this PostgreSQL server; create it first, e.g. "
                          f"CREATE ROLE {role} LOGIN PASSWORD '...' (then run ql db grant-worker {role} again)")
    if row[0] or row[1]:
        raise ConfigError(f"role {role} is a superuser or has BYPASSRLS: it can read every table whatever is "
                          f"granted; give the workers a plain role of their own")
    owner = conn.execute("SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
                         "WHERE c.oid = to_regclass('ql_run')").fetchone()
    if owner is None:
        raise ConfigError("this database has no ql schema yet: run `ql db upgrade` (as the admin) first")
    member = conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (role, owner[0])).fetchone()[0]
    if role == owner[0] or member:
        raise ConfigError(f"role {role} owns the ql tables (or is a member of their owner {owner[0]}): a worker "
                          f"role must be a separate plain role, e.g. CREATE ROLE ql_worker LOGIN PASSWORD '...'")


def grant_worker(conn: Any, role: str, *, functions: tuple[str, ...] = GRANTED_TO_WORKERS) -> dict[str, Any]:
    """Set ``role`` up as a worker role on the database of ``conn`` (psycopg 3, autocommit). Idempotent."""
    from psycopg import sql

    if not ROLE_PATTERN.fullmatch(role):
        raise ConfigError("the role name must be 1 to 63 letters, digits and _ . - (starting with a letter or _)")
    ident = sql.Identifier(role)
    with conn.transaction():
        _check_role(conn, role)
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        procs = conn.execute(_FUNCTIONS).fetchall()
        found = {name for _sig, name, _d, _c in procs}
        missing = [f for f in functions if f not in found]
        if missing:
            raise ConfigError(f"the control database lacks {', '.join(missing)}: run `ql db upgrade` with this "
                              f"version of ql first")
        # The path the migrations pin (0014): one path for every function, or a backend's cached
        # plans are re-planned each time its calls switch between two.
        pinned = f"search_path=pg_catalog, {schema}, pg_temp"
        for sig, name, definer, config in procs:
            # Every statement names a catalogued signature (regprocedure text), never user input.
            fn = sql.SQL(sig)
            if name in functions and not (definer and pinned in (config or [])):
                conn.execute(sql.SQL("ALTER FUNCTION {} SECURITY DEFINER SET search_path = pg_catalog, {}, pg_temp")
                             .format(fn, sql.Identifier(schema)))
            conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(fn))
            conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(fn, ident))
        for table, _kind in conn.execute(_TABLES).fetchall():
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(sql.SQL(table)))
            conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.SQL(table), ident))
        conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(sql.Identifier(schema), ident))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), ident))
        database = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), ident))
        granted = []
        for sig, name, _d, _c in procs:
            if name in functions:
                conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(sig), ident))
                granted.append(name)
    return {"role": role, "database": database, "schema": schema, "functions": sorted(set(granted))}


def grant_worker_url(url: str, role: str) -> dict[str, Any]:
    """:func:`grant_worker` on a fresh connection to ``url`` (errors: one line, no DSN, no server text)."""
    from .pg_connections import conninfo_of, psycopg_module

    psycopg = psycopg_module()
    try:
        with psycopg.connect(conninfo_of(url), autocommit=True, connect_timeout=10,
                             application_name="ql-grant-worker") as conn:
            return grant_worker(conn, role)
    except psycopg.Error as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate == "42501":
            raise DatabaseError("grant-worker was refused a privilege (SQLSTATE 42501): run it with the database_url "
                                "of the owner of the ql tables (or a superuser)") from None
        raise DatabaseError(f"grant-worker failed: {type(exc).__name__}"
                            + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
                            + "; check database_url and that the PostgreSQL server is up") from None
