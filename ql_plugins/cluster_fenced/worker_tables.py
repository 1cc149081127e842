"""The worker's own table: one row per claimed attempt — its fence, its local step, its outbox payload.

It lives in the worker's local database (``<data_dir>/worker.db``, the same SQLite file as the
worker's local run store: WAL, ``synchronous=FULL``, 0600 in a 0700 data dir), created by this
plugin with ``CREATE TABLE IF NOT EXISTS`` and versioned in ``ql_worker_meta`` — not by an Alembic
revision: the table exists only on workers, is never shared, and the common schema (which every
edge database migrates) should not carry a table that can never be used there.

``ql_worker_lease`` (``attempt_id`` is the control plane's attempt id):

=================  =====================================================================
column             meaning
=================  =====================================================================
fence              ``worker_id``, ``worker_generation``, ``session``, ``lease_generation``,
                   ``lease_token`` — everything a fenced call presents (the token is erased
                   once the row has its final answer)
state              ``claimed`` (claim answered; nothing started) → ``launching`` (written
                   in the local create commit, before the spawn) → ``outbox`` (the attempt
                   ended locally: written in its local terminal commit; the payload below is
                   fixed) → ``answered`` (a final answer came back; an unsynced commit)
stop_reason        the worker stopped the task itself: ``FENCED`` (the database said its lease
                   is gone), ``SELF_FENCED`` (its own lease deadline passed) or
                   ``WORKER_DRAINED`` (handed back on drain); ``stopped_at_ms`` its wall time
kind … digest      the outbox payload: ``complete`` (exit code, start, finish — database
                   clock —, signalled, ``completion_digest``) or ``lost`` / ``released``
                   (reason, signalled) — computed once, so a replay is byte-identical
not_before_ms      a self-fenced attempt's report is sent only after its lease must have
                   expired at the database (the sweeper decides first)
answer             the final answer (``applied``, ``already_completed``, ``fenced``, …)
=================  =====================================================================

Rows with an answer are kept (token erased) for ``answered_retention_s``, then deleted.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ql_core.errors import DatabaseError

__all__ = ["LeaseRow", "WorkerLeases", "WORKER_SCHEMA_VERSION", "LEASE_COLUMNS", "lease_row_in", "mark_launching_in",
           "to_outbox_in"]

WORKER_SCHEMA_VERSION = 1

_DDL = (
    "CREATE TABLE IF NOT EXISTS ql_worker_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS ql_worker_lease (
        attempt_id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        worker_id TEXT NOT NULL,
        worker_generation INTEGER NOT NULL,
        session TEXT NOT NULL,
        lease_generation INTEGER NOT NULL,
        lease_token TEXT,
        state TEXT NOT NULL,
        stop_reason TEXT,
        stopped_at_ms INTEGER,
        kind TEXT,
        exit_code INTEGER,
        started_at_ms INTEGER,
        finished_at_ms INTEGER,
        signalled INTEGER,
        reason TEXT,
        digest TEXT,
        not_before_ms INTEGER,
        answer TEXT,
        answered_at_ms INTEGER,
        tries INTEGER NOT NULL DEFAULT 0,
        claimed_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS ix_ql_worker_lease_state ON ql_worker_lease (state, attempt_id)",
)

LEASE_COLUMNS = ("attempt_id, run_id, worker_id, worker_generation, session, lease_generation, lease_token, state, "
                 "stop_reason, stopped_at_ms, kind, exit_code, started_at_ms, finished_at_ms, signalled, reason, "
                 "digest, not_before_ms, answer, answered_at_ms, tries, claimed_at_ms, updated_at_ms")

_INSERT = (f"INSERT INTO ql_worker_lease ({LEASE_COLUMNS}) VALUES "
           "(?, ?, ?, ?, ?, ?, ?, 'claimed', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
           "0, ?, ?)")
_SELECT = f"SELECT {LEASE_COLUMNS} FROM ql_worker_lease WHERE attempt_id = ?"
_BY_STATE = f"SELECT {LEASE_COLUMNS} FROM ql_worker_lease WHERE state = ? ORDER BY attempt_id LIMIT ?"
_UNANSWERED = (f"SELECT {LEASE_COLUMNS} FROM ql_worker_lease WHERE state <> 'answered' AND attempt_id > ? "
               "ORDER BY attempt_id LIMIT ?")
_SET_STATE = "UPDATE ql_worker_lease SET state = ?, updated_at_ms = ? WHERE attempt_id = ? AND state = ?"
_STOP = ("UPDATE ql_worker_lease SET stop_reason = ?, stopped_at_ms = ?, not_before_ms = ?, updated_at_ms = ? "
         "WHERE attempt_id = ? AND stop_reason IS NULL AND state IN ('claimed', 'launching')")
_OUTBOX = ("UPDATE ql_worker_lease SET state = 'outbox', kind = ?, exit_code = ?, started_at_ms = ?, "
           "finished_at_ms = ?, signalled = ?, reason = ?, digest = ?, updated_at_ms = ? "
           "WHERE attempt_id = ? AND state IN ('claimed', 'launching')")
_ANSWER = ("UPDATE ql_worker_lease SET state = 'answered', answer = ?, answered_at_ms = ?, lease_token = NULL, "
           "updated_at_ms = ? WHERE attempt_id = ? AND state <> 'answered'")
_TRIED = "UPDATE ql_worker_lease SET tries = tries + 1, kind = ?, updated_at_ms = ? WHERE attempt_id = ?"
_PURGE = ("DELETE FROM ql_worker_lease WHERE attempt_id IN (SELECT attempt_id FROM ql_worker_lease "
          "WHERE state = 'answered' AND answered_at_ms < ? ORDER BY answered_at_ms LIMIT ?)")
_COUNT = "SELECT state, count(*) FROM ql_worker_lease GROUP BY state"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class LeaseRow:
    attempt_id: str
    run_id: str
    worker_id: str
    worker_generation: int
    session: str
    lease_generation: int
    lease_token: str | None = field(repr=False)
    state: str
    stop_reason: str | None
    stopped_at_ms: int | None
    kind: str | None
    exit_code: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    signalled: int | None
    reason: str | None
    digest: str | None
    not_before_ms: int | None
    answer: str | None
    answered_at_ms: int | None
    tries: int
    claimed_at_ms: int
    updated_at_ms: int

    def fence(self) -> Any:
        from .results import LeaseFence

        if self.lease_token is None:
            raise ValueError("this lease row has its final answer; its token is erased")
        return LeaseFence(self.worker_id, self.worker_generation, self.session, self.attempt_id,
                          self.lease_generation, self.lease_token)


def lease_row_in(c: Any, attempt_id: str) -> LeaseRow | None:
    """The attempt's lease row, read inside the transaction of connection ``c``."""
    row = c.execute(_SELECT, (attempt_id,)).fetchone()
    return LeaseRow(*row) if row else None


