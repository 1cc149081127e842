"""A throwaway PostgreSQL database for the cluster benchmarks: created from the DSN in
``QL_BENCH_POSTGRES_DSN`` (else ``QL_TEST_POSTGRES_DSN``), migrated to ql's head, dropped at the end."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from typing import Iterator

__all__ = ["conninfo", "scratch_database"]


def conninfo(url: str) -> str:
    """The psycopg form of a SQLAlchemy URL."""
    return url.replace("postgresql+psycopg://", "postgresql://")


@contextlib.contextmanager
def scratch_database() -> Iterator[tuple[str, str]]:
    """Yield ``(sqlalchemy url, psycopg conninfo)`` of a fresh, migrated database; drop it afterwards."""
    import psycopg

    from ql_core.db.migrate import migrate_url

    base = os.environ.get("QL_BENCH_POSTGRES_DSN") or os.environ.get("QL_TEST_POSTGRES_DSN")
    if not base:
        sys.exit("set QL_TEST_POSTGRES_DSN=postgresql+psycopg://user@host:port/db")
    admin = conninfo(base)
    name = f"ql_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = base.rsplit("/", 1)[0] + "/" + name
    if not url.startswith("postgresql+psycopg"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    try:
        migrate_url(url)
        yield url, conninfo(url)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
