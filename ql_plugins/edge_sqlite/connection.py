"""SQLite connections for the edge-sqlite run store: stdlib ``sqlite3``, one connection per thread.

A thread's connection is closed when the thread ends (its thread-local slot is dropped, and the
slot's finalizer closes the connection), so a long-lived host that starts a thread per task holds
one connection per *live* thread that used the runtime — never one per thread it ever ran.

Tuned for a crash-safe single node: WAL journal, ``synchronous=FULL`` (a
committed terminal state survives power loss as well as a crash), a busy
timeout, foreign keys, and write transactions that take the write lock up
front (``BEGIN IMMEDIATE``) so two writers never deadlock on a lock upgrade.
Reads run in a deferred transaction (one snapshot) and never write.

An empty database gets the head schema from ``ql_core/db/schema_sqlite.sql`` in one
transaction (``ql_core.db.fresh_schema``); an older one is upgraded by Alembic
(``ql_core.db.migrate``), which is imported only then: checking costs one SELECT.
Concurrent first starts serialize on an ``flock`` beside the database, so 50
processes creating the same data dir at once all succeed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import threading
import weakref
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote

from ql_core.errors import ConfigError, DatabaseError
from ql_core.ports.journal import ConflictError, StoreBusyError, StoreError

from ql_core.db.keep_wal import keep_wal_on_close

__all__ = ["sqlite_path", "SqliteConnections", "PAGE_SIZE", "WAL_CHECKPOINT_BYTES", "write_lock", "MIN_SQLITE_VERSION",
           "check_sqlite_version"]

#: Page size of a new run database (bytes). Every B-tree a commit touches costs one page in the WAL
#: (and one at the checkpoint): a task's commits touch about twenty, each changing a row of a few
#: hundred bytes, so small pages are most of what keeps the bytes written per task low (issue 25;
#: ``bench/bench_edge.py``, ``bench/wal_pages.py``). SQLite's default is 4096. At 512 a task's commits
#: write ~38 frames of 536 bytes (20 KiB of WAL) where 1024 wrote ~35 of 1048 (37 KiB): rows wider
#: than a 512-byte page's cell (an attempt with its handles, an event of a WITHOUT ROWID table past
#: ~100 bytes) spill into an overflow page, which costs fewer bytes than doubling every page.
PAGE_SIZE = 512
#: The WAL is checkpointed (automatically, by the writer that fills it) once it holds this many
#: bytes of frames: 4 MiB, what SQLite's default of 1000 pages meant at 4 KiB pages. Counted in bytes,
#: not pages, so small pages do not checkpoint (rewrite the hot pages, two more fsyncs) more often.
WAL_CHECKPOINT_BYTES = 4 << 20

_SCHEMA_VERSION_SQL = "SELECT version_num FROM alembic_version"


def sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///...`` URL; refuses in-memory and URI-parameter forms."""
    if not url.startswith("sqlite:///"):
        raise ConfigError("the edge-sqlite journal needs database_url = \"sqlite:////abs/path/ql.db\" "
                          "(use journal = \"cluster-fenced\" for PostgreSQL)")
    raw = unquote(url[len("sqlite:///"):])
    if raw in ("", ":memory:") or raw.startswith(":memory:") or "?" in raw or "mode=memory" in raw:
        raise ConfigError("database_url points at an in-memory SQLite database: runs would vanish with "
                          "the process; give a file path, e.g. sqlite:////var/lib/myhost/ql/ql.db")
    return Path(os.path.abspath(raw))


