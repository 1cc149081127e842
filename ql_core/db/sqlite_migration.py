"""What the SQLite-only revisions (0009 onwards) share: statements run on SQLite alone (PostgreSQL's
schema is not changed by them), and no way down.

Kept small and stable on purpose, as :mod:`ql_core.db.pg_migration`: a revision that ran once must
run the same way again, so a change here must not change what an existing revision executes.
"""

from __future__ import annotations

from typing import Iterable

from .pg_migration import no_downgrade

__all__ = ["upgrade_sqlite", "no_downgrade"]


def upgrade_sqlite(op: object, statements: Iterable[str]) -> None:
    """The upgrade of a revision that only runs fixed statements on SQLite: each in order, through
    Alembic's ``op.execute``; nothing on PostgreSQL."""
    if op.get_bind().dialect.name != "sqlite":  # type: ignore[attr-defined]
        return
    for statement in statements:
        op.execute(statement)  # type: ignore[attr-defined]
