"""A thin typed client of the cluster control plane's PL/pgSQL functions (psycopg 3).

One method per function of revisions ``0003_cluster_control`` to ``0005_worker_role`` (the ``*_many``
batches: revision ``0011_cluster_throughput``'s batched functions, else the single calls pipelined); each is ONE statement
(``SELECT * FROM ql_xxx(...)``) on a connection in autocommit mode, so each call is exactly one
transaction that the server commits when the statement ends. Nobody else commits, nothing is
held open between calls, and no row of any table is read or written here directly — the same
calls will work for a worker role that may only EXECUTE these functions.

Transactions and replays
    A call that raises :class:`TransientError` may or may not have committed (e.g. the connection
    dropped before the COMMIT's answer arrived). Every worker call is safe to repeat with the same
    arguments: ``register`` with the same session keeps the generation, ``start``/``running``
    answer ``ok`` for a lease already in that state, ``complete`` answers ``already_completed`` for
    the completion it applied, ``end_without_completion`` ``already_ended``, ``submit`` ``exists``.
    ``claim`` is the exception: a lost answer leaves claimed attempts that the caller never saw —
    they were never started (``claimed``), so the sweeper puts them back in the queue when their
    lease expires, without consuming a retry. Any other error is final (:class:`ControlDBError`,
    a programming or schema error): do not retry it.

Privacy
    The lease token and the run's spec travel only in the arguments and results of the calls that
    need them; they are kept out of ``repr`` and out of every error message (errors carry the
    operation, the exception class and the SQLSTATE only — never a parameter or a server message
    that could quote one).

psycopg is imported lazily, when a connection is made: ``pip install 'ql-runner[cluster]'``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from . import control_sql as sql, pg_arrays
from .pg_arrays import COMPLETE_TYPES, FENCE_TYPES, RUNNING_TYPES, array_columns
from .call_deadlines import CALL_DEADLINES
from .results import (
    CancelAnswer,
    CancelResult,
    ClaimedAttempt,
    ClaimResult,
    CompletionAnswer,
    CompletionResult,
    EndAnswer,
    EndResult,
    EndStatus,
    HeartbeatResult,
    Intents,
    LeaseAnswer,
    LeaseFence,
    LeaseResult,
    Outcome,
    Registration,
    SubmitAnswer,
    SubmitResult,
    SweepCounts,
    WorkerFence,
)
from .sealing import SealedCopy, SealedSpec

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "ControlDB",
    "ControlDBError",
    "TransientError",
    "MissingDriverError",
    "SCHEMA_REVISION",
    "MAX_CLAIM",
    "SWEEP_PAGE",
    "SWEEP_HARD_CAP",
    "with_retries",
    "MAX_BATCH",
    "SUBMIT_BATCH",
    "WORKER_BATCH",
    "QueuedSubmit",
    "Completion",
]

#: The schema revision whose functions this client calls.
SCHEMA_REVISION = "0005_worker_role"
#: ``claim`` never returns more than this many runs per call (revision 0015; 8 before).
MAX_CLAIM = 64
#: ``sweep``'s default page and the hard cap the database enforces.
SWEEP_PAGE = 16
SWEEP_HARD_CAP = 64
#: A batched call (``start_many``, ``complete_many``, ``submit_many`` …) takes at most this many
#: calls: one transaction, one round trip.
MAX_BATCH = 256
#: What a bulk submit sends per transaction (callers chunk a larger burst by it).
SUBMIT_BATCH = MAX_BATCH
#: What ``ql worker`` sends per batch: small enough to answer well within its call timeout (a
#: third of the run lease at most) even with a long outbox backlog after a partition.
WORKER_BATCH = 32

T = TypeVar("T")

#: A batched function that is not there (a control database before 0011: 42883) or not granted (a
#: worker role granted before it: 42501): the client makes the same calls pipelined instead.
_NO_BATCH_FUNCTION = ("42883", "42501")
#: SQLSTATE classes/codes worth a retry: connection exceptions, serialization failure, deadlock,
#: lock not available, query canceled (statement_timeout), operator intervention (shutdown).
_TRANSIENT_SQLSTATES = ("08", "40", "55P03", "57014", "57P01", "57P02", "57P03", "53")


@dataclass(frozen=True)
class QueuedSubmit:
    """One run of a bulk submit (:meth:`ControlDB.submit_many`); the arguments of :meth:`ControlDB.submit`."""

    run_id: str
    sealed: SealedSpec = field(repr=False)
    name: str | None = None
    timeout_ms: int | None = None
    max_attempts: int = 1


@dataclass(frozen=True)
class Completion:
    """One attempt's completion for :meth:`ControlDB.complete_many` (the arguments of :meth:`ControlDB.complete`)."""

    exit_code: int
    started_at_ms: int | None
    finished_at_ms: int
    signalled: bool
    completion_digest: str

    def params(self, fence: LeaseFence) -> tuple[Any, ...]:
        """The fenced ``complete`` call's arguments: the fence's, then this completion's (in the
        order of :data:`.pg_arrays.COMPLETE_TYPES`)."""
        return (*fence.params(), self.exit_code, self.started_at_ms, self.finished_at_ms, self.signalled,
                self.completion_digest)