def mark_launching_in(c: Any, attempt_id: str) -> bool:
    """``claimed`` → ``launching`` inside the transaction of ``c`` (the worker's local create commit)."""
    return c.execute(_SET_STATE, ("launching", _now_ms(), attempt_id, "claimed")).rowcount == 1


def to_outbox_in(c: Any, attempt_id: str, payload: Any) -> bool:
    """Fix the payload (once) inside the transaction of ``c``: the row goes to the outbox."""
    return c.execute(_OUTBOX, (payload.kind, payload.exit_code, payload.started_at_ms, payload.finished_at_ms,
                               int(payload.signalled), payload.reason, payload.digest, _now_ms(),
                               attempt_id)).rowcount == 1


class WorkerLeases:
    """The worker's lease/outbox rows in ``worker.db`` (their own connections, same file)."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 5000, create: bool = True) -> None:
        from ql_plugins.edge_sqlite.connection import SqliteConnections

        self.path = path
        self._db = SqliteConnections(path, busy_timeout_ms=busy_timeout_ms, create=create)
        if create:
            self._ensure()

    def close(self) -> None:
        self._db.close()

    def _ensure(self) -> None:
        with self._db.write() as c:
            for ddl in _DDL:
                c.execute(ddl)
            row = c.execute("SELECT value FROM ql_worker_meta WHERE key = 'schema'").fetchone()
            if row is None:
                c.execute("INSERT INTO ql_worker_meta (key, value) VALUES ('schema', ?)", (str(WORKER_SCHEMA_VERSION),))
            elif int(row[0]) > WORKER_SCHEMA_VERSION:
                raise DatabaseError(f"{self.path} was written by a newer ql (worker schema {row[0]}); upgrade ql")

    # -- writes ----------------------------------------------------------------------------------
    def insert_claimed(self, rows: Iterable[tuple[Any, str]], *, also: Callable[[Any], None] | None = None) -> None:
        """One transaction for a whole claim: ``(LeaseFence, run_id)`` per claimed attempt; ``also``
        writes more rows of the same file in that transaction (the log shipper's tracking rows).

        Unsynced (``synchronous=NORMAL``, as :meth:`_unsynced`): a SIGKILL never loses it (the
        commit is in the WAL, in the page cache), and nothing of these attempts spawns before their
        local create commit, which is fsync'd and carries this one with it (the WAL is one ordered
        file). Every other commit that can follow it for these attempts before a spawn (the outbox
        row of an attempt released or never created) is fsync'd too. Only a power cut (or an OS
        crash) between the two can lose the rows — and then nothing was spawned for them: the
        control plane's leases expire (claimed: back to the queue; started: ``lost`` or a retry, as
        for every attempt the cut stopped). This takes one fsync (~4 ms here) off the path from a
        claim to its ``start`` call and off the control loop."""
        now = _now_ms()
        with self._unsynced() as c:
            c.executemany(_INSERT, [(f.attempt_id, run_id, f.worker_id, f.worker_generation, f.session,
                                     f.lease_generation, f.lease_token, now, now) for f, run_id in rows])
            if also is not None:
                also(c)

    @contextlib.contextmanager
    def _unsynced(self) -> Iterator[Any]:
        """A write transaction whose COMMIT skips the WAL fsync (``synchronous=NORMAL``).

        Only for a final answer: a copy of what the control database already holds durably. A
        SIGKILL never loses such a commit (it is in the WAL, in the page cache); only a power cut
        before the next fsync'd commit of this file can, and then the row is back in ``outbox``
        with its token, is sent again and gets a final answer again (an exact replay is
        ``already_completed``; anything later ``fenced`` / ``already_terminal``): the control plane
        never changes. Every commit that could depend on the answer (the purge of answered rows,
        the local history purge) is fsync'd, and the WAL is one ordered file: its fsync carries
        every earlier commit too, so nothing is deleted before the answer that allows it is durable.
        """
        conn = self._db.connection()
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._db.write() as c:
                yield c
        finally:
            conn.execute("PRAGMA synchronous=FULL")

    def set_state(self, attempt_id: str, new: str, *, expected: str) -> bool:
        with self._db.write() as c:
            return c.execute(_SET_STATE, (new, _now_ms(), attempt_id, expected)).rowcount == 1

    def mark_stopped(self, attempt_id: str, reason: str, *, stopped_at_ms: int, not_before_ms: int | None) -> bool:
        """The worker stops the attempt itself (first reason kept)."""
        with self._db.write() as c:
            return c.execute(_STOP, (reason, stopped_at_ms, not_before_ms, _now_ms(), attempt_id)).rowcount == 1

    def to_outbox(self, attempt_id: str, payload: Any) -> bool:
        """Fix the payload (once): the row goes to the outbox (its own commit: an attempt with no
        local terminal transition — released, never created, spec unreadable)."""
        with self._db.write() as c:
            return to_outbox_in(c, attempt_id, payload)

    def mark_answered(self, attempt_id: str, answer: str) -> bool:
        """The final answer (unsynced: see :meth:`_unsynced`)."""
        now = _now_ms()
        with self._unsynced() as c:
            return c.execute(_ANSWER, (answer, now, now, attempt_id)).rowcount == 1

    def mark_answered_many(self, answers: Iterable[tuple[str, str]], *,
                           also: Callable[[Any], None] | None = None) -> None:
        """:meth:`mark_answered` for many ``(attempt_id, answer)`` pairs, in one unsynced transaction;
        ``also(c)`` writes more rows of the same file in it (the log shipper's, for the empty logs
        the same answers acknowledged)."""
        now = _now_ms()
        with self._unsynced() as c:
            c.executemany(_ANSWER, [(answer, now, now, attempt_id) for attempt_id, answer in answers])
            if also is not None:
                also(c)

    def note_try(self, attempt_id: str, kind: str | None = None, row: LeaseRow | None = None) -> None:
        with self._db.write() as c:
            c.execute(_TRIED, (kind if kind is not None else (row.kind if row else None), _now_ms(), attempt_id))

    def purge_answered(self, older_than_ms: int, limit: int = 256) -> int:
        with self._db.write() as c:
            return c.execute(_PURGE, (older_than_ms, limit)).rowcount

    # -- reads -------------------------------------------------------------------------------------
    def get(self, attempt_id: str) -> LeaseRow | None:
        row = self._db.connection().execute(_SELECT, (attempt_id,)).fetchone()
        return LeaseRow(*row) if row else None

    def by_state(self, state: str, limit: int = 1000) -> list[LeaseRow]:
        return [LeaseRow(*r) for r in self._db.connection().execute(_BY_STATE, (state, limit))]

    def unanswered(self, *, page: int = 256) -> list[LeaseRow]:
        """Every row without a final answer (paged by attempt id; the set is bounded by slots + outbox)."""
        out: list[LeaseRow] = []
        cursor = ""
        while True:
            rows = [LeaseRow(*r) for r in self._db.connection().execute(_UNANSWERED, (cursor, page))]
            out += rows
            if len(rows) < page:
                return out
            cursor = rows[-1].attempt_id

    def unshipped_logs(self, log_ids: list[str]) -> set[str]:
        """Which of these local logs the log shipper has not finalized in the artifact store yet
        (table ``ql_log_ship`` of :mod:`.log_shipper`; none when no artifact store ever ran here)."""
        import sqlite3

        if not log_ids:
            return set()
        marks = ", ".join("?" * len(log_ids))
        try:
            rows = self._db.connection().execute(
                f"SELECT log_id FROM ql_log_ship WHERE state = 'shipping' AND log_id IN ({marks})", tuple(log_ids))
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return set()
            raise
        return {r[0] for r in rows}

    def counts(self) -> dict[str, int]:
        return {state: int(n) for state, n in self._db.connection().execute(_COUNT)}
