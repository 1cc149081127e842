"""The worker's record of each attempt's log shipping: table ``ql_log_ship`` in ``worker.db``.

One row per attempt this worker claimed, kept by :class:`.log_shipper.LogShipper` (and, for an empty
log acknowledged with its completion, by the outbox's commit of the answers): ``shipping`` ->
``final`` (the store acknowledged the finalize; the lease token erased) -> deleted with the local
log, or ``abandoned`` (the store refused the attempt for good). Its own connection to the worker's
local database (WAL), queued with the process's other writers of that file.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ql_core.clock import now_ms
from ql_plugins.edge_sqlite.connection import write_lock

__all__ = ["ShipRow", "ShipTable", "SHIP_PAGE", "open_ship_table"]

#: Attempts looked at per round (oldest first); the rest wait for the next round.
SHIP_PAGE = 64

_DDL = (
    """CREATE TABLE IF NOT EXISTS ql_log_ship (
        attempt_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        log_id TEXT NOT NULL,
        lease_generation INTEGER NOT NULL,
        lease_token TEXT,
        state TEXT NOT NULL,
        total_bytes INTEGER,
        reason TEXT,
        created_at_ms INTEGER NOT NULL,
        finalized_at_ms INTEGER,
        updated_at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS ix_ql_log_ship_state ON ql_log_ship (state, created_at_ms)",
)
_COLUMNS = "attempt_id, run_id, log_id, lease_generation, lease_token, state, total_bytes, reason, finalized_at_ms"


@dataclass(frozen=True, slots=True)
class ShipRow:
    attempt_id: str
    run_id: str
    log_id: str
    lease_generation: int
    lease_token: str | None = field(repr=False)
    #: ``shipping`` → ``final`` (acknowledged; token erased) → deleted with the local log;
    #: ``abandoned`` (the store refused this attempt for good, or its log can never match).
    state: str
    total_bytes: int | None
    reason: str | None
    finalized_at_ms: int | None


class ShipTable:
    """``ql_log_ship`` in the worker's local database (same file, WAL; its own connection)."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000) -> None:
        self._path = path
        self._busy_ms = busy_timeout_ms
        self._lock = threading.Lock()
        #: The process's writer lock of this file (edge_sqlite.connection.write_lock): the other
        #: writers of worker.db in this process queue with ours instead of SQLite's sleeping retries.
        self._file_lock = write_lock(path)
        self._conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                                     check_same_thread=False)
        self._conn.execute("PRAGMA synchronous=FULL")
        for ddl in _DDL:
            self._conn.execute(ddl)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _exec(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _exec_unsynced(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """One statement whose commit skips the WAL fsync (``synchronous=NORMAL``): only for rows
        that copy what the artifact store already holds durably — an acknowledged finalize, a
        permanent refusal, the forgetting of a deleted log. A SIGKILL never loses such a commit (it
        is in the WAL); a power cut before the next fsync'd commit of ``worker.db`` may, and then
        the row is back in its earlier state and is done again: the store answers ``finalized`` /
        refuses again, and a log already deleted is forgotten again. Never a lost byte: the local
        log is deleted only by a later fsync'd commit (``mark_log_deleted``), and the WAL's fsync
        carries every earlier commit."""
        with self._file_lock, self._lock:
            self._conn.execute("PRAGMA synchronous=NORMAL")
            try:
                self._conn.execute(sql, params)
            finally:
                self._conn.execute("PRAGMA synchronous=FULL")

    def track(self, rows: list[tuple[str, str, str, int, str]]) -> None:
        """Remember claimed attempts (attempt id, run id, log id, lease generation, token): one commit."""
        with self._file_lock, self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self.track_in(self._conn, rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    @staticmethod
    def track_in(c: Any, rows: list[tuple[str, str, str, int, str]]) -> None:
        """:meth:`track` inside the transaction of another connection to the same file (the claim's)."""
        now = now_ms()
        c.executemany(
            "INSERT OR IGNORE INTO ql_log_ship (attempt_id, run_id, log_id, lease_generation, lease_token,"
            " state, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, 'shipping', ?, ?)",
            [(*r, now, now) for r in rows])

    def get(self, attempt_id: str) -> ShipRow | None:
        rows = self._exec(f"SELECT {_COLUMNS} FROM ql_log_ship WHERE attempt_id = ?", (attempt_id,))
        return ShipRow(*rows[0]) if rows else None

    def by_state(self, state: str, limit: int = SHIP_PAGE) -> list[ShipRow]:
        return [ShipRow(*r) for r in self._exec(
            f"SELECT {_COLUMNS} FROM ql_log_ship WHERE state = ? ORDER BY created_at_ms, attempt_id LIMIT ?",
            (state, limit))]

    @staticmethod
    def finalized_in(c: Any, attempt_ids: list[str]) -> None:
        """Empty logs acknowledged with their completions (0 bytes), inside the transaction of another
        connection to the same file (the one that records the completions' answers)."""
        now = now_ms()
        c.executemany("UPDATE ql_log_ship SET state = 'final', total_bytes = 0, finalized_at_ms = ?,"
                      " lease_token = NULL, updated_at_ms = ? WHERE attempt_id = ? AND state = 'shipping'",
                      [(now, now, attempt_id) for attempt_id in attempt_ids])

    def finalized(self, attempt_id: str, total_bytes: int) -> None:
        now = now_ms()
        self._exec_unsynced("UPDATE ql_log_ship SET state = 'final', total_bytes = ?, finalized_at_ms = ?,"
                            " lease_token = NULL, updated_at_ms = ? WHERE attempt_id = ? AND state = 'shipping'",
                            (total_bytes, now, now, attempt_id))

    def abandon(self, attempt_id: str, reason: str) -> None:
        now = now_ms()
        self._exec_unsynced("UPDATE ql_log_ship SET state = 'abandoned', reason = ?, lease_token = NULL,"
                            " updated_at_ms = ? WHERE attempt_id = ? AND state = 'shipping'",
                            (reason[:64], now, attempt_id))

    def forget(self, attempt_id: str) -> None:
        self._exec_unsynced("DELETE FROM ql_log_ship WHERE attempt_id = ?", (attempt_id,))

    def shipping_among(self, attempt_ids: list[str]) -> list[ShipRow]:
        """The rows of these attempts still ``shipping`` (at most :data:`SHIP_PAGE` ids per call)."""
        marks = ",".join("?" * len(attempt_ids))
        return [ShipRow(*r) for r in self._exec(
            f"SELECT {_COLUMNS} FROM ql_log_ship WHERE state = 'shipping' AND attempt_id IN ({marks})",
            tuple(attempt_ids))]

    def due_deletions(self, finalized_before_ms: int, limit: int = SHIP_PAGE) -> list[ShipRow]:
        return [ShipRow(*r) for r in self._exec(
            f"SELECT {_COLUMNS} FROM ql_log_ship WHERE state = 'final' AND finalized_at_ms < ?"
            " ORDER BY finalized_at_ms LIMIT ?", (finalized_before_ms, limit))]



def open_ship_table(data_dir: Path, busy_timeout_ms: int) -> ShipTable:
    """The table in the worker's local database (``<data_dir>/worker.db``)."""
    return ShipTable(Path(data_dir) / "worker.db", busy_timeout_ms=busy_timeout_ms)