class ControlDBError(Exception):
    """A final error of a control-plane call (bad argument, missing schema, bug): do not retry."""

    def __init__(self, operation: str, kind: str, sqlstate: str | None = None) -> None:
        self.operation = operation
        self.kind = kind
        self.sqlstate = sqlstate
        super().__init__(f"control database: {operation} failed: {kind}"
                         + (f" (SQLSTATE {sqlstate})" if sqlstate else ""))


class TransientError(ControlDBError):
    """The call may or may not have committed (connection lost, serialization failure, deadlock,
    timeout): repeat the same call with the same arguments after a capped backoff."""


class MissingDriverError(ImportError):
    """psycopg 3 is not installed."""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDriverError("the cluster control plane needs psycopg 3: pip install 'ql-runner[cluster]'") from exc
    return psycopg


def _conninfo(dsn: str) -> str:
    """Accept SQLAlchemy-style URLs too (``postgresql+psycopg://``)."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql://" + dsn[len(prefix):]
    return dsn


# Allowed argument checks that the database repeats (so a bad call fails before the network).
_END_STATUSES = frozenset(s.value for s in EndStatus)
_CANCEL_REASONS = frozenset({"user", "policy", "shutdown", "timeout"})


class ControlDB:
    """The control plane, one connection. Not shared between threads: use one per thread.

    Create it with :meth:`connect` (it then owns and reconnects its connection) or around an
    existing psycopg connection in autocommit mode (then the caller owns it).
    """

    def __init__(self, connection: psycopg.Connection[Any] | None = None, *, conninfo: str | None = None,
                 connect_timeout_s: int = 5, statement_timeout_ms: int = 10_000,
                 call_timeout_s: float | None = None) -> None:
        if connection is None and conninfo is None:
            raise ValueError("ControlDB needs a connection or a conninfo")
        if connection is not None and not connection.autocommit:
            raise ValueError("ControlDB needs a connection in autocommit mode: each call is its own transaction")
        self._conn = connection
        self._conninfo = None if conninfo is None else _conninfo(conninfo)
        self._owned = connection is None
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_ms = statement_timeout_ms
        #: Client-side cap of one call: past it the socket is shut down and the call raises
        #: TransientError (a black-holed network never answers, and the server never sees a timeout).
        self._call_timeout_s = call_timeout_s
        #: False once a batched function (revision 0011) was missing or not granted: pipelined calls.
        self._batch_functions = True
        #: False once ``ql_artifact_empty_many`` (revision 0016) was missing or not granted: the log
        #: shipper finalizes empty logs itself, as before.
        self._empty_logs_function = True
        #: False once a round's one statement (:mod:`.round_call`) was missing a function or its grant.
        self.reports_rounds = True

    # -- connection --------------------------------------------------------------------------
    @classmethod
    def connect(cls, dsn: str, *, connect_timeout_s: int = 5, statement_timeout_ms: int = 10_000,
                call_timeout_s: float | None = None, lazy: bool = False) -> ControlDB:
        """A client that connects now (``lazy``: on first call) and again after a lost connection."""
        db = cls(conninfo=dsn, connect_timeout_s=connect_timeout_s, statement_timeout_ms=statement_timeout_ms,
                 call_timeout_s=call_timeout_s)
        if not lazy:
            db._connection()
        return db

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if not self._owned or self._conninfo is None:
            raise TransientError("connect", "connection closed")
        psycopg = _psycopg()
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=self._connect_timeout_s,
                                   options=f"-c statement_timeout={int(self._statement_timeout_ms)}",
                                   application_name="ql-cluster", **_KEEPALIVES)
        except psycopg.Error as exc:
            raise TransientError("connect", type(exc).__name__, getattr(exc, "sqlstate", None)) from None
        pg_arrays.register(conn)  # the batched calls' typed arrays: dumped in one pass
        self._conn = conn
        return conn

    def close(self) -> None:
        """Close the connection if this client opened it."""
        if self._owned and self._conn is not None:
            self._conn.close()
        self._conn = None

    def __enter__(self) -> ControlDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, operation: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self._call(operation, lambda conn: _fetch_one_statement(conn, sql, params))

    #: One prebuilt statement of another module (:mod:`.round_call`), its rows; errors as every call's.
    statement_rows = _rows

    def _many(self, operation: str, sql: str, params_seq: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """Many calls of one function in ONE transaction and one round trip (pipelined): one row each.

        Each call is still fenced on its own inside the function; they commit together or not at
        all (a :class:`TransientError` may or may not have committed them all — every batched call
        is replay-safe). Any final error rolls the whole batch back: the caller then makes the
        calls one by one, so one bad call never holds the others back.
        """
        if not params_seq:
            return []
        if len(params_seq) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} calls per batch")
        rows = self._call(operation, lambda conn: _fetch_batch(conn, sql, params_seq))
        if len(rows) != len(params_seq):
            raise ControlDBError(operation, f"expected {len(params_seq)} rows, got {len(rows)}")
        return rows

    def _batched(self, operation: str, batch_sql: str, columns: Sequence[Sequence[Any]], scalars: Sequence[Any],
                 single_sql: str, params_seq: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """N calls of one function in ONE statement — its batched function (revision 0011), given
        ``columns`` (one typed array per argument, element i of call i:
        :func:`.pg_arrays.array_columns`) then ``scalars`` — with the rows put back in call order;
        or, on a control database without it (or a role not granted it), the same calls pipelined
        (:meth:`_many`). Same transaction, same answers either way."""
        if not params_seq:
            return []
        if len(params_seq) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} calls per batch")
        if self._batch_functions:
            try:
                rows = self._rows(operation, batch_sql, (*columns, *scalars))
            except ControlDBError as exc:
                if isinstance(exc, TransientError) or exc.sqlstate not in _NO_BATCH_FUNCTION:
                    raise
                self._batch_functions = False
            else:
                if len(rows) != len(params_seq) or sorted(r[0] for r in rows) != list(range(1, len(params_seq) + 1)):
                    raise ControlDBError(operation, f"expected {len(params_seq)} rows, got {len(rows)}")
                ordered: list[tuple[Any, ...]] = [()] * len(rows)
                for r in rows:
                    ordered[r[0] - 1] = r[1:]
                return ordered
        return self._many(operation, single_sql, params_seq)

    def _call(self, operation: str, run: Callable[[Any], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
        conn = self._connection()
        psycopg = _psycopg()
        token = None
        if self._call_timeout_s is not None:
            token = CALL_DEADLINES.arm(conn.fileno(), self._call_timeout_s)
        try:
            return run(conn)
        except psycopg.Error as exc:
            if token is not None and CALL_DEADLINES.disarm(token):
                token = None
                raise TransientError(operation, "no answer within the call timeout") from None
            # Never str(exc): a server message may quote an argument.
            sqlstate = getattr(exc, "sqlstate", None)
            kind = type(exc).__name__
            if sqlstate == "22023":
                diag = getattr(exc, "diag", None)
                primary = getattr(diag, "message_primary", None) or ""
                if primary.startswith("ql: invalid argument: "):  # names the argument, never its value
                    kind = primary[len("ql: "):]
            if isinstance(exc, psycopg.OperationalError) or (
                    sqlstate is not None and sqlstate.startswith(_TRANSIENT_SQLSTATES)) or conn.broken:
                raise TransientError(operation, kind, sqlstate) from None
            raise ControlDBError(operation, kind, sqlstate) from None
        finally:
            if token is not None:
                CALL_DEADLINES.disarm(token)

    def _one(self, operation: str, sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
        rows = self._rows(operation, sql, params)
        if len(rows) != 1:
            raise ControlDBError(operation, f"expected one row, got {len(rows)}")
        return rows[0]

    # -- control side ----------------------------------------------------------------------------
    def submit(self, run_id: str, *, sealed: SealedSpec, name: str | None = None,
               timeout_ms: int | None = None, max_attempts: int = 1) -> SubmitResult:
        """Insert a queued run with its SEALED task spec (``ql run --detach``, ``Runtime.submit``).

        ``run_id`` is a fresh UUIDv7 from :func:`ql_core.ids.new_id`; ``sealed`` comes from
        :meth:`~.sealing.SpecKeyRing.seal` with the same ``run_id`` and ``max_attempts`` (one copy
        per allowed attempt; only each attempt's lease holder receives its copy); ``timeout_ms`` is
        per attempt (the deadline is set when the attempt starts running); ``max_attempts`` > 1
        only for tasks declared safe to run again after a lost attempt. ``EXISTS`` on a replay.
        """
        row = self._one("submit", sql.SUBMIT, (run_id, name, sealed.key_id, list(sealed.copies), timeout_ms,
                                                 max_attempts))
        return SubmitResult(SubmitAnswer(row[0]), row[1], row[2])

    def submit_many(self, runs: Sequence[QueuedSubmit]) -> list[SubmitResult]:
        """A bulk :meth:`submit` (a cron burst): up to :data:`MAX_BATCH` runs in ONE transaction and one
        round trip; they are all queued or none (a replay answers ``EXISTS`` for those that were)."""
        rows = self._many("submit_many", sql.SUBMIT, [(r.run_id, r.name, r.sealed.key_id, list(r.sealed.copies),
                                                        r.timeout_ms, r.max_attempts) for r in runs])
        return [SubmitResult(SubmitAnswer(row[0]), row[1], row[2]) for row in rows]

    def request_cancel(self, run_id: str, reason: str = "user") -> CancelResult:
        """Commit a cancel intent (``ql cancel``; reason user|policy|shutdown|timeout).

        A queued run, or one whose lease is still ``claimed``, ends at once (``CANCELLED``); a
        started one gets the intent (``REQUESTED``) that its lease holder learns on renew.
        """
        if reason not in _CANCEL_REASONS:
            raise ValueError(f"cancel reason must be one of {sorted(_CANCEL_REASONS)}")
        row = self._one("request_cancel", sql.CANCEL, (run_id, reason))
        return CancelResult(CancelAnswer(row[0]), row[1], row[2])

    def sweep(self, limit: int = SWEEP_PAGE, *, retention_ms: int = 3_600_000) -> SweepCounts:
        """One bounded sweeper round (``ql control``, every few seconds; several at once are safe).

        At most ``limit`` (hard cap 64) rows per step: expired claims back to the queue, expired
        started leases ``lost`` (or queued again by the retry policy), timeout intents for running
        attempts past their deadline, retention of ended leases and leftover specs.
        """
        row = self._one("sweep", sql.SWEEP, (limit, retention_ms))
        return SweepCounts(*row)

    def map_outcome(self, *, cancel_reason: str | None, cancel_requested_at_ms: int | None,
                    deadline_at_ms: int | None, signalled: bool, exit_code: int,
                    finished_at_ms: int) -> Outcome:
        """The database's outcome rule alone (pure; for parity tests with core's Python)."""
        row = self._one("map_outcome", sql.MAP_OUTCOME, (cancel_reason, cancel_requested_at_ms, deadline_at_ms,
                                                          signalled, exit_code, finished_at_ms))
        return Outcome(row[0], row[1], bool(row[2]))

    # -- worker session ----------------------------------------------------------------------------
    def register(self, worker_id: str, session: str, *, slots: int, ql_version: str,
                 ttl_ms: int = 45_000) -> Registration:
        """At worker start-up, once per process (``session`` = a fresh UUID per process start).

        Returns the worker's new generation (fencing any older process with the same id) and its
        session-lease expiry. Calling it again with the same session keeps the generation.
        A restarted worker submits the completions in its outbox with their OLD fence *before*
        registering: registering first fences them.
        """
        row = self._one("register", sql.REGISTER, (worker_id, session, slots, ql_version, ttl_ms))
        return Registration(WorkerFence(worker_id, int(row[0]), session), row[1], row[2])

    def heartbeat(self, worker: WorkerFence, *, ttl_ms: int = 45_000) -> HeartbeatResult:
        """Every ~10 s: extend the worker session lease. ``FENCED`` → another process has the id."""
        row = self._one("heartbeat", sql.HEARTBEAT, (worker.worker_id, worker.generation, worker.session, ttl_ms))
        return HeartbeatResult(LeaseAnswer(row[0]), row[1], row[2])

    def drain(self, worker: WorkerFence) -> LeaseAnswer:
        """The worker starts draining: its row shows ``draining`` to operators (revision 0008). Replay-safe;
        ``FENCED`` when another process holds the id. No fence or claim depends on it."""
        row = self._one("drain", sql.DRAIN, (worker.worker_id, worker.generation, worker.session))
        return LeaseAnswer(row[0])

    def deregister(self, worker: WorkerFence) -> LeaseAnswer:
        """A drained worker ends its session lease (status ``stopped``; revision 0004). Replay-safe."""
        row = self._one("deregister", sql.DEREGISTER, (worker.worker_id, worker.generation, worker.session))
        return LeaseAnswer(row[0])

    def claim(self, worker: WorkerFence, *, max_n: int, free_slots: int, executor: str,
              attempt_ids: Sequence[str], log_ids: Sequence[str], lease_ttl_ms: int = 30_000) -> ClaimResult:
        """Claim up to ``min(max_n, free_slots, MAX_CLAIM, len(attempt_ids))`` queued runs, oldest first
        (:data:`MAX_CLAIM` is 64 since revision 0015, 8 before; an older database answers at most 8).

        ``attempt_ids``/``log_ids`` are fresh UUIDv7s (one pair per run that may be claimed).
        Each :class:`ClaimedAttempt` carries the only copy of its lease token and its sealed spec:
        persist the fence locally, then call :meth:`start` before spawning.
        """
        if len(attempt_ids) != len(log_ids):
            raise ValueError("attempt_ids and log_ids must have the same length")
        rows = self._rows("claim", sql.CLAIM, (worker.worker_id, worker.generation, worker.session, max_n,
                                                free_slots, executor, list(attempt_ids), list(log_ids),
                                                lease_ttl_ms))
        if rows and rows[0][0] == "fenced":
            return ClaimResult(LeaseAnswer.FENCED, (), rows[0][11])
        attempts = tuple(ClaimedAttempt(run_id=r[1], attempt_id=r[2], attempt_no=r[3], lease_generation=r[4],
                                        lease_token=r[5],
                                        sealed_spec=None if r[8] is None else SealedCopy(r[6], int(r[7]),
                                                                                         bytes(r[8])),
                                        timeout_ms=r[9], lease_expires_at_ms=r[10], db_now_ms=r[11])
                         for r in rows)
        return ClaimResult(LeaseAnswer.OK, attempts, attempts[0].db_now_ms if attempts else None)

    # -- per attempt -------------------------------------------------------------------------------
    @staticmethod
    def lease_result(row: tuple[Any, ...]) -> LeaseResult:
        return LeaseResult(LeaseAnswer(row[0]), row[1], row[2], row[3], Intents(row[4], row[5], row[6]))

    def start(self, fence: LeaseFence) -> LeaseResult:
        """claimed → starting, BEFORE spawning (then write ``launching`` locally and spawn).

        Only ``OK`` allows the spawn; ``FENCED`` means the lease is gone (expired, cancelled
        before start, another generation): do not spawn. The run's intents come back too.
        """
        return self.lease_result(self._one("start", sql.START, fence.params()))

    def running(self, fence: LeaseFence, *, started_at_ms: int) -> LeaseResult:
        """starting → running, after the executor's durable handle is stored locally.

        ``started_at_ms`` is the process start (worker clock, clamped by the database). The
        attempt's deadline (db now + the run's timeout) comes back in ``intents``.
        """
        return self.lease_result(self._one("running", sql.RUNNING, (*fence.params(), started_at_ms)))

    def renew(self, fence: LeaseFence, *, ttl_ms: int = 30_000) -> LeaseResult:
        """At half the lease's life: extend it and learn the run's intents (cancel, deadline).

        ``FENCED`` (or no answer before the worker's own lease deadline on its monotonic clock):
        stop the attempt's process group, keep receipt and log, mark it recovery-required.
        """
        return self.lease_result(self._one("renew", sql.RENEW, (*fence.params(), ttl_ms)))

    def complete(self, fence: LeaseFence, *, exit_code: int, started_at_ms: int | None, finished_at_ms: int,
                 signalled: bool, completion_digest: str) -> CompletionResult:
        """Submit the attempt's completion from its receipt (the worker's outbox; replay-safe).

        ``signalled``: ql signalled this attempt for the run's cancel/timeout intent.
        ``completion_digest``: :func:`~ql_plugins.cluster_fenced.results.completion_digest` of
        this payload, persisted with it. Every :class:`CompletionAnswer` is final.
        """
        row = self._one("complete", sql.COMPLETE, (*fence.params(), exit_code, started_at_ms, finished_at_ms,
                                                    signalled, completion_digest))
        return CompletionResult(CompletionAnswer(row[0]), row[1], row[2], row[3], row[4])

    # -- the same calls for many attempts at once: one transaction, one round trip each -------------
    def start_many(self, fences: Sequence[LeaseFence]) -> list[LeaseResult]:
        """:meth:`start` for each fence (each fenced on its own), in one transaction."""
        params = [f.params() for f in fences]
        return [self.lease_result(r) for r in self._batched("start_many", sql.START_MANY,
                                                             array_columns(params, FENCE_TYPES), (),
                                                             sql.START, params)]

    def running_many(self, calls: Sequence[tuple[LeaseFence, int]]) -> list[LeaseResult]:
        """:meth:`running` for each ``(fence, started_at_ms)``, in one transaction."""
        params = [(*f.params(), started) for f, started in calls]
        return [self.lease_result(r) for r in self._batched("running_many", sql.RUNNING_MANY,
                                                             array_columns(params, RUNNING_TYPES), (),
                                                             sql.RUNNING, params)]

    def renew_many(self, fences: Sequence[LeaseFence], *, ttl_ms: int = 30_000) -> list[LeaseResult]:
        """:meth:`renew` for each fence, in one transaction."""
        params = [(*f.params(), ttl_ms) for f in fences]
        return [self.lease_result(r) for r in self._batched("renew_many", sql.RENEW_MANY,
                                                             array_columns([f.params() for f in fences], FENCE_TYPES),
                                                             (ttl_ms,), sql.RENEW, params)]

    def complete_many(self, calls: Sequence[tuple[LeaseFence, Completion | dict[str, Any]]]) -> list[CompletionResult]:
        """:meth:`complete` for each ``(fence, completion)``, in one transaction (each still fenced and
        replay-safe: ``already_completed`` for one that was applied before)."""
        params = [(c if isinstance(c, Completion) else Completion(**c)).params(fence) for fence, c in calls]
        return [CompletionResult(CompletionAnswer(r[0]), r[1], r[2], r[3], r[4])
                for r in self._batched("complete_many", sql.COMPLETE_MANY, array_columns(params, COMPLETE_TYPES), (),
                                       sql.COMPLETE, params)]

    @property
    def carries_empty_logs(self) -> bool:
        """False once ``ql_artifact_empty_many`` (revision 0016) turned out missing or not granted."""
        return self._empty_logs_function

    def complete_many_with_empty_logs(self, calls: Sequence[tuple[LeaseFence, Completion]],
                                      empty_logs: Sequence[LeaseFence], *, max_bytes: int
                                      ) -> tuple[list[CompletionResult], list[tuple[str, str | None]] | None]:
        """:meth:`complete_many`, and in the SAME statement (transaction, round trip) the empty,
        final logs of some of those attempts recorded as finalized artifacts of 0 bytes
        (``ql_artifact_empty_many``, revision 0016): a task that printed nothing then costs the
        artifact store no call of its own (no open, no finalize, no round trip or commit).

        ``empty_logs``: the lease fences (proofs) of attempts whose local log is final and empty.
        Returns the completions' results and, per empty log, ``(answer, fence_reason)`` — or None
        when the function is not there or not granted (then only the completions were made; the
        log shipper finalizes those logs as before). A final error of the batch raises as
        :meth:`complete_many`'s does. Replay-safe: an artifact already finalized empty answers
        ``already_finalized``."""
        if not empty_logs or not self._empty_logs_function:
            return self.complete_many(calls), None
        if len(calls) > MAX_BATCH or len(empty_logs) > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} calls per batch")
        params = [c.params(f) for f, c in calls]
        empty_params = (*array_columns([f.params() for f in empty_logs], FENCE_TYPES), int(max_bytes))
        try:
            rows = self._rows("complete_many", sql.COMPLETE_AND_EMPTY_LOGS,
                              (*array_columns(params, COMPLETE_TYPES), *empty_params))
        except ControlDBError as exc:
            if isinstance(exc, TransientError) or exc.sqlstate not in _NO_BATCH_FUNCTION:
                raise
            # Revision 0016 not there, or not granted to this role: nothing committed; the
            # completions alone, and the shipper keeps finalizing the empty logs itself.
            self._empty_logs_function = False
            return self.complete_many(calls), None
        complete_rows = [r[1:] for r in rows if r[0] == 0]
        empty_rows = [r[1:] for r in rows if r[0] == 1]
        if len(complete_rows) != len(calls) or len(empty_rows) != len(empty_logs):
            raise ControlDBError("complete_many", "unexpected number of rows")
        ordered: list[tuple[Any, ...]] = [()] * len(complete_rows)
        for r in complete_rows:
            ordered[r[0] - 1] = r[1:]
        empties: list[tuple[str, str | None]] = [("", None)] * len(empty_rows)
        for r in empty_rows:
            empties[r[0] - 1] = (r[1], r[4])
        return [CompletionResult(CompletionAnswer(r[0]), r[1], r[2], r[3], r[4]) for r in ordered], empties

    def end_without_completion(self, fence: LeaseFence, *, status: EndStatus | str, reason: str | None = None,
                               signalled: bool = False) -> EndResult:
        """End the attempt without a receipt: ``LOST`` (it provably exited without one) or
        ``RELEASED`` (never spawned; back to the queue, e.g. on drain — refused once running)."""
        status = EndStatus(status)
        row = self._one("end_without_completion", sql.END, (*fence.params(), status.value, reason, signalled))
        return EndResult(EndAnswer(row[0]), row[1], row[2], row[3])


def _fetch_one_statement(conn: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        return cur.execute(sql, params, prepare=True).fetchall()


def _fetch_batch(conn: Any, sql: str, params_seq: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """``BEGIN``; every call pipelined (``executemany``: one round trip); ``COMMIT``. One row per call."""
    rows: list[tuple[Any, ...]] = []
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(sql, params_seq, returning=True)
        while True:
            rows.extend(cur.fetchall())
            if not cur.nextset():
                break
    return rows


#: TCP keepalives: a peer that vanished (host down, cable cut) is noticed by the kernel, not never.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}


def with_retries(call: Callable[[], T], *, attempts: int = 5, base_delay_s: float = 0.05,
                 max_delay_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> T:
    """Repeat ``call`` on :class:`TransientError` with capped exponential backoff.

    Only for the calls that are safe to repeat (all but ``claim``, whose lost answer is recovered
    by the sweeper instead). The last TransientError is raised when every attempt failed.
    """
    delay = base_delay_s
    for attempt in range(attempts):
        try:
            return call()
        except TransientError:
            if attempt == attempts - 1:
                raise
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
    raise AssertionError("unreachable")
