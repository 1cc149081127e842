"""The edge-sqlite journal backend: ql's whole run store in one SQLite file (stdlib ``sqlite3``).

Implements :class:`ql_core.ports.journal.JournalBackend`. Every statement is
prebuilt (:mod:`.statements`); no ORM is loaded on any path, so reading a
status costs a SELECT, not an import of SQLAlchemy. Core decides every state
change (:mod:`ql_core.outcome`, the services); this module runs the decision
inside one ``BEGIN IMMEDIATE`` transaction with compare-and-set on versions.

Receipt-journal rows (ADR-0007 §2.5) are never deleted while their receipt may
still exist: after the terminal commit the consumer deletes the receipt and
only *notes* the attempt here (:meth:`SqliteJournal.note_consumed`); the row
goes inside the next write this store makes anyway (the next create), or by
the reconciler's retention once it has seen the receipt missing. A task's
life is three commits: create, spawned, terminal.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from ql_core.crashpoints import crashpoint
from ql_core.states import RUN_TERMINAL
from ql_core.ports.context import RunEventInfo
from ql_core.ports.journal import (
    ATTEMPT_COLUMNS,
    DISPATCH_COLUMNS,
    RUN_COLUMNS,
    ConflictError,
    Decide,
    DispatchClaim,
    EventSpec,
    Snapshot,
    StoreError,
    Transition,
    create_facts,
)
from ql_core.records import (
    AttemptRecord,
    AttemptView,
    DispatchRecord,
    EventRecord,
    JournalEntry,
    LogFacts,
    NewRun,
    RunRecord,
    RunView,
)

from . import statements as sql
from .connection import SqliteConnections, sqlite_path

if TYPE_CHECKING:
    import sqlite3

    from ql_core.ports.context import RuntimeContext

__all__ = ["SqliteJournal", "MAX_NOTED", "FLUSH_BATCH", "OLDEST_SLACK"]

T = TypeVar("T")
#: Consumed attempts remembered in memory at most (beyond that, retention purges their rows).
MAX_NOTED = 4096
#: Noted rows deleted per piggybacked flush (keeps the host's create transaction small).
FLUSH_BATCH = 256
#: History by count reads at most this many pages of the oldest runs per call: non-terminal runs among
#: them (never purged) are stepped over, up to this bound.
OLDEST_SLACK = 4


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@functools.lru_cache(maxsize=64)
def _update_sql(table: str, columns: frozenset[str], where: str) -> str:
    sets = ", ".join(f"{c} = ?" for c in sorted(columns))
    return f"UPDATE {table} SET {sets} WHERE {where}"


def _view(run: RunRecord, attempts: list[AttemptRecord]) -> RunView:
    return RunView(
        run_id=run.id, name=run.name, status=run.status, exit_code=run.exit_code, reason=run.reason,
        created_at_ms=run.created_at_ms, finished_at_ms=run.finished_at_ms, deadline_at_ms=run.deadline_at_ms,
        cancel_reason=run.cancel_reason,
        attempts=tuple(AttemptView(attempt_id=a.id, attempt_no=a.attempt_no, status=a.status,
                                   exit_code=a.exit_code, reason=a.reason, executor=a.executor,
                                   created_at_ms=a.created_at_ms, started_at_ms=a.started_at_ms,
                                   finished_at_ms=a.finished_at_ms, log_artifact_id=a.log_artifact_id)
                       for a in attempts))


def _log(row: tuple[Any, ...]) -> LogFacts:
    lid, run_id, attempt_id, max_bytes, size, truncated, created, deleted = row
    return LogFacts(lid, run_id, attempt_id, max_bytes, size, bool(truncated), created, deleted)


class SqliteJournal:
    """The run store of the edge and standalone profiles (registered as ``edge-sqlite``)."""

    name = "edge-sqlite"

    def __init__(self, url: str, *, busy_timeout_ms: int = 5000, create: bool = True,
                 refuse_fresh: bool = False) -> None:
        """Open the run database at ``url``; with ``create=False`` it must exist at the current schema
        (nothing is created or migrated: reads on a mistyped data dir leave no trace). With
        ``refuse_fresh`` (the data dir was used before) a missing or empty database is an error, not a
        new empty history."""
        from ql_core.db.migrate import SCHEMA_HEAD

        self.path = sqlite_path(url)
        if refuse_fresh and (not self.path.exists() or self.path.stat().st_size == 0):
            from ql_core.errors import DatabaseError

            state = "is empty" if self.path.exists() else "is missing"
            raise DatabaseError(f"the run database {self.path} {state}, but this data dir was used before (it has "
                                f"a node_id): the run history would be lost. Restore ql.db from a backup, or move "
                                f"the data dir aside to start afresh")
        self._db = SqliteConnections(self.path, busy_timeout_ms=busy_timeout_ms, create=create)
        self._noted: set[str] = set()
        self._noted_lock = threading.Lock()
        try:
            self._db.ensure_schema(SCHEMA_HEAD)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def from_context(cls, context: RuntimeContext) -> SqliteJournal:
        settings = context.plugin_config(cls.name)
        if settings:
            from ql_core.errors import ConfigError

            raise ConfigError(f"[plugin.{cls.name}] takes no settings (got {', '.join(sorted(settings))}); "
                              f"use database_url and [limits] busy_timeout_ms instead")
        return cls(context.config.database_url, busy_timeout_ms=context.config.profile.busy_timeout_ms,
                   create=not context.existing_only, refuse_fresh=context.data_dir_in_use)

    def close(self) -> None:
        self._db.close()

    def trace(self, callback: Callable[[int, str], None] | None) -> None:
        """Diagnostics: ``callback(connection_id, sql)`` for every statement this store runs (no
        parameters, so no values); None stops. Tests count commits with it."""
        self._db.trace(callback)

    def noted(self) -> frozenset[str]:
        """Attempts noted as consumed whose rows are not deleted yet (diagnostics and tests)."""
        with self._noted_lock:
            return frozenset(self._noted)

    # -- create ---------------------------------------------------------------------------
    def create(self, new: NewRun) -> list[RunEventInfo]:
        return self._create(new, None)

    def create_running(self, new: NewRun, *, handle: str) -> list[RunEventInfo]:
        return self._create(new, handle)

    def _create(self, new: NewRun, handle: str | None) -> list[RunEventInfo]:
        facts = create_facts(new, handle)
        with self._db.write() as c:
            self._flush_noted(c)
            now = new.created_at_ms
            c.execute(sql.INSERT_RUN, (new.run_id, new.name, facts.run_status, len(facts.events), new.attempt_id,
                                       now, now, new.deadline_at_ms))
            c.execute(sql.INSERT_ATTEMPT, (new.attempt_id, new.run_id, new.executor, new.runtime_owner,
                                           facts.attempt_status, new.log_artifact_id, new.callback_token_hash,
                                           new.deadline_at_ms, now, facts.started_at_ms, facts.handle,
                                           new.host_handle))
            c.execute(sql.INSERT_LOG, (new.log_artifact_id, new.run_id, new.attempt_id, new.log_relative_path,
                                       new.log_max_bytes, now))
            for e in facts.events:
                c.execute(sql.INSERT_EVENT, (e.run_id, e.seq, e.type, e.attempt_id, e.status, None, None, now))
            c.execute(sql.INSERT_JOURNAL, (new.attempt_id, new.run_id, new.receipt_ref, now, now))
            crashpoint("create.before_commit")
        return facts.events

    def note_consumed(self, attempt_id: str) -> None:
        with self._noted_lock:
            if len(self._noted) < MAX_NOTED:
                self._noted.add(attempt_id)

    def _flush_noted(self, c: sqlite3.Connection) -> None:
        """Inside a write this store makes anyway: drop noted (consumed) ``pending`` rows."""
        with self._noted_lock:
            if not self._noted:
                return
            batch = sorted(self._noted)[:FLUSH_BATCH]
            self._noted.difference_update(batch)
        c.executemany(sql.DELETE_JOURNAL_PENDING, [(a,) for a in batch])

    # -- decided changes ------------------------------------------------------------------
    def transition(self, attempt_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        with self._db.write() as c:
            row = c.execute(sql.SELECT_ATTEMPT, (attempt_id,)).fetchone()
            attempt = AttemptRecord(*row) if row else None
            run = self._run_in(c, attempt.run_id) if attempt else None
            return self._decide_and_apply(c, run, attempt, decide)

    def transition_many(self, items: list[tuple[str, Decide[T]]]) -> list[tuple[T, list[RunEventInfo]]]:
        with self._db.write() as c:
            out = []
            for attempt_id, decide in items:
                row = c.execute(sql.SELECT_ATTEMPT, (attempt_id,)).fetchone()
                attempt = AttemptRecord(*row) if row else None
                run = self._run_in(c, attempt.run_id) if attempt else None
                out.append(self._decide_and_apply(c, run, attempt, decide))
            return out

    def run_transition(self, run_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        with self._db.write() as c:
            run = self._run_in(c, run_id)
            attempt = None
            if run is not None and run.current_attempt_id is not None:
                row = c.execute(sql.SELECT_ATTEMPT, (run.current_attempt_id,)).fetchone()
                attempt = AttemptRecord(*row) if row else None
            return self._decide_and_apply(c, run, attempt, decide)

    @staticmethod
    def _run_in(c: sqlite3.Connection, run_id: str) -> RunRecord | None:
        row = c.execute(sql.SELECT_RUN, (run_id,)).fetchone()
        return RunRecord(*row) if row else None

    def _decide_and_apply(self, c: sqlite3.Connection, run: RunRecord | None, attempt: AttemptRecord | None,
                          decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        signalled = has_dispatch = False
        if run is not None:
            d = c.execute(sql.SELECT_DISPATCH_SIGNAL, (run.id,)).fetchone()
            if d is not None:
                has_dispatch = True
                signalled = attempt is not None and d[0] == attempt.id and d[1] is not None
        snap = Snapshot(run=run, attempt=attempt, signalled=signalled, has_dispatch=has_dispatch, now_ms=_now_ms())
        result, change = decide(snap)
        if change is None:
            return result, []
        return result, self._apply(c, snap, change)

    def _apply(self, c: sqlite3.Connection, snap: Snapshot, t: Transition) -> list[RunEventInfo]:
        now = snap.now_ms
        if t.attempt:
            a = snap.attempt
            if a is None or not set(t.attempt) <= ATTEMPT_COLUMNS:
                raise StoreError(f"invalid attempt change {sorted(t.attempt)}")
            values = dict(t.attempt, version=a.version + 1)
            cur = c.execute(_update_sql("ql_run_attempt", frozenset(values), "id = ? AND version = ?"),
                            [values[k] for k in sorted(values)] + [a.id, a.version])
            if cur.rowcount != 1:
                raise ConflictError(f"attempt {a.id} changed concurrently")
        infos: list[RunEventInfo] = []
        if t.run or t.events:
            r = snap.run
            if r is None or not set(t.run) <= RUN_COLUMNS:
                raise StoreError(f"invalid run change {sorted(t.run)}")
            values = dict(t.run, version=r.version + 1, event_seq=r.event_seq + len(t.events), updated_at_ms=now)
            cur = c.execute(_update_sql("ql_run", frozenset(values), "id = ? AND version = ? AND event_seq = ?"),
                            [values[k] for k in sorted(values)] + [r.id, r.version, r.event_seq])
            if cur.rowcount != 1:
                raise ConflictError(f"run {r.id} changed concurrently")
            rows = []
            for offset, e in enumerate(t.events, start=1):
                seq = r.event_seq + offset
                rows.append((r.id, seq, e.type, e.attempt_id, e.status, e.exit_code, e.reason, now))
                infos.append(RunEventInfo(run_id=r.id, seq=seq, type=e.type, attempt_id=e.attempt_id,
                                          status=e.status, exit_code=e.exit_code, reason=e.reason))
            c.executemany(sql.INSERT_EVENT, rows)
        if t.terminal and snap.attempt is not None:
            c.execute(sql.MARK_TERMINAL, (now, snap.attempt.id))
        if t.dispatch is not None and snap.run is not None:
            d = t.dispatch
            c.execute(sql.INSERT_DISPATCH, (snap.run.id, d.attempt_id, d.reason, d.due_at_ms, now, now))
        if t.crash_point:
            crashpoint(t.crash_point)
        return infos

    # -- reads --------------------------------------------------------------------------------
    def run(self, run_id: str) -> RunRecord | None:
        row = self._db.connection().execute(sql.SELECT_RUN, (run_id,)).fetchone()
        return RunRecord(*row) if row else None

    def attempt(self, attempt_id: str) -> AttemptRecord | None:
        row = self._db.connection().execute(sql.SELECT_ATTEMPT, (attempt_id,)).fetchone()
        return AttemptRecord(*row) if row else None

    def view(self, run_id: str) -> RunView | None:
        with self._db.read() as c:
            row = c.execute(sql.SELECT_RUN, (run_id,)).fetchone()
            if row is None:
                return None
            attempts = [AttemptRecord(*a) for a in c.execute(sql.SELECT_ATTEMPTS_OF_RUN, (run_id,))]
        return _view(RunRecord(*row), attempts)

    def list_views(self, *, status: str | None, limit: int) -> list[RunView]:
        with self._db.read() as c:
            if status:
                runs = [RunRecord(*r) for r in c.execute(sql.SELECT_RUNS_NEWEST_BY_STATUS, (status, limit))]
            else:
                runs = [RunRecord(*r) for r in c.execute(sql.SELECT_RUNS_NEWEST, (limit,))]
            by_run: dict[str, list[AttemptRecord]] = {r.id: [] for r in runs}
            if runs:
                marks = ",".join("?" * len(runs))
                query = (f"SELECT {sql.ATTEMPT_COLUMNS} FROM ql_run_attempt WHERE run_id IN ({marks}) "
                         f"ORDER BY run_id, attempt_no")
                for a in c.execute(query, list(by_run)):
                    by_run[a[1]].append(AttemptRecord(*a))
        return [_view(r, by_run[r.id]) for r in runs]

    def events(self, run_id: str) -> list[EventRecord] | None:
        with self._db.read() as c:
            if c.execute(sql.SELECT_RUN, (run_id,)).fetchone() is None:
                return None
            return [EventRecord(*e) for e in c.execute(sql.SELECT_EVENTS, (run_id,))]

    # -- recovery paging ------------------------------------------------------------------------
    def page_active_attempts(self, owner: str, after: str, limit: int) -> list[AttemptRecord]:
        rows = self._db.connection().execute(sql.PAGE_ACTIVE_ATTEMPTS, (owner, after, limit)).fetchall()
        return [AttemptRecord(*r) for r in rows]

    def due_deadlines(self, owner: str, now_ms: int, limit: int) -> list[str]:
        return [r[0] for r in self._db.connection().execute(sql.DUE_DEADLINES, (now_ms, owner, limit))]

    def page_journal(self, after: str, limit: int) -> list[JournalEntry]:
        with self._db.read() as c:
            rows = c.execute(sql.PAGE_JOURNAL, (after, limit)).fetchall()
            out = []
            for row in rows:
                found = c.execute(sql.ATTEMPT_STATUS_OWNER, (row[0],)).fetchone()
                out.append(JournalEntry(*row, *(found or (None, None))))
        return out

    # -- the receipt journal --------------------------------------------------------------------
    def journal_entry(self, attempt_id: str) -> JournalEntry | None:
        with self._db.read() as c:
            row = c.execute(sql.SELECT_JOURNAL, (attempt_id,)).fetchone()
            if row is None:
                return None
            found = c.execute(sql.ATTEMPT_STATUS_OWNER, (attempt_id,)).fetchone()
        return JournalEntry(*row, *(found or (None, None)))

    def register_journal(self, entries: Mapping[str, tuple[str, str]], now_ms: int) -> int:
        if not entries:
            return 0
        added = 0
        with self._db.write() as c:
            for attempt_id, (run_id, ref) in entries.items():
                added += c.execute(sql.INSERT_JOURNAL, (attempt_id, run_id, ref, now_ms, now_ms)).rowcount
        return added

    def mark_quarantined(self, attempt_id: str, reason: str, now_ms: int) -> bool:
        # A row already quarantined keeps its first decision and its clock (see docs/recovery.md).
        with self._db.write() as c:
            if c.execute(sql.JOURNAL_EXISTS, (attempt_id,)).fetchone() is None:
                return False
            c.execute(sql.MARK_QUARANTINED, (reason[:40], now_ms, attempt_id))
        return True

    def mark_terminal_seen(self, attempt_ids: list[str], now_ms: int) -> None:
        if attempt_ids:
            with self._db.write() as c:
                c.executemany(sql.MARK_TERMINAL, [(now_ms, a) for a in attempt_ids])

    def resolve(self, attempt_ids: list[str]) -> int:
        if not attempt_ids:
            return 0
        with self._noted_lock:
            self._noted.difference_update(attempt_ids)
        deleted = 0
        with self._db.write() as c:
            self._flush_noted(c)
            for attempt_id in attempt_ids:
                deleted += c.execute(sql.DELETE_JOURNAL, (attempt_id,)).rowcount
        return deleted

    def requeue_quarantined(self, attempt_id: str, seen_updated_at_ms: int, now_ms: int) -> bool:
        with self._db.write() as c:
            return c.execute(sql.REQUEUE_QUARANTINED, (now_ms, attempt_id, seen_updated_at_ms)).rowcount == 1

    # -- cancellation dispatch --------------------------------------------------------------------
    def dispatch(self, run_id: str) -> DispatchRecord | None:
        row = self._db.connection().execute(sql.SELECT_DISPATCH_OF_RUN, (run_id,)).fetchone()
        return DispatchRecord(*row) if row else None

    def due_dispatches(self, owner: str, limit: int) -> list[str]:
        return [r[0] for r in self._db.connection().execute(sql.DUE_DISPATCHES, (_now_ms(), owner, limit))]

    def claim_dispatch(self, run_id: str, owner: str, lease_ms: int) -> DispatchClaim | None:
        with self._db.write() as c:
            row = c.execute(sql.SELECT_DISPATCH_OF_RUN, (run_id,)).fetchone()
            if row is None:
                return None
            record = DispatchRecord(*row)
            now = _now_ms()
            if record.state not in ("pending", "term_sent") or record.next_attempt_at_ms > now:
                return None
            cur = c.execute(sql.CLAIM_DISPATCH, (owner, now + lease_ms, now, run_id, record.version, now))
            if cur.rowcount != 1:
                return None
        held = record._replace(version=record.version + 1, lease_owner=owner, lease_expires_at_ms=now + lease_ms,
                               updated_at_ms=now)
        return DispatchClaim(record=held, owner=owner, now_ms=now)

    def finish_dispatch(self, claim: DispatchClaim, values: Mapping[str, object]) -> bool:
        if not set(values) <= DISPATCH_COLUMNS:
            raise StoreError(f"invalid dispatch change {sorted(values)}")
        full = dict(values, version=claim.record.version + 1, lease_owner=None, lease_expires_at_ms=None,
                    updated_at_ms=claim.now_ms)
        query = _update_sql("ql_cancel_dispatch", frozenset(full), "run_id = ? AND version = ? AND lease_owner = ?")
        with self._db.write() as c:
            cur = c.execute(query, [full[k] for k in sorted(full)]
                            + [claim.record.run_id, claim.record.version, claim.owner])
            return cur.rowcount == 1

    # -- log artifacts ---------------------------------------------------------------------------
    def log_facts(self, log_id: str) -> LogFacts | None:
        row = self._db.connection().execute(sql.SELECT_LOG, (log_id,)).fetchone()
        return _log(row) if row else None

    def mark_log_truncated(self, log_id: str, event: EventSpec) -> list[RunEventInfo]:
        def decide(snap: Snapshot) -> tuple[None, Transition | None]:
            return None, (Transition(events=(event,)) if snap.run is not None else None)

        with self._db.write() as c:
            if c.execute(sql.MARK_LOG_TRUNCATED, (log_id,)).rowcount != 1:
                return []
            row = c.execute(sql.SELECT_LOG, (log_id,)).fetchone()
            run = self._run_in(c, row[1]) if row else None
            return self._decide_and_apply(c, run, None, decide)[1]

    def record_log_sizes(self, sizes: Mapping[str, int]) -> None:
        # A size is re-derivable from the file at any time: if this commit is lost (power cut before
        # the WAL reaches the disk), the log is simply back in the sizing queue (ix_ql_log_unsized)
        # and the next round sizes it again. So this one commit skips the WAL fsync (synchronous=NORMAL
        # keeps the database consistent, only the last commits may roll back), and the next durable
        # commit of this connection carries it to disk. It keeps a task's life at three fsyncs.
        if not sizes:
            return
        conn = self._db.connection()
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._db.write() as c:
                c.executemany(sql.SET_LOG_SIZE, [(size, log_id) for log_id, size in sizes.items()])
        finally:
            conn.execute("PRAGMA synchronous=FULL")

    def page_live_logs(self, owner: str, after: str, limit: int) -> list[LogFacts]:
        return [_log(r) for r in self._db.connection().execute(sql.PAGE_LIVE_LOGS, (after, owner, limit))]

    def ended_logs(self, owner: str, *, unsized: bool = False, created_before_ms: int | None = None,
                   sized: bool = False, limit: int) -> list[LogFacts]:
        c = self._db.connection()
        if unsized:
            rows = c.execute(sql.ENDED_LOGS_UNSIZED, (owner, limit))
        elif created_before_ms is not None:
            rows = c.execute(sql.ENDED_LOGS_OLDER, (owner, created_before_ms, limit))
        elif sized:
            rows = c.execute(sql.ENDED_LOGS_SIZED, (owner, limit))
        else:
            raise ValueError("ended_logs needs one of unsized, created_before_ms, sized")
        return [_log(r) for r in rows]

    def ended_log_bytes(self, owner: str) -> int:
        return int(self._db.connection().execute(sql.ENDED_LOG_BYTES, (owner,)).fetchone()[0])

    def mark_log_deleted(self, log_id: str, now_ms: int, size_bytes: int) -> None:
        with self._db.write() as c:
            c.execute(sql.MARK_LOG_DELETED, (now_ms, size_bytes, log_id))

    # -- history retention (ql_core.ports.journal.HistoryRetention) -------------------------------
    def history_candidates(self, owner: str, *, finished_before_ms: int, keep_newest: int,
                           limit: int) -> dict[str, list[str]]:
        # Index-driven only (docs/recovery.md "Cost of a round"): ended runs past the age window in
        # finish order; the run count from ql_tally, and — only when it exceeds keep_newest — the
        # oldest runs in creation order, at most as many as are in excess. Non-terminal runs among
        # those are kept (never purged), so up to OLDEST_SLACK pages of them are stepped over.
        out: dict[str, list[str]] = {}
        with self._db.read() as c:
            ids = [r[0] for r in c.execute(sql.OLD_FINISHED_RUNS, (finished_before_ms, limit))]
            excess = int(c.execute(sql.RUN_COUNT).fetchone()[0]) - keep_newest
            if excess > 0 and len(ids) < limit:
                seen = set(ids)
                for run_id, status in c.execute(sql.OLDEST_RUNS, (min(excess, OLDEST_SLACK * limit),)):
                    if len(ids) >= limit:
                        break
                    if status in RUN_TERMINAL and run_id not in seen:
                        ids.append(run_id)
            for run_id in ids[:limit]:
                attempts = c.execute(sql.RUN_ATTEMPTS_OWNERS, (run_id,)).fetchall()
                if any(o != owner for _a, o in attempts):
                    continue  # another node's attempt: its files are not ours to delete
                if any(c.execute(sql.JOURNAL_EXISTS, (a,)).fetchone() for a, _o in attempts):
                    continue  # a receipt may still exist: the journal row goes first
                out[run_id] = [r[0] for r in c.execute(sql.LIVE_LOGS_OF_RUN, (run_id,))]
        return out

    def purge_runs(self, run_ids: list[str]) -> int:
        # One transaction for the whole page; each statement runs over the page under its index.
        if not run_ids:
            return 0
        params = [(run_id,) for run_id in run_ids]
        with self._db.write() as c:
            for statement in (sql.PURGE_EVENTS, sql.PURGE_DISPATCH, sql.PURGE_LOGS, sql.PURGE_ATTEMPTS):
                c.executemany(statement, params)
            return c.executemany(sql.PURGE_RUN, params).rowcount
