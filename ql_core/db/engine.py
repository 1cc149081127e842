"""Database engines: SQLite tuned for a crash-safe single node, PostgreSQL for clusters.

SQLite: WAL journal, ``synchronous=FULL`` (a committed terminal state must
survive power loss as well as a crash), a busy timeout, foreign keys, and
write transactions that take the write lock up front (``BEGIN IMMEDIATE``)
so two writers never deadlock on a lock upgrade. Read-only work opts out with
``session_scope(engine, write=False)``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

__all__ = ["create_db_engine", "postgres_engine", "session_scope", "is_busy_error"]


def _sqlite_engine(url: str, busy_timeout_ms: int) -> Engine:
    from sqlalchemy import create_engine, event

    # The default QueuePool keeps connections open between transactions. With a
    # connection per transaction (NullPool) every close of the last connection
    # checkpoints, deletes and syncs the WAL — on every session. Pooled
    # connections are used by one thread at a time (SQLAlchemy turns sqlite3's
    # same-thread check off for file databases); the launcher is spawned with
    # close_fds, so no task inherits one; Runtime.close() disposes them.
    engine = create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        write = conn.get_execution_options().get("ql_write", True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def postgres_engine(url: str, *, connect_args: dict[str, Any] | None = None, **options: Any) -> Engine:
    """A SQLAlchemy engine on PostgreSQL (psycopg 3). A URL naming several hosts — libpq's failover
    form, ``postgresql+psycopg://u@db1:5432,db2:5432/ql?target_session_attrs=read-write`` — goes to
    libpq as written, as every other ql connection does (SQLAlchemy's URL parser takes one host)."""
    try:
        import psycopg
    except ImportError:
        raise DatabaseError("PostgreSQL needs the psycopg driver: pip install 'ql-runner[cluster]'") from None
    from sqlalchemy import create_engine

    rest = url.partition("://")[2]
    if "," not in rest.split("/", 1)[0]:
        return create_engine(url, connect_args=connect_args or {}, **options)
    conninfo, extra = "postgresql://" + rest, dict(connect_args or {})
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo, **extra), **options)


def _postgres_engine(url: str) -> Engine:
    return postgres_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)


def create_db_engine(url: str, *, busy_timeout_ms: int = 5000) -> Engine:
    """An engine for ``url`` (``sqlite:///...`` or ``postgresql+psycopg://...``)."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url, busy_timeout_ms)
    if url.startswith("postgresql"):
        return _postgres_engine(url)
    raise DatabaseError("database_url must start with sqlite:/// or postgresql+psycopg://")


@contextlib.contextmanager
def session_scope(engine: Engine, *, write: bool = True) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any exception."""
    from sqlmodel import Session

    bind = engine.execution_options(ql_write=write)
    with Session(bind, expire_on_commit=False) as session:
        with session.begin():
            yield session


def is_busy_error(exc: BaseException) -> bool:
    """True for a transient lock/serialization failure worth retrying."""
    from sqlalchemy.exc import OperationalError

    if not isinstance(exc, OperationalError):
        return False
    text = str(exc.orig).lower() if exc.orig is not None else ""
    return "locked" in text or "busy" in text or "could not serialize" in text or "deadlock" in text
