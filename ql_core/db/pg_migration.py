"""What the PostgreSQL-only revisions (0003 onwards) share: PL/pgSQL blocks split into single
statements, run on the driver's own cursor, and the revocation that keeps every ql function
private to its owner until ``ql db grant-worker`` grants it.

Kept small and stable on purpose: a revision that ran once must run the same way again, so a
change here must not change what an existing revision executes.
"""

from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["split_statements", "execute_statements", "execute_pinned_statements", "upgrade_functions",
           "no_downgrade", "SEARCH_PATH_PLACEHOLDER", "REVOKE_QL_FUNCTIONS_FROM_PUBLIC"]


def split_statements(*blocks: str) -> list[str]:
    """One statement per string (a driver may refuse several at once): each block is split before
    every line that starts a ``CREATE`` or ``DROP`` once the statement so far holds more than
    comments."""
    out: list[str] = []
    for block in blocks:
        current: list[str] = []
        for line in block.strip().splitlines():
            if line.startswith(("CREATE ", "DROP ")) and any(not x.startswith("--") and x.strip() for x in current):
                out.append("\n".join(current).strip())
                current = []
            current.append(line)
        if current:
            out.append("\n".join(current).strip())
    return out


def execute_statements(op: object, statements: Iterable[str], *,
                       rewrite: Callable[[str], str] | None = None) -> None:
    """Run ``statements`` in order on the migration's connection, through the driver's own cursor
    and without parameters: PL/pgSQL's ``%`` is not a placeholder there. ``rewrite`` may adapt
    each statement to this database first (e.g. the schema of a pinned ``search_path``)."""
    cursor = op.get_bind().connection.dbapi_connection.cursor()  # type: ignore[attr-defined]
    try:
        for statement in statements:
            cursor.execute(rewrite(statement) if rewrite is not None else statement)
    finally:
        cursor.close()


#: The ``search_path`` a revision's function bodies are written with; :func:`execute_pinned_statements`
#: replaces it with this database's schema (revisions 0006 onwards).
SEARCH_PATH_PLACEHOLDER = "pg_catalog, public"


def execute_pinned_statements(op: object, statements: Iterable[str]) -> None:
    """:func:`execute_statements` with every :data:`SEARCH_PATH_PLACEHOLDER` pinned to
    ``pg_catalog, <current schema>, pg_temp``: pg_temp LAST, so a SECURITY DEFINER function never
    resolves a name through a schema the caller can write to (0006)."""
    bind = op.get_bind()  # type: ignore[attr-defined]
    schema = bind.exec_driver_sql("SELECT quote_ident(current_schema())").scalar_one()
    pinned = f"pg_catalog, {schema}, pg_temp"
    execute_statements(op, statements,
                       rewrite=lambda statement: statement.replace(SEARCH_PATH_PLACEHOLDER, pinned))


def upgrade_functions(op: object, statements: Iterable[str]) -> None:
    """The upgrade of a revision that only adds or replaces PostgreSQL functions (0011 onwards):
    ``statements`` through :func:`execute_pinned_statements`; nothing on SQLite."""
    if op.get_bind().dialect.name != "postgresql":  # type: ignore[attr-defined]
        return
    execute_pinned_statements(op, statements)


def no_downgrade() -> None:
    """Every revision's ``downgrade``: ql does not migrate down."""
    raise NotImplementedError("ql does not migrate down; restore the database from a backup")


#: Nobody but the owner executes a ql function until it is granted (PostgreSQL's default is
#: PUBLIC). Idempotent, so every revision that adds functions runs it again.
REVOKE_QL_FUNCTIONS_FROM_PUBLIC = r"""
DO $$
DECLARE
  v_fn regprocedure;
BEGIN
  FOR v_fn IN SELECT p.oid::regprocedure FROM pg_proc p
               WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'ql\_%' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
END $$
"""