#: One lock per database file in this process, held by each write transaction on it (all its
#: connections: a store's per-thread ones, and those of other tables of the same file). Threads of
#: one process then queue for the write lock here, and the one waiting is woken the moment it is
#: free — SQLite's busy handler instead *sleeps* (1, 2, 5, 10 … ms) and polls, which made a
#: multi-threaded writer (``ql worker``: runner threads, control loop, log shipper on one file)
#: wait milliseconds per commit for a lock held for a fraction of one. Other processes still meet
#: on SQLite's own lock and busy timeout.
_WRITE_LOCKS: dict[str, threading.RLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def write_lock(path: Path | str) -> threading.RLock:
    """This process's lock for write transactions on the database file ``path``."""
    key = os.path.abspath(os.fspath(path))
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(key)
        if lock is None:
            lock = _WRITE_LOCKS[key] = threading.RLock()
        return lock


def _forget_write_locks() -> None:
    # A forked child starts with no thread of ours holding anything: fresh locks (one held by
    # another thread at the fork would otherwise never be released in the child).
    global _WRITE_LOCKS_GUARD
    _WRITE_LOCKS_GUARD = threading.Lock()
    _WRITE_LOCKS.clear()


os.register_at_fork(after_in_child=_forget_write_locks)


#: The oldest SQLite the schema works with: generated columns (``ql_run.status_order``,
#: ``ql_log_artifact.log_order``; revisions 0013 and 0015) came in 3.31 (January 2020).
MIN_SQLITE_VERSION = (3, 31, 0)


def check_sqlite_version(found: tuple[int, int, int] = sqlite3.sqlite_version_info) -> None:
    """Refuse, naming the fix, an SQLite too old for the schema (else its first statement would fail
    with a bare syntax error)."""
    if found < MIN_SQLITE_VERSION:
        need = ".".join(map(str, MIN_SQLITE_VERSION))
        raise DatabaseError(f"ql needs SQLite {need} or newer; this Python is linked with SQLite "
                            f"{'.'.join(map(str, found))}: use a Python built with a newer SQLite "
                            f"(any python.org, Debian 11+, Ubuntu 20.04+ or Alpine build is)")


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class SqliteConnections:
    """Per-thread connections to one SQLite file, and the transactions the store runs on them."""

    def __init__(self, path: Path, *, busy_timeout_ms: int, create: bool = True, read_only: bool = False) -> None:
        self.path = path
        #: This file's key in the process's write locks (:func:`write_lock`), made absolute once.
        self._lock_key = os.path.abspath(os.fspath(path))
        #: False: the file must exist (opened ``mode=rw``) and is never migrated.
        self.create = create
        #: True: opened ``mode=ro`` with ``query_only`` (nothing can be written at all).
        self.read_only = read_only
        self._busy_s = busy_timeout_ms / 1000
        self._busy_ms = int(busy_timeout_ms)
        self._local = threading.local()
        #: Every open connection, by its slot (a live thread's, until that thread ends).
        self._all: dict[int, sqlite3.Connection] = {}
        # Re-entrant: a slot's finalizer may run in any thread, even one that holds the lock
        # (a garbage collection inside ``connection()``).
        self._lock = threading.RLock()
        self._closed = False
        self._trace: Callable[[int, str], None] | None = None

    # -- connections -----------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        check_sqlite_version()
        if self.read_only:
            uri = f"file:{self.path.as_posix()}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=self._busy_s, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
        else:
            if self.create:
                _create_private(self.path)
            conn = sqlite3.connect(f"file:{self.path.as_posix()}?mode=rw", uri=True, timeout=self._busy_s,
                                   isolation_level=None, check_same_thread=False)
            try:
                if self.create and os.stat(self.path).st_size == 0:
                    # A new database: its page size is chosen before its first page exists (and before
                    # WAL mode, which fixes it). An existing database keeps the size it has.
                    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                conn.close()
                from ql_core.db.integrity import on_read_only_fs, open_frozen

                if self.create or not on_read_only_fs(self.path.parent):
                    raise
                # A reader (ql list) on a read-only file system just reads: nothing can change it.
                conn = open_frozen(self.path)
            else:
                conn.execute("PRAGMA synchronous=FULL")
                page = int(conn.execute("PRAGMA page_size").fetchone()[0])
                conn.execute(f"PRAGMA wal_autocheckpoint={max(1000, WAL_CHECKPOINT_BYTES // page)}")
                # The WAL outlives this connection: no checkpoint of every page at each close (ql_core.db.keep_wal).
                keep_wal_on_close(conn, str(self.path))
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA trusted_schema=OFF")
        return conn

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use; used only by this thread; closed when
        the thread ends, or with :meth:`close`)."""
        slot = getattr(self._local, "slot", None)
        if slot is None:
            if self._closed:
                raise StoreError("the run store is closed")
            try:
                conn = self._connect()
            except sqlite3.Error as exc:
                raise _store_error(exc, self.path) from None
            slot = _Slot(conn)
            with self._lock:
                if self._closed:  # closed while we connected: do not leave this one open
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
                    raise StoreError("the run store is closed")
                self._all[id(slot)] = conn
                if self._trace is not None:
                    self._attach(conn, self._trace)
            # The thread-local dict is dropped when this thread ends, and the slot with it: close
            # its connection then (weakly bound to us: a slot must not keep the store alive).
            release = weakref.finalize(slot, _release, weakref.ref(self), id(slot), conn)
            # Never at interpreter exit: atexit runs in the main thread while a daemon thread (a
            # supervisor in its round) may be inside a statement on this very connection, and
            # closing it under that statement crashed the exiting host (SIGSEGV, about 1 exit in
            # 10). Every commit is durable already; the OS closes the file.
            release.atexit = False
            self._local.slot = slot
        return slot.conn

    def open_connections(self) -> int:
        """How many connections are open now (diagnostics, tests): one per live thread that used it."""
        with self._lock:
            return len(self._all)

    def _forget(self, key: int) -> sqlite3.Connection | None:
        with self._lock:
            return self._all.pop(key, None)

    def trace(self, callback: Callable[[int, str], None] | None) -> None:
        """Diagnostics: ``callback(connection_id, sql)`` for every statement on every connection
        (current and future), None to stop. Only statements — parameters are never passed."""
        with self._lock:
            self._trace = callback
            for conn in self._all.values():
                self._attach(conn, callback)

    @staticmethod
    def _attach(conn: sqlite3.Connection, callback: Callable[[int, str], None] | None) -> None:
        key = id(conn)
        conn.set_trace_callback(None if callback is None else (lambda statement: callback(key, statement)))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = list(self._all.values()), {}
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    # -- transactions -------------------------------------------------------------------
    def write(self) -> _WriteTransaction:
        """One write transaction (``BEGIN IMMEDIATE``): commit on success, roll back on any error."""
        if self.read_only:
            raise StoreError("this runtime was opened read-only; nothing may be written")
        return _WriteTransaction(self)

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read snapshot (deferred ``BEGIN``); never writes."""
        conn = self.connection()
        try:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path) from None

    # -- schema -------------------------------------------------------------------------
    def schema_revision(self) -> str | None:
        """The Alembic revision recorded in the database (None: empty database)."""
        try:
            rows = self.connection().execute(_SCHEMA_VERSION_SQL).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise _store_error(exc, self.path) from None
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path) from None
        # One row per branch head (core's, the cluster branch's): named comma-separated, sorted,
        # as ql_core.db.migrate.current_revision and SCHEMA_HEAD name them.
        return ",".join(sorted(str(r[0]) for r in rows)) or None

    def ensure_schema(self, head: str) -> None:
        """Bring the schema to ``head`` (Alembic, under an flock); read-only: require it."""
        if not self.create and not self.read_only and not self.path.exists():
            raise DatabaseError(f"no run database at {self.path}: nothing has run with this data dir "
                                f"(check --data-dir / QL_DATA_DIR)")
        if self.schema_revision() == head:
            return
        if self.read_only or not self.create:
            raise DatabaseError(f"the run database {self.path} is at schema "
                                f"{self.schema_revision() or 'none'}, this ql needs {head}: "
                                f"run `ql db upgrade` (or any writing command) first")
        with _migration_lock(self.path) as lock_fd:
            if self.schema_revision() == head:  # another process migrated while we waited
                return
            if self.schema_revision() is None:
                # An empty database: the head schema in one transaction, no Alembic (first use).
                from ql_core.db.fresh_schema import create_fresh

                try:
                    if create_fresh(self.connection(), head):
                        return
                except sqlite3.Error as exc:
                    raise _store_error(exc, self.path) from None
            from ql_core.db.migrate import migrate_url_in_child

            # In a child process, so this long-lived process never loads SQLAlchemy, Alembic and
            # SQLModel (≈ 50 MiB); the child shares the lock, which then outlives our death.
            migrate_url_in_child(f"sqlite:///{self.path}", keep_fds=(lock_fd,))


