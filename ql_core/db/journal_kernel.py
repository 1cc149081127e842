"""The SQL journal kernel: the run store's logic once, for every SQL dialect that keeps ql's schema.

A journal backend on SQL is the same program whatever the database: the create commit, the
decided transition (snapshot → core's ``decide`` → the change applied with compare-and-set on the
rows' versions, events numbered from ``event_seq``), the receipt-journal rows, the dispatch lease,
the log ledger. :class:`SqlJournalKernel` is that program, written once over prebuilt statements
(no ORM on any path; the model is huey's ``BaseSqlStorage``). A dialect subclass brings what
differs:

- its **connections and transactions** — :meth:`~SqlJournalKernel._write`,
  :meth:`~SqlJournalKernel._read`, :meth:`~SqlJournalKernel._rows`,
  :meth:`~SqlJournalKernel._execute`, :meth:`~SqlJournalKernel._execute_many` (required);
- its **statements**, :attr:`~SqlJournalKernel.sql`: a namespace holding every name of
  :data:`KERNEL_STATEMENTS` (:func:`ql_core.db.journal_sql.shared_statements` spells most of them;
  the dialect writes the rest) in its :attr:`~SqlJournalKernel.placeholder` style;
- optionally, **better ways** to do a step where the database has them — row locks in a fixed
  order, the database's own clock, array parameters: :meth:`~SqlJournalKernel._lock_run`,
  :meth:`~SqlJournalKernel._lock_attempt`, :meth:`~SqlJournalKernel._rows_of_attempt`,
  :meth:`~SqlJournalKernel._transition_rows`,
  :meth:`~SqlJournalKernel._lock_dispatch`, :meth:`~SqlJournalKernel._clock`,
  :meth:`~SqlJournalKernel._attempts_of_runs`, :meth:`~SqlJournalKernel._delete_pending`, or a
  whole method. The defaults are portable SQL with this process's clock.

Each public method is one transaction (or one statement), with the statements of today's stores in
the same order, so a dialect's commit count — and on SQLite its fsyncs — is exactly what it was
before the kernel. The kernel implements :class:`~ql_core.ports.journal.JournalBackend` (with
:class:`~ql_core.ports.journal.RunningCreate`) except ``name`` and ``close``, which the dialect owns.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, ContextManager, Iterable, Mapping, Sequence, TypeVar

from ql_core.clock import now_ms
from ql_core.crashpoints import crashpoint
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
from ql_core.records import (AttemptRecord, DispatchRecord, EventRecord, JournalEntry, LogFacts, NewRun, RunRecord,
                             RunView, log_facts_of, run_view)

from .journal_sql import ATTEMPT_COLUMNS as ATTEMPT_SELECT

__all__ = ["SqlJournalKernel", "KERNEL_STATEMENTS", "MAX_NOTED", "FLUSH_BATCH", "run_view", "log_facts_of"]

T = TypeVar("T")
#: :meth:`SqlJournalKernel._transition_rows` did not read the run's cancel dispatch (the default).
UNREAD = object()
#: Consumed attempts remembered in memory at most (beyond that, retention purges their rows).
MAX_NOTED = 4096
#: Columns of a run's record (a listed row may have more after them).
_RUN_FIELDS = len(RunRecord._fields)
#: Noted rows deleted per piggybacked flush (keeps the host's create transaction small).
FLUSH_BATCH = 256

#: The statements the kernel runs, by name: a dialect's :attr:`SqlJournalKernel.sql` has them all.
KERNEL_STATEMENTS = (
    "INSERT_RUN", "RUN_CURRENT_ATTEMPT", "INSERT_ATTEMPT", "INSERT_LOG", "INSERT_EVENT", "INSERT_JOURNAL",
    "SELECT_RUN", "SELECT_ATTEMPT", "SELECT_ATTEMPTS_OF_RUN", "SELECT_EVENTS", "SELECT_RUN_IDS_IN_RANGE", "SELECT_RUNS_NEWEST",
    "SELECT_RUNS_NEWEST_BY_STATUS", "SELECT_DISPATCH_OF_RUN", "SELECT_DISPATCH_SIGNAL",
    "PAGE_ACTIVE_ATTEMPTS", "DUE_DEADLINES", "PAGE_JOURNAL", "SELECT_JOURNAL", "ATTEMPT_STATUS_OWNER",
    "MARK_TERMINAL", "MARK_QUARANTINED", "JOURNAL_EXISTS", "DELETE_JOURNAL", "DELETE_JOURNAL_PENDING",
    "REQUEUE_QUARANTINED", "DUE_DISPATCHES", "INSERT_DISPATCH", "CLAIM_DISPATCH",
    "SELECT_LOG", "MARK_LOG_TRUNCATED", "SET_LOG_SIZE", "MARK_LOG_DELETED", "PAGE_LIVE_LOGS",
    "ENDED_LOGS_UNSIZED", "ENDED_LOGS_OLDER", "ENDED_LOGS_SIZED", "ENDED_LOG_BYTES",
)


@functools.lru_cache(maxsize=128)
def _update_sql(table: str, columns: tuple[str, ...], where: tuple[str, ...], placeholder: str) -> str:
    """``UPDATE table SET c1 = ?, ... WHERE w1 = ? AND ...`` (built once per column set, then cached)."""
    sets = ", ".join(f"{c} = {placeholder}" for c in columns)
    return f"UPDATE {table} SET {sets} WHERE " + " AND ".join(f"{w} = {placeholder}" for w in where)


class SqlJournalKernel:
    """The run store's logic over prebuilt SQL; subclass it per dialect (see the module docstring)."""

    #: The dialect's statements (a module or namespace with every name of :data:`KERNEL_STATEMENTS`).
    sql: Any
    #: The dialect's parameter placeholder, for the few statements the kernel builds itself.
    placeholder: str = "?"
    #: True when the dialect's journal reads derive a terminal attempt's ``terminal_seen_at_ms`` (the
    #: retention clock) from its run's last update, which the terminal commit writes anyway: the
    #: terminal transition then writes no journal row (SQLite: one page fewer in that commit).
    derives_terminal_seen: bool = False

    def __init__(self) -> None:
        missing = [name for name in KERNEL_STATEMENTS if not isinstance(getattr(self.sql, name, None), str)]
        if missing:
            raise TypeError(f"{type(self).__name__}.sql lacks {', '.join(missing)}")
        self._noted: set[str] = set()
        self._noted_lock = threading.Lock()

    # -- the dialect's connections (required) ----------------------------------------------
    def _write(self, operation: str) -> ContextManager[Any]:
        """One write transaction on this thread's connection: commit on success, roll back on error
        (mapping the driver's errors to the seam's). ``operation`` names it in error messages."""
        raise NotImplementedError

    def _read(self, operation: str) -> ContextManager[Any]:
        """One read-only snapshot: several statements see the same data; never writes."""
        raise NotImplementedError

    def _rows(self, operation: str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement in its own transaction; its rows."""
        raise NotImplementedError

    def _execute(self, c: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        """One statement inside the transaction of ``c``; a cursor (``rowcount``, ``fetchone``, iteration)."""
        raise NotImplementedError

    def _execute_many(self, c: Any, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement for each of ``rows`` (never empty) inside the transaction of ``c``."""
        raise NotImplementedError

    # -- steps a dialect may do better (the defaults: portable SQL, this process's clock) ---------
    def _clock(self, c: Any) -> int:
        """The store's "now" in ms for a snapshot or a lease (a shared database would use its own)."""
        return now_ms()

    def _lock_run(self, c: Any, run_id: str) -> tuple[RunRecord | None, int | None]:
        """The run, held against other writers until the transaction ends, and the store's clock if
        reading it came with the row (None: :meth:`_clock` is asked when needed)."""
        row = self._execute(c, self.sql.SELECT_RUN, (run_id,)).fetchone()
        return (RunRecord(*row) if row else None), None

    def _lock_attempt(self, c: Any, attempt_id: str) -> AttemptRecord | None:
        row = self._execute(c, self.sql.SELECT_ATTEMPT, (attempt_id,)).fetchone()
        return AttemptRecord(*row) if row else None

    def _rows_of_attempt(self, c: Any, attempt_id: str) -> tuple[RunRecord | None, AttemptRecord | None, int | None]:
        """The attempt and its run for a transition keyed by attempt (and the clock, as :meth:`_lock_run`)."""
        attempt = self._lock_attempt(c, attempt_id)
        run, now = self._lock_run(c, attempt.run_id) if attempt else (None, None)
        return run, attempt, now

    def _lock_dispatch(self, c: Any, run_id: str) -> tuple[DispatchRecord, int] | None:
        """The run's dispatch record, held for a claim, with the store's clock; None without one."""
        row = self._execute(c, self.sql.SELECT_DISPATCH_OF_RUN, (run_id,)).fetchone()
        return None if row is None else (DispatchRecord(*row), self._clock(c))

    def _attempts_of_runs(self, c: Any, run_ids: list[str]) -> Iterable[Sequence[Any]]:
        """Attempt rows of these runs, by run then attempt number (one statement)."""
        marks = ", ".join(self.placeholder for _ in run_ids)
        query = f"SELECT {ATTEMPT_SELECT} FROM ql_run_attempt WHERE run_id IN ({marks}) ORDER BY run_id, attempt_no"
        return self._execute(c, query, run_ids)

    def _delete_pending(self, c: Any, attempt_ids: list[str]) -> None:
        """Delete these attempts' journal rows that are still ``pending`` (consumed receipts)."""
        self._execute_many(c, self.sql.DELETE_JOURNAL_PENDING, [(a,) for a in attempt_ids])

    # -- diagnostics -------------------------------------------------------------------------------
    def noted(self) -> frozenset[str]:
        """Attempts noted as consumed whose rows are not deleted yet (diagnostics and tests)."""
        with self._noted_lock:
            return frozenset(self._noted)

    # -- create -------------------------------------------------------------------------------------
    def create(self, new: NewRun) -> list[RunEventInfo]:
        return self._create(new, None)

    def create_running(self, new: NewRun, *, handle: str) -> list[RunEventInfo]:
        return self._create(new, handle)

    def _create(self, new: NewRun, handle: str | None) -> list[RunEventInfo]:
        facts = create_facts(new, handle)
        now = new.created_at_ms
        sql = self.sql
        with self._write("create") as c:
            self._flush_noted(c)
            run_row = (new.run_id, new.name, facts.run_status, len(facts.events), new.attempt_id, now, now,
                       new.deadline_at_ms)
            # A dialect that keeps the host handle in the run's row (SQLite, revision 0019) writes it
            # with the row: one statement, where INSERT_ATTEMPT_HOST below is a second.
            insert_run_host = getattr(sql, "INSERT_RUN_HOST", None) if new.host_handle is not None else None
            inserted = (self._execute(c, insert_run_host, (*run_row, new.host_handle)) if insert_run_host
                        else self._execute(c, sql.INSERT_RUN, run_row))
            if inserted.rowcount != 1:
                # The dialect skipped a conflicting run (it does not raise): a replay of a create whose
                # COMMIT answer was lost is the same run with the same attempt; anything else conflicts.
                row = self._execute(c, sql.RUN_CURRENT_ATTEMPT, (new.run_id,)).fetchone()
                if row is not None and row[0] == new.attempt_id:
                    return facts.events
                raise ConflictError(f"run {new.run_id} exists already")
            self._execute(c, sql.INSERT_ATTEMPT, (new.attempt_id, new.run_id, new.executor, new.runtime_owner,
                                                  facts.attempt_status, new.log_artifact_id, new.callback_token_hash,
                                                  new.deadline_at_ms, now, facts.started_at_ms, facts.handle,
                                                  new.host_handle))
            # A dialect may keep the host handle beside the attempt (SQLite, revision 0014: the row
            # stays under a page's cell size). Written here, not by an overridable ``_create_also``, so
            # no subclass can drop it: never_started's proof reads it after a crash.
            if (new.host_handle is not None and insert_run_host is None
                    and (insert_host := getattr(sql, "INSERT_ATTEMPT_HOST", None))):
                self._execute(c, insert_host, (new.host_handle, new.attempt_id))
            self._execute(c, sql.INSERT_LOG, (new.log_artifact_id, new.run_id, new.attempt_id, new.log_relative_path,
                                              new.log_max_bytes, now))
            for e in facts.events:
                self._execute(c, sql.INSERT_EVENT, (e.run_id, e.seq, e.type, e.attempt_id, e.status, None, None, now))
            self._execute(c, sql.INSERT_JOURNAL, (new.attempt_id, new.run_id, new.receipt_ref, now, now))
            self._create_also(c, new)
            crashpoint("create.before_commit")
        return facts.events

    def note_consumed(self, attempt_id: str) -> None:
        with self._noted_lock:
            if len(self._noted) < MAX_NOTED:
                self._noted.add(attempt_id)

    def _flush_noted(self, c: Any) -> None:
        """Inside a write this store makes anyway: drop noted (consumed) ``pending`` rows."""
        with self._noted_lock:
            if not self._noted:
                return
            batch = sorted(self._noted)[:FLUSH_BATCH]
            self._noted.difference_update(batch)
        self._delete_pending(c, batch)

    # -- decided changes -------------------------------------------------------------------------
    def transition(self, attempt_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        with self._write("transition") as c:
            return self._decide_and_apply(c, *self._transition_rows(c, attempt_id), decide=decide)

    def _transition_rows(self, c: Any, attempt_id: str) -> tuple[RunRecord | None, AttemptRecord | None, int | None,
                                                                   Sequence[Any] | None | object]:
        """A transition's rows, keyed by attempt: (run, attempt, the store's clock or None, the run's
        cancel dispatch as ``(attempt_id, term_sent_at_ms)``, None without one, or :data:`UNREAD`:
        :meth:`_decide_and_apply` reads it). A dialect may read them all in one statement."""
        run, attempt, now = self._rows_of_attempt(c, attempt_id)
        return run, attempt, now, UNREAD

    def run_transition(self, run_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        with self._write("run_transition") as c:
            run, now = self._lock_run(c, run_id)
            attempt = None
            if run is not None and run.current_attempt_id is not None:
                attempt = self._lock_attempt(c, run.current_attempt_id)
            return self._decide_and_apply(c, run, attempt, now, decide=decide)

    def _decide_and_apply(self, c: Any, run: RunRecord | None, attempt: AttemptRecord | None, now: int | None,
                          dispatch: Sequence[Any] | None | object = UNREAD, *,
                          decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        signalled = has_dispatch = False
        if run is not None:
            d = (self._execute(c, self.sql.SELECT_DISPATCH_SIGNAL, (run.id,)).fetchone() if dispatch is UNREAD
                 else dispatch)
            if d is not None:
                has_dispatch = True
                signalled = attempt is not None and d[0] == attempt.id and d[1] is not None
        if now is None:
            now = self._clock(c)
        snap = Snapshot(run=run, attempt=attempt, signalled=signalled, has_dispatch=has_dispatch, now_ms=now)
        result, change = decide(snap)
        if change is None:
            return result, []
        return result, self._apply(c, snap, change)

    def _apply(self, c: Any, snap: Snapshot, t: Transition) -> list[RunEventInfo]:
        now = snap.now_ms
        also = self._terminal_attempt_columns(snap.attempt) if t.terminal and snap.attempt is not None else None
        if t.attempt:
            a = snap.attempt
            if a is None or not set(t.attempt) <= ATTEMPT_COLUMNS:
                raise StoreError(f"invalid attempt change {sorted(t.attempt)}")
            values = dict(t.attempt, version=a.version + 1)
            if also:
                values.update(also)  # the dialect's own columns, in the same statement
            self._compare_and_set(c, "ql_run_attempt", values, {"id": a.id, "version": a.version}, f"attempt {a.id}")
        elif also and snap.attempt is not None:
            columns = tuple(sorted(also))
            self._execute(c, _update_sql("ql_run_attempt", columns, ("id",), self.placeholder),
                          [also[k] for k in columns] + [snap.attempt.id])
        infos: list[RunEventInfo] = []
        if t.run or t.events:
            r = snap.run
            if r is None or not set(t.run) <= RUN_COLUMNS:
                raise StoreError(f"invalid run change {sorted(t.run)}")
            self._compare_and_set(c, "ql_run", dict(t.run, version=r.version + 1,
                                                    event_seq=r.event_seq + len(t.events), updated_at_ms=now),
                                  {"id": r.id, "version": r.version, "event_seq": r.event_seq}, f"run {r.id}")
            rows = []
            for offset, e in enumerate(t.events, start=1):
                seq = r.event_seq + offset
                rows.append((r.id, seq, e.type, e.attempt_id, e.status, e.exit_code, e.reason, now))
                infos.append(RunEventInfo(run_id=r.id, seq=seq, type=e.type, attempt_id=e.attempt_id,
                                          status=e.status, exit_code=e.exit_code, reason=e.reason))
            if rows:
                self._execute_many(c, self.sql.INSERT_EVENT, rows)
        if t.terminal and snap.attempt is not None and not self.derives_terminal_seen:
            self._execute(c, self.sql.MARK_TERMINAL, (now, snap.attempt.id))
        if t.dispatch is not None and snap.run is not None:
            d = t.dispatch
            self._execute(c, self.sql.INSERT_DISPATCH, (snap.run.id, d.attempt_id, d.reason, d.due_at_ms, now, now))
        if t.terminal and snap.attempt is not None:
            self._terminal_also(c, snap, t)
        if t.crash_point:
            crashpoint(t.crash_point)
        return infos

    # -- a subclass's own rows in the same commits (the defaults: none) ---------------------------
    def _create_also(self, c: Any, new: NewRun) -> None:
        """Inside the create transaction, after its rows: a subclass's own writes that must commit
        with the create or not at all (the cluster worker's lease step). Default: nothing."""

    def _terminal_attempt_columns(self, attempt: AttemptRecord) -> Mapping[str, object] | None:
        """A terminal transition's own columns of the dialect on the attempt's row (the edge store: an
        empty log's size), written by the kernel in the same UPDATE as the change's (or, for a change
        that leaves the attempt alone, one of their own). Default: none."""
        return None

    def _terminal_also(self, c: Any, snap: Snapshot, change: Transition) -> None:
        """Inside a terminal transition's transaction, after its rows (the attempt already reads
        terminal): a subclass's own writes that must commit with it or not at all (the cluster
        worker's outbox row). ``snap`` is what the decision saw (``snap.attempt`` is not None) and
        ``change`` what was applied: the attempt as this commit leaves it is
        ``snap.attempt._replace(**change.attempt)`` (its version aside), no read needed. Default:
        nothing."""

    def _compare_and_set(self, c: Any, table: str, values: Mapping[str, object], expected: Mapping[str, object],
                         what: str) -> None:
        """Set ``values`` on the one row that still holds ``expected``; another writer got there first
        otherwise (:class:`~ql_core.ports.journal.ConflictError`: core retries the transaction)."""
        columns = tuple(sorted(values))
        query = _update_sql(table, columns, tuple(expected), self.placeholder)
        if self._execute(c, query, [values[k] for k in columns] + list(expected.values())).rowcount != 1:
            raise ConflictError(f"{what} changed concurrently")

    # -- reads ---------------------------------------------------------------------------------------
    def run(self, run_id: str) -> RunRecord | None:
        rows = self._rows("run", self.sql.SELECT_RUN, (run_id,))
        return RunRecord(*rows[0]) if rows else None

    def attempt(self, attempt_id: str) -> AttemptRecord | None:
        rows = self._rows("attempt", self.sql.SELECT_ATTEMPT, (attempt_id,))
        return AttemptRecord(*rows[0]) if rows else None

    def view(self, run_id: str) -> RunView | None:
        with self._read("view") as c:
            row = self._execute(c, self.sql.SELECT_RUN, (run_id,)).fetchone()
            if row is None:
                return None
            attempts = [AttemptRecord(*a) for a in self._execute(c, self.sql.SELECT_ATTEMPTS_OF_RUN, (run_id,))]
        return run_view(RunRecord(*row), attempts)

    def run_ids_with_prefix(self, prefix: str, limit: int = 2) -> list[str]:
        """Run ids that start with ``prefix`` (lowercase hex digits and dashes), by id, at most ``limit``:
        one range of the primary key (``id >= prefix AND id < next``), never a scan."""
        if not prefix:
            return []
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._rows("run_ids", self.sql.SELECT_RUN_IDS_IN_RANGE, (prefix, upper, limit))
        return [r[0] for r in rows if r[0].startswith(prefix)]

    def list_views(self, *, status: str | None, limit: int) -> list[RunView]:
        with self._read("list") as c:
            if status:
                found = self._execute(c, self.sql.SELECT_RUNS_NEWEST_BY_STATUS, (status, limit))
            else:
                found = self._execute(c, self.sql.SELECT_RUNS_NEWEST, (limit,))
            # A dialect's row may carry its order's key after the record's columns (SQLite's
            # run_key, revision 0016): the record is the row's first fields.
            runs = [RunRecord(*r[:_RUN_FIELDS]) for r in found]
            by_run: dict[str, list[AttemptRecord]] = {r.id: [] for r in runs}
            if runs:
                for a in self._attempts_of_runs(c, list(by_run)):
                    by_run[a[1]].append(AttemptRecord(*a))
        return [run_view(r, by_run[r.id]) for r in runs]

    def events(self, run_id: str) -> list[EventRecord] | None:
        with self._read("events") as c:
            if self._execute(c, self.sql.SELECT_RUN, (run_id,)).fetchone() is None:
                return None
            return [EventRecord(*e) for e in self._execute(c, self.sql.SELECT_EVENTS, (run_id,))]

    # -- recovery paging -----------------------------------------------------------------------------
    def page_active_attempts(self, owner: str, after: str, limit: int) -> list[AttemptRecord]:
        return [AttemptRecord(*r) for r in self._rows("page_active_attempts", self.sql.PAGE_ACTIVE_ATTEMPTS,
                                                      (owner, after, limit))]

    def due_deadlines(self, owner: str, now_ms: int, limit: int) -> list[str]:
        return [r[0] for r in self._rows("due_deadlines", self.sql.DUE_DEADLINES, (now_ms, owner, limit))]

    # -- the receipt journal ---------------------------------------------------------------------------
    def page_journal(self, after: str, limit: int) -> list[JournalEntry]:
        with self._read("page_journal") as c:
            rows = self._execute(c, self.sql.PAGE_JOURNAL, (after, limit)).fetchall()
            return [self._with_attempt(c, row) for row in rows]

    def journal_entry(self, attempt_id: str) -> JournalEntry | None:
        with self._read("journal_entry") as c:
            row = self._execute(c, self.sql.SELECT_JOURNAL, (attempt_id,)).fetchone()
            return None if row is None else self._with_attempt(c, row)

    def _with_attempt(self, c: Any, row: Sequence[Any]) -> JournalEntry:
        """A journal row with its attempt's status and owner (None, None: the attempt is gone)."""
        found = self._execute(c, self.sql.ATTEMPT_STATUS_OWNER, (row[0],)).fetchone()
        return JournalEntry(*row, *(found or (None, None)))

    def register_journal(self, entries: Mapping[str, tuple[str, str]], now_ms: int) -> int:
        if not entries:
            return 0
        added = 0
        with self._write("register_journal") as c:
            for attempt_id, (run_id, ref) in entries.items():
                added += self._execute(c, self.sql.INSERT_JOURNAL, (attempt_id, run_id, ref, now_ms, now_ms)).rowcount
        return added

    def mark_quarantined(self, attempt_id: str, reason: str, now_ms: int) -> bool:
        # A row already quarantined keeps its first decision and its clock (see docs/recovery.md).
        with self._write("mark_quarantined") as c:
            if self._execute(c, self.sql.JOURNAL_EXISTS, (attempt_id,)).fetchone() is None:
                return False
            self._execute(c, self.sql.MARK_QUARANTINED, (reason[:40], now_ms, attempt_id))
        return True

    def mark_terminal_seen(self, attempt_ids: list[str], now_ms: int) -> None:
        if attempt_ids:
            with self._write("mark_terminal_seen") as c:
                self._execute_many(c, self.sql.MARK_TERMINAL, [(now_ms, a) for a in attempt_ids])

    def resolve(self, attempt_ids: list[str]) -> int:
        if not attempt_ids:
            return 0
        with self._noted_lock:
            self._noted.difference_update(attempt_ids)
        deleted = 0
        with self._write("resolve") as c:
            self._flush_noted(c)
            for attempt_id in attempt_ids:
                deleted += self._execute(c, self.sql.DELETE_JOURNAL, (attempt_id,)).rowcount
        return deleted

    def requeue_quarantined(self, attempt_id: str, seen_updated_at_ms: int, now_ms: int) -> bool:
        with self._write("requeue_quarantined") as c:
            return self._execute(c, self.sql.REQUEUE_QUARANTINED,
                                 (now_ms, attempt_id, seen_updated_at_ms)).rowcount == 1

    # -- cancellation dispatch -------------------------------------------------------------------------
    def dispatch(self, run_id: str) -> DispatchRecord | None:
        rows = self._rows("dispatch", self.sql.SELECT_DISPATCH_OF_RUN, (run_id,))
        return DispatchRecord(*rows[0]) if rows else None

    def due_dispatches(self, owner: str, limit: int) -> list[str]:
        """Due by this process's clock (``DUE_DISPATCHES`` takes it as its first parameter)."""
        return [r[0] for r in self._rows("due_dispatches", self.sql.DUE_DISPATCHES, (now_ms(), owner, limit))]

    def claim_dispatch(self, run_id: str, owner: str, lease_ms: int) -> DispatchClaim | None:
        with self._write("claim_dispatch") as c:
            locked = self._lock_dispatch(c, run_id)
            if locked is None:
                return None
            record, now = locked
            if record.state not in ("pending", "term_sent") or record.next_attempt_at_ms > now:
                return None
            cur = self._execute(c, self.sql.CLAIM_DISPATCH, (owner, now + lease_ms, now, run_id, record.version, now))
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
        columns = tuple(sorted(full))
        query = _update_sql("ql_cancel_dispatch", columns, ("run_id", "version", "lease_owner"), self.placeholder)
        with self._write("finish_dispatch") as c:
            cur = self._execute(c, query, [full[k] for k in columns]
                                + [claim.record.run_id, claim.record.version, claim.owner])
            return cur.rowcount == 1

    # -- the log ledger ----------------------------------------------------------------------------------
    def log_facts(self, log_id: str) -> LogFacts | None:
        rows = self._rows("log_facts", self.sql.SELECT_LOG, (log_id,))
        return log_facts_of(rows[0]) if rows else None

    def mark_log_truncated(self, log_id: str, event: EventSpec) -> list[RunEventInfo]:
        def decide(snap: Snapshot) -> tuple[None, Transition | None]:
            return None, (Transition(events=(event,)) if snap.run is not None else None)

        with self._write("mark_log_truncated") as c:
            # The run is locked before the log row changes: the lock order of every transition.
            found = self._execute(c, self.sql.SELECT_LOG, (log_id,)).fetchone()
            if found is None:
                return []
            run, now = self._lock_run(c, found[1])
            if self._execute(c, self.sql.MARK_LOG_TRUNCATED, (log_id,)).rowcount != 1:
                return []
            return self._decide_and_apply(c, run, None, now, decide=decide)[1]

    def record_log_sizes(self, sizes: Mapping[str, int]) -> None:
        if sizes:
            with self._write("record_log_sizes") as c:
                self._execute_many(c, self.sql.SET_LOG_SIZE, [(size, log_id) for log_id, size in sorted(sizes.items())])

    def page_live_logs(self, owner: str, after: str, limit: int) -> list[LogFacts]:
        return [log_facts_of(r) for r in self._rows("page_live_logs", self.sql.PAGE_LIVE_LOGS, (after, owner, limit))]

    def ended_logs(self, owner: str, *, unsized: bool = False, created_before_ms: int | None = None,
                   sized: bool = False, limit: int) -> list[LogFacts]:
        if unsized:
            rows = self._rows("ended_logs", self.sql.ENDED_LOGS_UNSIZED, (owner, limit))
        elif created_before_ms is not None:
            rows = self._rows("ended_logs", self.sql.ENDED_LOGS_OLDER, (owner, created_before_ms, limit))
        elif sized:
            rows = self._rows("ended_logs", self.sql.ENDED_LOGS_SIZED, (owner, limit))
        else:
            raise ValueError("ended_logs needs one of unsized, created_before_ms, sized")
        return [log_facts_of(r) for r in rows]

    def ended_log_bytes(self, owner: str) -> int:
        return int(self._rows("ended_log_bytes", self.sql.ENDED_LOG_BYTES, (owner,))[0][0])

    def mark_log_deleted(self, log_id: str, now_ms: int, size_bytes: int) -> None:
        with self._write("mark_log_deleted") as c:
            self._execute(c, self.sql.MARK_LOG_DELETED, (now_ms, size_bytes, log_id))
