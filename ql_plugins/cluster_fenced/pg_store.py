"""``PostgresJournal``: ql's whole run store on the cluster's PostgreSQL control database.

Implements :class:`ql_core.ports.journal.JournalBackend` (checked by
:class:`ql_core.testing.JournalBackendContract`) on the SQL journal kernel
(:class:`ql_core.db.journal_kernel.SqlJournalKernel`), with psycopg 3 connections
(:mod:`.pg_connections`) and prebuilt statements (:mod:`.pg_statements`); this module is
PostgreSQL's part of the kernel and the control node's queueing. Core decides every state change;
a transition here is ONE transaction:
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
  (:class:`~.services.ControlService`);
- a **standalone node** with ``journal = "cluster-fenced"`` and a PostgreSQL ``database_url``: the
  node runs its own tasks exactly as on SQLite (receipts, journal rows, dispatch), several nodes may
  share the database (each reconciles only the attempts it owns).

Runs created by a standalone node are never claimed by cluster workers: ``ql_claim`` takes only
queued runs that have no current attempt (revision 0004).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Sequence

from ql_core.db.journal_kernel import FLUSH_BATCH, MAX_NOTED, SqlJournalKernel
from ql_core.ports.context import RunEventInfo
from ql_core.ports.journal import StoreError
from ql_core.records import AttemptRecord, DispatchRecord, JournalEntry, RunRecord

from . import pg_statements as sql
from .pg_connections import PgConnections

if TYPE_CHECKING:
    import psycopg

    from ql_core.ports.context import RuntimeContext
    from ql_core.ports.journal import QueuedRun

__all__ = ["PostgresJournal", "MAX_NOTED", "FLUSH_BATCH"]


class PostgresJournal(SqlJournalKernel):
    """The run store on PostgreSQL (registered as ``cluster-fenced`` on every profile but cluster-worker)."""

    name = "cluster-fenced"
    sql = sql
    placeholder = "%s"

    def __init__(self, url: str, *, create: bool = True, settings: Any = None, profile: Any = None,
                 connect_timeout_s: int = 5) -> None:
        from ql_core.db.migrate import SCHEMA_HEAD

        super().__init__()
        self.url = url
        self._db = PgConnections(url, connect_timeout_s=connect_timeout_s, application_name="ql-store")
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
        from .settings import profile_of

        return cls(context.config.database_url, create=not context.existing_only, settings=settings,
                   profile=profile_of(context.config))

    def close(self) -> None:
        self._db.close()

    @property
    def connections(self) -> PgConnections:
        """The store's connections (diagnostics and tests)."""
        return self._db

    # -- the kernel's connections: autocommit, explicit BEGIN ... COMMIT, server-side prepared ------
    def _write(self, operation: str) -> ContextManager[psycopg.Connection[Any]]:
        return self._db.write(operation)

    def _read(self, operation: str) -> ContextManager[psycopg.Connection[Any]]:
        return self._db.read(operation)

    def _rows(self, operation: str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.query(operation, statement, params)

    def _execute(self, c: psycopg.Connection[Any], statement: str, params: Sequence[Any] = ()) -> Any:
        return c.execute(statement, params, prepare=True)

    def _execute_many(self, c: psycopg.Connection[Any], statement: str, rows: Sequence[Sequence[Any]]) -> None:
        with c.cursor() as cur:
            cur.executemany(statement, rows)

    # -- what PostgreSQL does better: the database clock, row locks in the control plane's order
    # (run, then attempt: core's transactions and the fenced worker functions never deadlock each
    # other), array parameters, the journal rows joined to their attempts ---------------------------
    def _clock(self, c: psycopg.Connection[Any]) -> int:
        return int(c.execute(sql.CLOCK, prepare=True).fetchone()[0])

    def _lock_run(self, c: psycopg.Connection[Any], run_id: str) -> tuple[RunRecord | None, int | None]:
        row = c.execute(sql.LOCK_RUN, (run_id,), prepare=True).fetchone()
        if row is None:
            return None, None
        return RunRecord(*row[:-1]), int(row[-1])

    def _lock_attempt(self, c: psycopg.Connection[Any], attempt_id: str) -> AttemptRecord | None:
        row = c.execute(sql.LOCK_ATTEMPT, (attempt_id,), prepare=True).fetchone()
        return AttemptRecord(*row) if row else None

    def _rows_of_attempt(self, c: psycopg.Connection[Any],
                         attempt_id: str) -> tuple[RunRecord | None, AttemptRecord | None, int | None]:
        found = c.execute(sql.ATTEMPT_RUN_ID, (attempt_id,), prepare=True).fetchone()
        run, now = self._lock_run(c, found[0]) if found else (None, None)
        attempt = self._lock_attempt(c, attempt_id) if run is not None else None
        return run, attempt, now

    def _lock_dispatch(self, c: psycopg.Connection[Any], run_id: str) -> tuple[DispatchRecord, int] | None:
        row = c.execute(sql.LOCK_DISPATCH, (run_id,), prepare=True).fetchone()
        return None if row is None else (DispatchRecord(*row[:-1]), int(row[-1]))

    def _attempts_of_runs(self, c: psycopg.Connection[Any], run_ids: list[str]) -> Iterable[Sequence[Any]]:
        return c.execute(sql.SELECT_ATTEMPTS_OF_RUNS, (run_ids,), prepare=True)

    def _delete_pending(self, c: psycopg.Connection[Any], attempt_ids: list[str]) -> None:
        c.execute(sql.DELETE_JOURNAL_PENDING, (attempt_ids,), prepare=True)

    def page_journal(self, after: str, limit: int) -> list[JournalEntry]:
        return [JournalEntry(*r) for r in self._db.query("page_journal", sql.PAGE_JOURNAL, (after, limit))]

    def journal_entry(self, attempt_id: str) -> JournalEntry | None:
        rows = self._db.query("journal_entry", sql.SELECT_JOURNAL, (attempt_id,))
        return JournalEntry(*rows[0]) if rows else None

    def due_dispatches(self, owner: str, limit: int) -> list[str]:
        """Due by the database's clock (several nodes share it: no verdict depends on two clocks)."""
        return [r[0] for r in self._db.query("due_dispatches", sql.DUE_DISPATCHES, (owner, limit))]

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

        plain = encode_spec(run.spec.command, run.spec.shell, run.spec.cwd, run.spec.env, run.spec.env_add)
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

    def enqueue_many(self, runs: list[QueuedRun]) -> list[list[RunEventInfo]]:
        """:meth:`enqueue` for many runs (``Runtime.submit_many``): ``ql_submit`` for
        :data:`~.control_db.SUBMIT_BATCH` runs per transaction, pipelined (one round trip each)."""
        from .control_db import SUBMIT_BATCH, ControlDBError, QueuedSubmit, TransientError
        from .results import SubmitAnswer
        from .sealing import encode_spec

        ring, control = self._key_ring(), self._control()
        out: list[list[RunEventInfo]] = []
        for i in range(0, len(runs), SUBMIT_BATCH):
            batch = []
            for run in runs[i:i + SUBMIT_BATCH]:
                plain = encode_spec(run.spec.command, run.spec.shell, run.spec.cwd, run.spec.env, run.spec.env_add)
                batch.append(QueuedSubmit(run.run_id, ring.seal(run.run_id, plain, run.max_attempts), name=run.name,
                                          timeout_ms=run.timeout_ms, max_attempts=run.max_attempts))
                del plain
            try:
                results = control.submit_many(batch)
            except TransientError as exc:
                from ql_core.ports.journal import StoreBusyError

                raise StoreBusyError(f"the control database did not answer the submit ({exc.kind}); retry") from None
            except ControlDBError as exc:
                raise StoreError(str(exc)) from None
            out += [[] if result.answer is SubmitAnswer.EXISTS else
                    [RunEventInfo(run_id=q.run_id, seq=1, type="run.created", status="queued")]
                    for q, result in zip(batch, results)]
        return out

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

