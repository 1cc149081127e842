"""PostgreSQL connections of the cluster-fenced run store: psycopg 3, one connection per thread.

Every connection is in autocommit mode; a store transaction is an explicit ``BEGIN`` … ``COMMIT``
on it (:meth:`PgConnections.write`, :meth:`PgConnections.read`), so nothing is ever left open
between calls and a failed statement rolls the whole transaction back. Statements are prepared
server-side (``prepare=True``) and parameterised; none is built from a value.

Errors are mapped to the journal seam's: serialization failures, deadlocks, lock and statement
timeouts and lost connections are :class:`~ql_core.ports.journal.StoreBusyError` (core retries the
whole transaction), a unique violation is a :class:`~ql_core.ports.journal.ConflictError`, anything
else a :class:`~ql_core.ports.journal.StoreError` — each message names the operation, the exception
class and the SQLSTATE only, never a parameter or a server message that could quote one.

The schema is brought to head on open (Alembic, under a PostgreSQL advisory lock so that several
nodes starting at once migrate once); a reader (``create=False``) only checks it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Iterator

from ql_core.errors import DatabaseError
from ql_core.ports.journal import ConflictError, StoreBusyError, StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PgConnections", "conninfo_of", "psycopg_module", "MIGRATION_LOCK_KEY"]

#: ``pg_advisory_lock`` key held while migrating (any constant; "ql" + "0004" in ASCII).
MIGRATION_LOCK_KEY = 0x716C_3030_3034
#: SQLSTATE prefixes that mean "retry the whole transaction".
_BUSY_SQLSTATES = ("40", "55P03", "57014", "57P01", "57P02", "57P03", "53", "08")


def psycopg_module() -> Any:
    """psycopg 3, imported on first use (``ql plugins`` never needs it)."""
    try:
        import psycopg
    except ImportError:
        raise DatabaseError("the cluster-fenced plugin needs the PostgreSQL driver psycopg 3: "
                            "pip install 'ql-runner[cluster]'") from None
    return psycopg


def conninfo_of(url: str) -> str:
    """A libpq conninfo from ql's ``database_url`` (SQLAlchemy style ``postgresql+psycopg://`` too)."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    if not url.startswith("postgresql://"):
        raise DatabaseError("journal = \"cluster-fenced\" needs database_url = \"postgresql+psycopg://...\"")
    return url


def _sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def map_error(exc: BaseException, operation: str, *, broken: bool = False) -> StoreError:
    """The seam's error for a psycopg error (message: operation, class and SQLSTATE only)."""
    sqlstate = getattr(exc, "sqlstate", None)
    kind = type(exc).__name__
    detail = f"{operation}: {kind}" + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
    psycopg = psycopg_module()
    if sqlstate == "23505":
        return ConflictError(f"the control database refused a concurrent write ({detail}); retry")
    if broken or isinstance(exc, psycopg.OperationalError) or (
            sqlstate is not None and sqlstate.startswith(_BUSY_SQLSTATES)):
        return StoreBusyError(f"the control database is busy or unreachable ({detail}); retry")
    return StoreError(f"control database error ({detail})")


class PgConnections:
    """Per-thread autocommit connections to one PostgreSQL database, and its transactions."""

    def __init__(self, url: str, *, connect_timeout_s: int = 5, statement_timeout_ms: int = 30_000,
                 lock_timeout_ms: int = 10_000, application_name: str = "ql") -> None:
        self.url = url
        self._conninfo = conninfo_of(url)
        self._options = (f"-c statement_timeout={int(statement_timeout_ms)} "
                         f"-c lock_timeout={int(lock_timeout_ms)} -c idle_in_transaction_session_timeout=60000")
        self._connect_timeout_s = max(2, int(connect_timeout_s))
        self._application_name = application_name
        self._local = threading.local()
        self._all: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- connections ------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        psycopg = psycopg_module()
        try:
            return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=self._connect_timeout_s,
                                   options=self._options, application_name=self._application_name)
        except psycopg.Error as exc:
            raise map_error(exc, "connect", broken=True) from None

    def connection(self) -> psycopg.Connection[Any]:
        """This thread's connection (opened on first use, reopened after it broke)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or conn.broken):
            self._forget(conn)
            conn = None
        if conn is None:
            if self._closed:
                raise StoreError("the run store is closed")
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _forget(self, conn: psycopg.Connection[Any]) -> None:
        with contextlib.suppress(Exception):
            conn.close()
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        self._local.conn = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._local = threading.local()

    # -- statements and transactions ------------------------------------------------------------
    def execute(self, conn: psycopg.Connection[Any], sql: str, params: Any = ()) -> Any:
        """One prepared statement on ``conn`` (inside the caller's transaction); returns the cursor."""
        return conn.execute(sql, params, prepare=True)

    def query(self, operation: str, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        """One statement in its own (autocommit) transaction; rows."""
        psycopg = psycopg_module()
        conn = self.connection()
        try:
            return conn.execute(sql, params, prepare=True).fetchall()
        except psycopg.Error as exc:
            error = map_error(exc, operation, broken=conn.broken)
            if conn.broken:
                self._forget(conn)
            raise error from None

    @contextlib.contextmanager
    def write(self, operation: str) -> Iterator[psycopg.Connection[Any]]:
        """One read-write transaction: ``BEGIN`` … ``COMMIT``; rolled back on any error."""
        with self._transaction(operation, "BEGIN") as conn:
            yield conn

    @contextlib.contextmanager
    def read(self, operation: str) -> Iterator[psycopg.Connection[Any]]:
        """One read-only snapshot (REPEATABLE READ): several statements see the same data."""
        with self._transaction(operation, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as conn:
            yield conn

    @contextlib.contextmanager
    def _transaction(self, operation: str, begin: str) -> Iterator[psycopg.Connection[Any]]:
        psycopg = psycopg_module()
        conn = self.connection()
        try:
            conn.execute(begin)
        except psycopg.Error as exc:
            error = map_error(exc, operation, broken=conn.broken)
            if conn.broken:
                self._forget(conn)
            raise error from None
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            if not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            broken = conn.broken
            if broken:
                self._forget(conn)
            if isinstance(exc, psycopg.Error):
                raise map_error(exc, operation, broken=broken) from None
            raise

    # -- schema ----------------------------------------------------------------------------------
    def schema_revision(self) -> str | None:
        rows = self.query("schema", "SELECT to_regclass('alembic_version') IS NOT NULL")
        if not rows or not rows[0][0]:
            return None
        rows = self.query("schema", "SELECT version_num FROM alembic_version")
        return ",".join(sorted(str(r[0]) for r in rows)) or None  # one row per branch head

    def ensure_schema(self, head: str, *, create: bool) -> None:
        """Migrate to ``head`` (once across nodes: an advisory lock), or require it (readers)."""
        current = self.schema_revision()
        if current == head:
            return
        if not create:
            raise DatabaseError(f"the control database is at schema {current or 'none'}, this ql needs {head}: "
                                f"run `ql db upgrade` (or start `ql control`) first")
        conn = self._connect()
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            try:
                if self.schema_revision() != head:
                    from ql_core.db.migrate import migrate_url

                    migrate_url(_sqlalchemy_url(self._conninfo))
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        finally:
            conn.close()