class _WriteTransaction:
    """:meth:`SqliteConnections.write` as a plain context manager (two per task: a generator-based
    one costs a generator, its frame and contextlib's wrapper each time)."""

    __slots__ = ("_conn", "_db", "_lock")

    def __init__(self, db: SqliteConnections) -> None:
        self._db = db

    def __enter__(self) -> sqlite3.Connection:
        db = self._db
        conn = self._conn = db.connection()
        # Looked up at each write, not kept: a forked child has fresh ones. A plain dict read on the
        # hot path; the guarded creation only the first time (or after a fork).
        lock = self._lock = _WRITE_LOCKS.get(db._lock_key) or write_lock(db._lock_key)
        if not lock.acquire(timeout=db._busy_s):  # as long as SQLite's busy timeout would wait
            raise StoreBusyError(f"the run database {db.path} is busy; retry")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            lock.release()
            if isinstance(exc, sqlite3.Error):
                raise _store_error(exc, db.path) from None
            raise
        return conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        conn = self._conn
        try:
            if exc is None:
                try:
                    conn.execute("COMMIT")
                    return False
                except BaseException as failed:
                    exc = failed
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _store_error(exc, self._db.path) from None
            if kind is None:
                raise exc  # COMMIT failed with something else: never a silent success
            return False  # the body's own exception goes on as it was
        finally:
            self._lock.release()


