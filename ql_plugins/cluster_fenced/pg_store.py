"""``PostgresJournal``: ql's whole run store on the cluster's PostgreSQL control database.

Implements :class:`ql_core.ports.journal.JournalBackend` (checked by
:class:`ql_core.testing.JournalBackendContract`) with psycopg 3 and prebuilt statements
(:mod:`.pg_statements`). Core decides every state change; a transition here is ONE transaction:
``SELECT … FOR NO KEY UPDATE`` of the run and then the attempt — the lock order of the control
plane's own functions (``docs/cluster-control-db.md`` §6), so core's transactions and the fenced
worker functions can never deadlock each other — a snapshot with the *database* clock, core's
``decide``, and the decided change applied with compare-and-set on the rows' versions, events
numbered from ``event_seq``.

It serves two kinds of node:

- a **control node** (profile ``cluster-control``): runs are queued for workers
  (:class:`~ql_core.ports.journal.QueueingBackend`: :meth:`PostgresJournal.enqueue` is ``ql_submit``,
  :meth:`PostgresJournal.request_cancel` is ``ql_request_cancel``), ``status``/``events``/``list``
  read the control database, and ``ql control`` runs the sweeper
  (:class:`~ql_core.ports.journal.ControlService`);
- a **standalone node** with ``journal = "cluster-fenced"`` and a PostgreSQL ``database_url``: the
  node runs its own tasks exactly as on SQLite (receipts, journal rows, dispatch), several nodes may
  share the database (each reconciles only the attempts it owns).

Runs created by a standalone node are never claimed by cluster workers: ``ql_claim`` takes only
queued runs that have no current attempt (revision 0004).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

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

from . import pg_statements as sql
from .pg_connections import PgConnections

if TYPE_CHECKING:
    import psycopg

    from ql_core.ports.context import RuntimeContext
    from ql_core.ports.journal import QueuedRun

__all__ = ["PostgresJournal", "MAX_NOTED", "FLUSH_BATCH"]

T = TypeVar("T")
#: Consumed attempts remembered in memory at most (beyond that, retention purges their rows).
MAX_NOTED = 4096
#: Noted rows deleted per piggybacked flush.
FLUSH_BATCH = 256


@functools.lru_cache(maxsize=64)
def _update_sql(table: str, columns: tuple[str, ...], where: str) -> str:
    sets = ", ".join(f"{c} = %s" for c in columns)
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


class PostgresJournal:
    """The run store on PostgreSQL (registered as ``cluster-fenced`` on every profile but cluster-worker)."""

    name = "cluster-fenced"

    def __init__(self, url: str, *, create: bool = True, settings: Any = None, profile: Any = None,
                 connect_timeout_s: int = 5) -> None:
        from ql_core.db.migrate import SCHEMA_HEAD

        self.url = url
        self._db = PgConnections(url, connect_timeout_s=connect_timeout_s, application_name="ql-store")
        self._noted: set[str] = set()
        self._noted_lock = threading.Lock()
        #: The spec key ring (sealing.SpecKeyRing), loaded by the first enqueue.
        self._ring: Any = None
        #: The ``[plugin.cluster-fenced]`` settings and profile numbers (control node / sweeper).
        self.settings = settings
        self.profile = profile
        try:
            self._db.ensure_schema(SCHEMA_HEAD, create=create)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def from_context(cls, context: RuntimeContext, settings: Any = None) -> PostgresJournal:
        return cls(context.config.database_url, create=not context.existing_only, settings=settings,
                   profile=context.config.profile)

    def close(self) -> None:
        self._db.close()

    @property
    def connections(self) -> PgConnections:
        """The store's connections (diagnostics and tests)."""
        return self._db

    # -- create ---------------------------------------------------------------------------
    def create(self, new: NewRun) -> list[RunEventInfo]:
        return self._create(new, None)

    def create_running(self, new: NewRun, *, handle: str) -> list[RunEventInfo]:
        return self._create(new, handle)

    def _create(self, new: NewRun, handle: str | None) -> list[RunEventInfo]:
        facts = create_facts(new, handle)
        now = new.created_at_ms
        with self._db.write("create") as c:
            self._flush_noted(c)
            if c.execute(sql.INSERT_RUN, (new.run_id, new.name, facts.run_status, len(facts.events), new.attempt_id,
                                          now, now, new.deadline_at_ms), prepare=True).rowcount != 1:
                # A replay of a create whose COMMIT answer was lost: the same run with the same attempt.
                row = c.execute(sql.RUN_CURRENT_ATTEMPT, (new.run_id,), prepare=True).fetchone()
                if row is not None and row[0] == new.attempt_id:
                    return facts.events
                raise ConflictError(f"run {new.run_id} exists already")
            c.execute(sql.INSERT_ATTEMPT, (new.attempt_id, new.run_id, new.executor, new.runtime_owner,
                                           facts.attempt_status, new.log_artifact_id, new.callback_token_hash,
                                           new.deadline_at_ms, now, facts.started_at_ms, facts.handle,
                                           new.host_handle), prepare=True)
            c.execute(sql.INSERT_LOG, (new.log_artifact_id, new.run_id, new.attempt_id, new.log_relative_path,
                                       new.log_max_bytes, now), prepare=True)
            for e in facts.events:
                c.execute(sql.INSERT_EVENT, (e.run_id, e.seq, e.type, e.attempt_id, e.status, None, None, now),
                          prepare=True)
            c.execute(sql.INSERT_JOURNAL, (new.attempt_id, new.run_id, new.receipt_ref, now, now), prepare=True)
            crashpoint("create.before_commit")
        return facts.events

    def note_consumed(self, attempt_id: str) -> None:
        with self._noted_lock:
            if len(self._noted) < MAX_NOTED:
                self._noted.add(attempt_id)

    def _flush_noted(self, c: psycopg.Connection[Any]) -> None:
        with self._noted_lock:
            if not self._noted:
                return
            batch = sorted(self._noted)[:FLUSH_BATCH]
            self._noted.difference_update(batch)
        c.execute(sql.DELETE_JOURNAL_PENDING, (batch,), prepare=True)

    # -- decided changes ------------------------------------------------------------------
    def transition(self, attempt_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        with self._db.write("transition") as c:
            found = c.execute(sql.ATTEMPT_RUN_ID, (attempt_id,), prepare=True).fetchone()
            run, now = self._lock_run(c, found[0]) if found else (None, None)
            attempt = None
            if run is not None:
                row = c.execute(sql.LOCK_ATTEMPT, (attempt_id,), prepare=True).fetchone()
                attempt = AttemptRecord(*row) if row else None
            return self._decide_and_apply(c, run, attempt, decide, now)

    def run_transition(self, run_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        with self._db.write("run_transition") as c:
            run, now = self._lock_run(c, run_id)
            attempt = None
            if run is not None and run.current_attempt_id is not None:
                row = c.execute(sql.LOCK_ATTEMPT, (run.current_attempt_id,), prepare=True).fetchone()
                attempt = AttemptRecord(*row) if row else None
            return self._decide_and_apply(c, run, attempt, decide, now)

    @staticmethod
    def _lock_run(c: psycopg.Connection[Any], run_id: str) -> tuple[RunRecord | None, int | None]:
        row = c.execute(sql.LOCK_RUN, (run_id,), prepare=True).fetchone()
        if row is None:
            return None, None
        return RunRecord(*row[:-1]), int(row[-1])

    def _decide_and_apply(self, c: psycopg.Connection[Any], run: RunRecord | None, attempt: AttemptRecord | None,
                          decide: Decide[T], now: int | None) -> tuple[T, list[RunEventInfo]]:
        signalled = has_dispatch = False
        if run is not None:
            d = c.execute(sql.SELECT_DISPATCH_SIGNAL, (run.id,), prepare=True).fetchone()
            if d is not None:
                has_dispatch = True
                signalled = attempt is not None and d[0] == attempt.id and d[1] is not None
        if now is None:
            now = int(c.execute(sql.CLOCK, prepare=True).fetchone()[0])
        snap = Snapshot(run=run, attempt=attempt, signalled=signalled, has_dispatch=has_dispatch, now_ms=now)
        result, change = decide(snap)
        if change is None:
            return result, []
        return result, self._apply(c, snap, change)

    def _apply(self, c: psycopg.Connection[Any], snap: Snapshot, t: Transition) -> list[RunEventInfo]:
        now = snap.now_ms
        if t.attempt:
            a = snap.attempt
            if a is None or not set(t.attempt) <= ATTEMPT_COLUMNS:
                raise StoreError(f"invalid attempt change {sorted(t.attempt)}")
            values = dict(t.attempt, version=a.version + 1)
            columns = tuple(sorted(values))
            cur = c.execute(_update_sql("ql_run_attempt", columns, "id = %s AND version = %s"),
                            [values[k] for k in columns] + [a.id, a.version], prepare=True)
            if cur.rowcount != 1:
                raise ConflictError(f"attempt {a.id} changed concurrently")
        infos: list[RunEventInfo] = []
        if t.run or t.events:
            r = snap.run
            if r is None or not set(t.run) <= RUN_COLUMNS:
                raise StoreError(f"invalid run change {sorted(t.run)}")
            values = dict(t.run, version=r.version + 1, event_seq=r.event_seq + len(t.events), updated_at_ms=now)
            columns = tuple(sorted(values))
            cur = c.execute(_update_sql("ql_run", columns, "id = %s AND version = %s AND event_seq = %s"),
                            [values[k] for k in columns] + [r.id, r.version, r.event_seq], prepare=True)
            if cur.rowcount != 1:
                raise ConflictError(f"run {r.id} changed concurrently")
            rows = []
            for offset, e in enumerate(t.events, start=1):
                seq = r.event_seq + offset
                rows.append((r.id, seq, e.type, e.attempt_id, e.status, e.exit_code, e.reason, now))
                infos.append(RunEventInfo(run_id=r.id, seq=seq, type=e.type, attempt_id=e.attempt_id,
                                          status=e.status, exit_code=e.exit_code, reason=e.reason))
            if rows:
                with c.cursor() as cur:
                    cur.executemany(sql.INSERT_EVENT, rows)
        if t.terminal and snap.attempt is not None:
            c.execute(sql.MARK_TERMINAL, (now, snap.attempt.id), prepare=True)
        if t.dispatch is not None and snap.run is not None:
            d = t.dispatch
            c.execute(sql.INSERT_DISPATCH, (snap.run.id, d.attempt_id, d.reason, d.due_at_ms, now, now),
                      prepare=True)
        if t.crash_point:
            crashpoint(t.crash_point)
        return infos

    # -- reads --------------------------------------------------------------------------------
    def run(self, run_id: str) -> RunRecord | None:
        rows = self._db.query("run", sql.SELECT_RUN, (run_id,))
        return RunRecord(*rows[0]) if rows else None

    def attempt(self, attempt_id: str) -> AttemptRecord | None:
        rows = self._db.query("attempt", sql.SELECT_ATTEMPT, (attempt_id,))
        return AttemptRecord(*rows[0]) if rows else None

    def view(self, run_id: str) -> RunView | None:
        with self._db.read("view") as c:
            row = c.execute(sql.SELECT_RUN, (run_id,), prepare=True).fetchone()
            if row is None:
                return None
            attempts = [AttemptRecord(*a) for a in c.execute(sql.SELECT_ATTEMPTS_OF_RUN, (run_id,), prepare=True)]
        return _view(RunRecord(*row), attempts)

    def list_views(self, *, status: str | None, limit: int) -> list[RunView]:
        with self._db.read("list") as c:
            if status:
                runs = [RunRecord(*r) for r in c.execute(sql.SELECT_RUNS_NEWEST_BY_STATUS, (status, limit),
                                                         prepare=True)]
            else:
                runs = [RunRecord(*r) for r in c.execute(sql.SELECT_RUNS_NEWEST, (limit,), prepare=True)]
            by_run: dict[str, list[AttemptRecord]] = {r.id: [] for r in runs}
            if runs:
                for a in c.execute(sql.SELECT_ATTEMPTS_OF_RUNS, (list(by_run),), prepare=True):
                    by_run[a[1]].append(AttemptRecord(*a))
        return [_view(r, by_run[r.id]) for r in runs]

    def events(self, run_id: str) -> list[EventRecord] | None:
        with self._db.read("events") as c:
            if c.execute(sql.SELECT_RUN, (run_id,), prepare=True).fetchone() is None:
                return None
            return [EventRecord(*e) for e in c.execute(sql.SELECT_EVENTS, (run_id,), prepare=True)]

    # -- recovery paging ------------------------------------------------------------------------
    def page_active_attempts(self, owner: str, after: str, limit: int) -> list[AttemptRecord]:
        return [AttemptRecord(*r) for r in self._db.query("page_active_attempts", sql.PAGE_ACTIVE_ATTEMPTS,
                                                          (owner, after, limit))]

    def due_deadlines(self, owner: str, now_ms: int, limit: int) -> list[str]:
        return [r[0] for r in self._db.query("due_deadlines", sql.DUE_DEADLINES, (now_ms, owner, limit))]

    def page_journal(self, after: str, limit: int) -> list[JournalEntry]:
        return [JournalEntry(*r) for r in self._db.query("page_journal", sql.PAGE_JOURNAL, (after, limit))]

    # -- the receipt journal --------------------------------------------------------------------
    def journal_entry(self, attempt_id: str) -> JournalEntry | None:
        rows = self._db.query("journal_entry", sql.SELECT_JOURNAL, (attempt_id,))
        return JournalEntry(*rows[0]) if rows else None

    def register_journal(self, entries: Mapping[str, tuple[str, str]], now_ms: int) -> int:
        if not entries:
            return 0
        added = 0
        with self._db.write("register_journal") as c:
            for attempt_id, (run_id, ref) in entries.items():
                added += c.execute(sql.INSERT_JOURNAL, (attempt_id, run_id, ref, now_ms, now_ms),
                                   prepare=True).rowcount
        return added

    def mark_quarantined(self, attempt_id: str, reason: str, now_ms: int) -> bool:
        with self._db.write("mark_quarantined") as c:
            if c.execute(sql.JOURNAL_EXISTS, (attempt_id,), prepare=True).fetchone() is None:
                return False
            c.execute(sql.MARK_QUARANTINED, (reason[:40], now_ms, attempt_id), prepare=True)
        return True

    def mark_terminal_seen(self, attempt_ids: list[str], now_ms: int) -> None:
        if attempt_ids:
            with self._db.write("mark_terminal_seen") as c, c.cursor() as cur:
                cur.executemany(sql.MARK_TERMINAL, [(now_ms, a) for a in attempt_ids])

    def resolve(self, attempt_ids: list[str]) -> int:
        if not attempt_ids:
            return 0
        with self._noted_lock:
            self._noted.difference_update(attempt_ids)
        deleted = 0
        with self._db.write("resolve") as c:
            self._flush_noted(c)
            for attempt_id in attempt_ids:
                deleted += c.execute(sql.DELETE_JOURNAL, (attempt_id,), prepare=True).rowcount
        return deleted

    def requeue_quarantined(self, attempt_id: str, seen_updated_at_ms: int, now_ms: int) -> bool:
        with self._db.write("requeue_quarantined") as c:
            return c.execute(sql.REQUEUE_QUARANTINED, (now_ms, attempt_id, seen_updated_at_ms),
                             prepare=True).rowcount == 1

    # -- cancellation dispatch --------------------------------------------------------------------
    def dispatch(self, run_id: str) -> DispatchRecord | None:
        rows = self._db.query("dispatch", sql.SELECT_DISPATCH_OF_RUN, (run_id,))
        return DispatchRecord(*rows[0]) if rows else None

    def due_dispatches(self, owner: str, limit: int) -> list[str]:
        return [r[0] for r in self._db.query("due_dispatches", sql.DUE_DISPATCHES, (owner, limit))]

    def claim_dispatch(self, run_id: str, owner: str, lease_ms: int) -> DispatchClaim | None:
        with self._db.write("claim_dispatch") as c:
            row = c.execute(sql.LOCK_DISPATCH, (run_id,), prepare=True).fetchone()
            if row is None:
                return None
            record, now = DispatchRecord(*row[:-1]), int(row[-1])
            if record.state not in ("pending", "term_sent") or record.next_attempt_at_ms > now:
                return None
            cur = c.execute(sql.CLAIM_DISPATCH, (owner, now + lease_ms, now, run_id, record.version, now),
                            prepare=True)
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
        query = _update_sql("ql_cancel_dispatch", columns, "run_id = %s AND version = %s AND lease_owner = %s")
        with self._db.write("finish_dispatch") as c:
            cur = c.execute(query, [full[k] for k in columns]
                            + [claim.record.run_id, claim.record.version, claim.owner], prepare=True)
            return cur.rowcount == 1

    # -- log artifacts ---------------------------------------------------------------------------
    def log_facts(self, log_id: str) -> LogFacts | None:
        rows = self._db.query("log_facts", sql.SELECT_LOG, (log_id,))
        return _log(rows[0]) if rows else None

    def mark_log_truncated(self, log_id: str, event: EventSpec) -> list[RunEventInfo]:
        def decide(snap: Snapshot) -> tuple[None, Transition | None]:
            return None, (Transition(events=(event,)) if snap.run is not None else None)

        with self._db.write("mark_log_truncated") as c:
            # The run is locked before the log row is changed: the lock order of every transition.
            found = c.execute(sql.SELECT_LOG, (log_id,), prepare=True).fetchone()
            if found is None:
                return []
            run, now = self._lock_run(c, found[1])
            if c.execute(sql.MARK_LOG_TRUNCATED, (log_id,), prepare=True).rowcount != 1:
                return []
            return self._decide_and_apply(c, run, None, decide, now)[1]

    def record_log_sizes(self, sizes: Mapping[str, int]) -> None:
        if sizes:
            with self._db.write("record_log_sizes") as c, c.cursor() as cur:
                cur.executemany(sql.SET_LOG_SIZE, [(size, log_id) for log_id, size in sorted(sizes.items())])

    def page_live_logs(self, owner: str, after: str, limit: int) -> list[LogFacts]:
        return [_log(r) for r in self._db.query("page_live_logs", sql.PAGE_LIVE_LOGS, (owner, after, limit))]

    def ended_logs(self, owner: str, *, unsized: bool = False, created_before_ms: int | None = None,
                   sized: bool = False, limit: int) -> list[LogFacts]:
        if unsized:
            rows = self._db.query("ended_logs", sql.ENDED_LOGS_UNSIZED, (owner, limit))
        elif created_before_ms is not None:
            rows = self._db.query("ended_logs", sql.ENDED_LOGS_OLDER, (owner, created_before_ms, limit))
        elif sized:
            rows = self._db.query("ended_logs", sql.ENDED_LOGS_SIZED, (owner, limit))
        else:
            raise ValueError("ended_logs needs one of unsized, created_before_ms, sized")
        return [_log(r) for r in rows]

    def ended_log_bytes(self, owner: str) -> int:
        return int(self._db.query("ended_log_bytes", sql.ENDED_LOG_BYTES, (owner,))[0][0])

    def mark_log_deleted(self, log_id: str, now_ms: int, size_bytes: int) -> None:
        with self._db.write("mark_log_deleted") as c:
            c.execute(sql.MARK_LOG_DELETED, (now_ms, size_bytes, log_id), prepare=True)

    # -- queueing (a control node: QueueingBackend) ------------------------------------------------
    def _control(self) -> Any:
        """A control-plane client on this thread's connection (each call its own transaction)."""
        from .control_db import ControlDB

        return ControlDB(self._db.connection())

    def _key_ring(self) -> Any:
        """The spec key ring, read on the first submit (a control node that only reads needs no key)."""
        if self._ring is None:
            from ql_core.errors import ConfigError

            from .settings import parse_settings

            settings = self.settings
            if settings is None:
                settings = parse_settings({}, node_id="control")
            if not settings.spec_key_file:
                raise ConfigError('a cluster run is queued with its command, cwd and environment sealed, and this '
                                  'node has no key: set [plugin.cluster-fenced] spec_key_file = "/etc/ql/spec.key" '
                                  '(create it once with `ql db new-spec-key PATH`; the workers need the same key)')
            self._ring = settings.key_ring()
        return self._ring

    def enqueue(self, run: QueuedRun) -> list[RunEventInfo]:
        """``ql_submit``: the queued run and its spec, sealed here (one copy per allowed attempt) so the
        control database never holds it in clear; only each attempt's lease holder receives a copy."""
        from .control_db import ControlDBError, TransientError
        from .results import SubmitAnswer
        from .sealing import encode_spec

        plain = encode_spec(run.spec.command, run.spec.shell, run.spec.cwd, run.spec.env)
        sealed = self._key_ring().seal(run.run_id, plain, run.max_attempts)
        del plain
        try:
            result = self._control().submit(run.run_id, sealed=sealed, name=run.name, timeout_ms=run.timeout_ms,
                                            max_attempts=run.max_attempts)
        except TransientError as exc:
            from ql_core.ports.journal import StoreBusyError

            raise StoreBusyError(f"the control database did not answer the submit ({exc.kind}); retry") from None
        except ControlDBError as exc:
            raise StoreError(str(exc)) from None
        if result.answer is SubmitAnswer.EXISTS:
            return []  # a replay of a submit that committed: its run.created was reported then
        return [RunEventInfo(run_id=run.run_id, seq=1, type="run.created", status="queued")]

    def request_cancel(self, run_id: str, reason: str) -> str:
        """``ql_request_cancel``: the intent where the lease holder learns it (a queued run ends now)."""
        from .control_db import ControlDBError, TransientError
        from .results import CancelAnswer

        try:
            result = self._control().request_cancel(run_id, reason)
        except TransientError as exc:
            from ql_core.ports.journal import StoreBusyError

            raise StoreBusyError(f"the control database did not answer the cancel ({exc.kind}); retry") from None
        except ControlDBError as exc:
            raise StoreError(str(exc)) from None
        if result.answer is CancelAnswer.CANCELLED:
            return "requested"  # committed, and the run is already ended (nothing was running)
        return str(result.answer)

    def ops_snapshot(self) -> dict[str, Any]:
        """Workers, queue and shipping for `ql workers`, `ql web` and the metrics (see :mod:`.ops_view`)."""
        from .ops_view import snapshot

        return snapshot(self.connections)

    # -- ql control (ControlService) -------------------------------------------------------------
    def run_control(self, runtime: object, stop: threading.Event) -> int:
        from .control import run_sweeper

        rt: Any = runtime
        name = rt.config.artifact_store if rt is not None else None
        make_store = (lambda: rt.plugins.artifact_stores.create(name, rt.context)) if name else None
        return run_sweeper(self.url, self.profile, stop, make_artifact_store=make_store)

