"""Read-only lookups for ``ql audit receipts`` (ADR-0007 §2.9): journal states and attempt statuses.

The database is opened defensively and can never be written: SQLite through
a ``mode=ro`` URI with ``PRAGMA query_only``; PostgreSQL in a ``REPEATABLE READ
READ ONLY`` transaction with a statement timeout. No ORM, no runtime: two
batched SELECTs on the common schema, bound parameters only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import quote, unquote

from ql_core.errors import DatabaseError

__all__ = ["ID_BATCH_SIZE", "lookup_states"]

#: Ids per SELECT ... IN (...) batch.
ID_BATCH_SIZE: Final = 128
_SQLITE_URL: Final = re.compile(r"sqlite(?:\+\w+)?:///(?P<path>[^?]*)(?:\?.*)?", re.DOTALL)
_POSTGRES_SCHEME: Final = re.compile(r"postgres(?:ql)?(?:\+\w+)?://")
_SQLITE_BUSY_TIMEOUT_S: Final = 5.0
_PG_CONNECT_TIMEOUT_S: Final = 10
_PG_STATEMENT_TIMEOUT_MS: Final = 30_000


#: (journal state by attempt id, attempt status by attempt id)
_Lookup = tuple[dict[str, str], dict[str, str]]


def _sqlite_uri(database_url: str) -> str:
    match = _SQLITE_URL.fullmatch(database_url)
    path = unquote(match.group("path")) if match else ""
    if not path or path == ":memory:":
        raise DatabaseError("the receipt audit needs a SQLite database file "
                            "(database_url = sqlite:////path/to/ql.db)")
    return f"file:{quote(os.path.abspath(path))}?mode=ro"


def _libpq_conninfo(database_url: str) -> str:
    """``postgresql+psycopg://u@h/db?x=y`` (SQLAlchemy) -> ``postgresql://u@h/db?x=y`` (libpq)."""
    match = _POSTGRES_SCHEME.match(database_url)
    if match is None:
        raise DatabaseError("database_url must start with sqlite:/// or postgresql+psycopg://")
    return "postgresql://" + database_url[match.end():]


def _batches(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), ID_BATCH_SIZE):
        yield ids[i: i + ID_BATCH_SIZE]


def _query_sql(table: str, key: str, value: str, n: int, placeholder: str) -> str:
    marks = ", ".join([placeholder] * n)
    # Fixed table/column names; the ids are always bound parameters.
    return f"SELECT {key}, {value} FROM {table} WHERE {key} IN ({marks})"  # noqa: S608


def _open_sqlite(database_url: str) -> Any:
    """A ``sqlite3`` connection that cannot write: ``mode=ro`` URI plus ``PRAGMA query_only``."""
    import sqlite3

    uri = _sqlite_uri(database_url)
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=_SQLITE_BUSY_TIMEOUT_S,
                               isolation_level=None, check_same_thread=True)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open the run database read-only ({exc}); the audit never "
                            f"classifies receipts without it: check --data-dir and "
                            f"database_url") from None
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA trusted_schema=OFF")
    except sqlite3.Error as exc:
        conn.close()
        raise DatabaseError(f"cannot open the run database read-only ({exc})") from None
    return conn


def _lookup_sqlite(database_url: str, ids: Sequence[str]) -> _Lookup:
    import sqlite3

    conn = _open_sqlite(database_url)
    journal: dict[str, str] = {}
    attempts: dict[str, str] = {}
    try:
        conn.execute("BEGIN")  # one read snapshot for both tables
        for batch in _batches(ids):
            sql = _query_sql("ql_receipt_journal", "attempt_id", "state", len(batch), "?")
            journal.update((str(k), str(v)) for k, v in conn.execute(sql, tuple(batch)))
            sql = _query_sql("ql_run_attempt", "id", "status", len(batch), "?")
            attempts.update((str(k), str(v)) for k, v in conn.execute(sql, tuple(batch)))
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot read the run database ({exc}); is its schema current? "
                            f"(`ql db upgrade`)") from None
    finally:
        conn.close()
    return journal, attempts


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _open_postgres(database_url: str) -> Any:
    """A psycopg connection whose transactions are ``REPEATABLE READ READ ONLY``."""
    try:
        import psycopg
    except ImportError:
        raise DatabaseError("PostgreSQL needs the psycopg driver: "
                            "pip install 'ql-runner[cluster]'") from None
    try:
        conn = psycopg.connect(_libpq_conninfo(database_url), connect_timeout=_PG_CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to the run database: {_first_line(exc)}") from None
    conn.read_only = True
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # one snapshot for both tables
    return conn


def _lookup_postgres(database_url: str, ids: Sequence[str]) -> _Lookup:
    import psycopg

    conn = _open_postgres(database_url)
    journal: dict[str, str] = {}
    attempts: dict[str, str] = {}
    try:
        with conn.cursor() as cur:
            cur.execute(f"SET LOCAL statement_timeout = {_PG_STATEMENT_TIMEOUT_MS}")
            for batch in _batches(ids):
                sql = _query_sql("ql_receipt_journal", "attempt_id", "state", len(batch), "%s")
                cur.execute(sql, tuple(batch))
                journal.update((str(k), str(v)) for k, v in cur.fetchall())
                sql = _query_sql("ql_run_attempt", "id", "status", len(batch), "%s")
                cur.execute(sql, tuple(batch))
                attempts.update((str(k), str(v)) for k, v in cur.fetchall())
        conn.rollback()
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot read the run database: {_first_line(exc)}") from None
    finally:
        conn.close()
    return journal, attempts


def lookup_states(database_url: str, ids: Sequence[str]) -> _Lookup:
    """(journal state by attempt id, attempt status by id) for exactly ``ids``."""
    if not ids:
        return {}, {}
    if database_url.startswith("sqlite"):
        return _lookup_sqlite(database_url, ids)
    if _POSTGRES_SCHEME.match(database_url):
        return _lookup_postgres(database_url, ids)
    raise DatabaseError("database_url must start with sqlite:/// or postgresql+psycopg://")


