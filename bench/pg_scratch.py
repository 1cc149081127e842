"""A throwaway PostgreSQL database for the cluster benchmarks: created from the DSN in
``QL_BENCH_POSTGRES_DSN`` (else ``QL_TEST_POSTGRES_DSN``), migrated to ql's head, dropped at the end.

``QL_BENCH_PG_LOG=1``: after the migration, every statement of this database only is logged with its
duration (``ALTER DATABASE … SET log_min_duration_statement = 0``: the server's log, its prefix names the
database) — to count what a client sends per task without ``pg_stat_statements`` (needs a restart).

``QL_BENCH_PG_COUNTS=1``: this database counts every function call (``track_functions = all``), and
at the end, before the drop, the calls of each function (top-level and nested) and the database's
committed transactions are printed to stderr: totals over the whole bench, warm-up included."""

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
        if os.environ.get("QL_BENCH_PG_LOG"):
            with psycopg.connect(admin, autocommit=True) as conn:  # new sessions of this database only
                conn.execute(f'ALTER DATABASE "{name}" SET log_min_duration_statement = 0')
            print(f"# statements of database {name} are in the server's log", file=sys.stderr)
        if os.environ.get("QL_BENCH_PG_COUNTS"):
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" SET track_functions = \'all\'')
        yield url, conninfo(url)
        if os.environ.get("QL_BENCH_PG_COUNTS"):
            _print_counts(conninfo(url))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _print_counts(dsn: str) -> None:
    """Function calls and committed transactions of this database so far (stderr)."""
    import time

    import psycopg

    time.sleep(1.0)  # the bench's backends report their counts as they exit
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        commits = conn.execute("SELECT xact_commit, xact_rollback FROM pg_stat_database "
                               "WHERE datname = current_database()").fetchone()
        rows = conn.execute("SELECT funcname, calls, round(self_time) FROM pg_stat_user_functions "
                            "ORDER BY calls DESC, funcname").fetchall()
    print(f"# this database: {commits[0]} transactions committed, {commits[1]} rolled back", file=sys.stderr)
    for fn, calls, self_ms in rows:
        print(f"#   {fn:>28}: {calls:7d} calls, {self_ms} ms own time", file=sys.stderr)
