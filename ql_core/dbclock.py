"""The database's clock, for lease expiry that every node agrees on (DESIGN.md §2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlmodel import Session

__all__ = ["db_now_ms"]

_SQL = {
    "sqlite": "SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    "postgresql": "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
}


def db_now_ms(session: Session) -> int:
    """Milliseconds since the epoch according to the database server."""
    from sqlalchemy import text

    dialect = session.get_bind().dialect.name
    return int(session.execute(text(_SQL[dialect])).scalar_one())
