"""The read path of an edge-sqlite run database: stdlib ``sqlite3`` and prebuilt statements, no plugins.

``ql status``, ``list``, ``events`` and ``logs`` answer a terminal run with one or two SELECTs. The
store that writes this file (the ``edge-sqlite`` plugin) sits behind pluggy, its plugin host and the
journal kernel; loading all of that costs a reader more than twice the CPU of its SELECT (issue 25).
:class:`SqliteReads` reads the same tables with the same statements
(:func:`ql_core.db.journal_sql.shared_statements`) and builds the same records, importing only
``sqlite3`` and the record types.

It only *reads*: it opens an existing database (``mode=rw``, as the store's own readers do: a WAL
database needs its shared-memory file) and never creates, migrates or writes anything. Whatever is
not the plain case — no database, another schema revision, any SQLite error — makes :meth:`open`
return None, and the caller takes the full path (``Runtime.open(create=False)``), which explains it.
The CLI decides when this path may answer (:mod:`ql_core.cli.quick_read`).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ql_core.records import AttemptRecord, EventRecord, LogFacts, RunRecord, RunView, log_facts_of, run_view

from .journal_sql import shared_statements
from .keep_wal import keep_wal_on_close
from .sqlite_events import SELECT_EVENTS
from .sqlite_logs import SELECT_LOG
from .sqlite_runs import RUN_ROW, SELECT_ATTEMPTS_OF_RUN, SELECT_RUNS_NEWEST, SELECT_RUNS_NEWEST_BY_STATUS, attempts_of_runs

__all__ = ["SqliteReads", "EDGE_BUSY_TIMEOUT_MS"]

#: The edge profile's ``busy_timeout_ms`` (a test keeps them equal), for a read on the built-in
#: defaults, which are resolved without loading the profiles (:mod:`ql_core.cli.quick_read`).
EDGE_BUSY_TIMEOUT_MS = 5000

_SQL = shared_statements("?")
_SCHEMA_VERSION = "SELECT version_num FROM alembic_version"


class SqliteReads:
    """Read-only queries over one edge-sqlite run database (one connection, this thread's)."""

    #: The store whose file this reads (``resolve_run_id`` names it in a message).
    name = "edge-sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(cls, path: Path, *, busy_timeout_ms: int, schema_head: str) -> SqliteReads | None:
        """The reads of the database at ``path``, or None when it is missing, empty, at another schema
        revision than ``schema_head``, or cannot be opened (the full path then says why)."""
        try:
            if os.stat(path).st_size == 0:
                return None
        except OSError:
            return None
        conn = None
        try:
            conn = sqlite3.connect(f"file:{path.as_posix()}?mode=rw", uri=True, timeout=busy_timeout_ms / 1000,
                                   isolation_level=None, check_same_thread=False)
            # A reader must not fold the writers' WAL into ql.db when it closes (reads touch nothing).
            keep_wal_on_close(conn, str(path))
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            conn.execute("PRAGMA trusted_schema=OFF")
            revision = ",".join(sorted(str(r[0]) for r in conn.execute(_SCHEMA_VERSION)))
        except sqlite3.Error:
            if conn is not None:
                conn.close()
            return None
        if revision != schema_head:
            conn.close()
            return None
        return cls(conn)

    def close(self) -> None:
        self._conn.close()

    # -- the reads (each one snapshot, as the store's) ----------------------------------------------
    def _snapshot(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN")
        return self._conn

    def _end(self) -> None:
        self._conn.execute("COMMIT")

    def view(self, run_id: str) -> RunView | None:
        c = self._snapshot()
        try:
            row = c.execute(_SQL["SELECT_RUN"], (run_id,)).fetchone()
            if row is None:
                return None
            attempts = [AttemptRecord(*a) for a in c.execute(SELECT_ATTEMPTS_OF_RUN, (run_id,))]
        finally:
            self._end()
        return run_view(RunRecord(*row), attempts)

    def list_views(self, *, status: str | None, limit: int) -> list[RunView]:
        c = self._snapshot()
        try:
            if status:
                found = c.execute(SELECT_RUNS_NEWEST_BY_STATUS, (status, limit))
            else:
                found = c.execute(SELECT_RUNS_NEWEST, (limit,))
            runs = [RunRecord(*r[RUN_ROW]) for r in found]  # a row ends with run_key (revision 0016)
            by_run: dict[str, list[AttemptRecord]] = {r.id: [] for r in runs}
            if runs:
                for a in c.execute(attempts_of_runs(len(by_run)), list(by_run)):
                    by_run[a[1]].append(AttemptRecord(*a))
        finally:
            self._end()
        return [run_view(r, by_run[r.id]) for r in runs]

    def events(self, run_id: str) -> list[EventRecord] | None:
        c = self._snapshot()
        try:
            if c.execute(_SQL["SELECT_RUN"], (run_id,)).fetchone() is None:
                return None
            return [EventRecord(*e) for e in c.execute(SELECT_EVENTS, (run_id,))]
        finally:
            self._end()

    def run_ids_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        """As the store's: one range of the primary key, never a scan."""
        if not prefix:
            return []
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._conn.execute(_SQL["SELECT_RUN_IDS_IN_RANGE"], (prefix, upper, limit)).fetchall()
        return [r[0] for r in rows if r[0].startswith(prefix)]

    def log_facts(self, log_id: str) -> LogFacts | None:
        row = self._conn.execute(SELECT_LOG, (log_id,)).fetchone()  # its attempt through the run (0016)
        return None if row is None else log_facts_of(row)