class _Slot:
    """A thread's connection, held in the thread-local storage: dropped when the thread ends."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def _release(store_ref: weakref.ref[SqliteConnections], key: int, conn: sqlite3.Connection) -> None:
    """A thread ended (or its store went away): close its connection unless ``close`` already did.
    Runs in whatever thread drops the slot, with no transaction open on it (transactions are
    context managers of the thread that owns the connection)."""
    store = store_ref()
    if store is not None and store._forget(key) is None:  # noqa: SLF001 - this module's own object
        return  # the store was closed: close() closed it
    with contextlib.suppress(sqlite3.Error):
        conn.close()


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (it would use the umask, often 0644)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise DatabaseError(f"cannot create the run database {path} ({exc.strerror}); check the data dir's "
                            f"owner and permissions (`ql doctor`)") from None
    os.close(fd)


def _store_error(exc: sqlite3.Error, path: Path) -> StoreError:
    if _is_busy(exc):
        return StoreBusyError(f"the run database {path} is busy; retry")
    if isinstance(exc, sqlite3.IntegrityError):
        return ConflictError(f"a concurrent writer changed the same run ({type(exc).__name__})")
    from ql_core.db.integrity import explain_sqlite_error

    explained = explain_sqlite_error(exc, path)  # damaged, a full or read-only disk: one line, the fix
    if explained is not None:
        return StoreError(explained)
    text = str(exc).lower()
    if "unable to open" in text or "readonly" in text or "read-only" in text:
        return StoreError(f"cannot open the run database {path} for writing ({exc}); check the data dir's "
                          f"owner and permissions (`ql doctor`)")
    return StoreError(f"run database error: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _migration_lock(db_path: Path) -> Iterator[int]:
    """An exclusive ``flock`` on ``<db>.migrate-lock`` (a regular file we own; never a FIFO)."""
    lock_path = db_path.with_name(db_path.name + ".migrate-lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DatabaseError(f"{lock_path} is a symlink; remove it") from None
        raise DatabaseError(f"cannot create {lock_path} ({exc.strerror}); check the data dir") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DatabaseError(f"{lock_path} is not a regular file; remove it")
        from ql_core.paths import flock_within  # bounded: the holder may be a stopped process

        flock_within(fd, lock_path, "the run database's schema migration")
        yield fd
    finally:
        os.close(fd)
