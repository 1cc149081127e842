"""The journal-backend seam: the whole run store, in four parts a store can be read and tested by.

- :class:`RunJournal` — runs, attempts and events: create, decided transitions, reads, recovery pages;
- :class:`ReceiptJournal` — the receipt journal's rows (ADR-0007 §2.5);
- :class:`CancelDispatch` — the cancellation dispatch records and their leases;
- :class:`LogLedger` — the log artifacts' facts (quota, truncation, sizes, deletion);

:class:`JournalBackend` is their union (plus ``name`` and ``close``): what a ``journal`` plugin
registers. The optional capabilities (:class:`BatchTransitions`, :class:`RunningCreate`,
:class:`HistoryRetention`, :class:`QueueingBackend`) are checked with ``isinstance`` by core.

Core decides, the backend stores. Every state change goes through
:meth:`JournalBackend.transition` (or :meth:`JournalBackend.run_transition`):
the backend opens ONE write transaction, reads the attempt and its run (locked
against other writers), hands a :class:`Snapshot` to core's ``decide``
function, and applies the :class:`Transition` it returns with compare-and-set
on the rows' versions, numbering the events from the run's ``event_seq`` —
or writes nothing when ``decide`` returns ``None``. Core owns the state
machine, the outcome mapping and the "finished before the intent" rule; a
backend never decides an outcome and core never issues SQL.

Errors a backend raises: :class:`ConflictError` (a compare-and-set lost) and
:class:`StoreBusyError` (locked/busy/serialization failure) are retried by core
a bounded number of times; :class:`StoreError` for anything else (the message
names the fix, never a command or a token).

Contract (checked by :class:`ql_core.testing.JournalBackendContract`, which is one suite per part
— ``RunJournalContract``, ``ReceiptJournalContract``, ``CancelDispatchContract``,
``LogLedgerContract`` — plus the whole):

- the *create* commit writes the run (``queued``), its first attempt
  (``starting``), the log artifact, the receipt-journal row (``pending``) and
  the ``run.created`` event, all or nothing; :class:`RunningCreate` backends
  can also write it with the attempt's durable handle (a standby task), the
  run and attempt ``running`` and ``attempt.spawned`` after ``run.created`` —
  the create and spawned commits in one;
- a transition's events get consecutive ``seq`` numbers after the run's
  ``event_seq``, ``(run_id, seq)`` is unique, and ``decide`` sees the state
  as of the transaction it runs in;
- paging is by a stable cursor (``id > after ORDER BY id LIMIT limit``) and
  never returns more than ``limit`` rows;
- a journal row is never deleted while its receipt may exist: rows noted as
  consumed (:meth:`JournalBackend.note_consumed`) are dropped inside a later
  write the backend makes anyway, and :meth:`JournalBackend.resolve` only
  drops what core asks for;
- reads never write.

Threading: one backend instance serves a whole runtime; every method may be
called from several threads at once (each call is its own transaction).
"""

from __future__ import annotations

from dataclasses import field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, TypeVar, runtime_checkable

from ql_core.lean_tuple import LeanNamedTuple
from ql_core.value_class import lean_dataclass, value_class

# At module level, not in create_facts: a function-level import runs the import machinery on every
# task (tests/cli/test_run_imports.py); ports.context imports nothing of ql's at run time.
from .context import RunEventInfo

if TYPE_CHECKING:
    from ..records import (
        AttemptRecord,
        DispatchRecord,
        EventRecord,
        JournalEntry,
        LogFacts,
        NewDispatch,
        NewRun,
        RunRecord,
        RunView,
    )

__all__ = [
    "StoreError",
    "StoreBusyError",
    "ConflictError",
    "EventSpec",
    "Snapshot",
    "Transition",
    "Decide",
    "DispatchClaim",
    "ATTEMPT_COLUMNS",
    "RUN_COLUMNS",
    "DISPATCH_COLUMNS",
    "JournalBackend",
    "BulkQueueing",
    "RunJournal",
    "ReceiptJournal",
    "CancelDispatch",
    "LogLedger",
    "JOURNAL_PARTS",
    "TaskSpec",
    "QueuedRun",
    "QueueingBackend",
    "RefusesSubmissions",
    "HistoryRetention",
    "BatchTransitions",
    "RunningCreate",
    "TerminalLogSize",
    "CreateFacts",
    "create_facts",
]

T = TypeVar("T")


class StoreError(Exception):
    """The run store failed; the message names the fix (never a command or token)."""


class StoreBusyError(StoreError):
    """Locked, busy or a serialization failure: retrying the whole transaction may succeed."""


class ConflictError(StoreError):
    """A compare-and-set lost against another writer: retry the whole transaction."""


class EventSpec(LeanNamedTuple):
    """An event to append: only ids, type, status, exit code and reason (low sensitivity)."""

    type: str
    attempt_id: str | None = None
    status: str | None = None
    exit_code: int | None = None
    reason: str | None = None


#: Attempt columns a transition may set.
ATTEMPT_COLUMNS = frozenset({"status", "exit_code", "reason", "callback_sequence", "started_at_ms",
                             "finished_at_ms", "handle"})
#: Run columns a transition may set.
RUN_COLUMNS = frozenset({"status", "exit_code", "reason", "finished_at_ms", "cancel_reason",
                         "cancel_requested_at_ms"})
#: Dispatch columns :meth:`JournalBackend.finish_dispatch` may set.
DISPATCH_COLUMNS = frozenset({"state", "outcome", "tries", "next_attempt_at_ms", "term_sent_at_ms",
                              "kill_sent_at_ms"})


class Snapshot(LeanNamedTuple):
    """What a decision sees, read inside the write transaction that will apply it.

    ``attempt`` is the one asked for (for :meth:`JournalBackend.run_transition`:
    the run's current attempt); ``signalled`` is True when the run's
    cancellation dispatch, bound to this attempt, has sent it a signal;
    ``now_ms`` is the store's clock.
    """

    run: RunRecord | None
    attempt: AttemptRecord | None
    signalled: bool
    has_dispatch: bool
    now_ms: int


class Transition(LeanNamedTuple):
    """A decided change, applied by the backend with compare-and-set, or not at all."""

    attempt: Mapping[str, object] = MappingProxyType({})
    run: Mapping[str, object] = MappingProxyType({})
    events: tuple[EventSpec, ...] = ()
    #: The attempt ended: start its receipt-journal row's retention clock in the same transaction.
    terminal: bool = False
    #: Insert the run's cancellation dispatch record (only if it has none).
    dispatch: NewDispatch | None = None
    #: Test seam: the backend calls ``ql_core.crashpoints.crashpoint(crash_point)`` after its writes,
    #: before the commit (a process that dies there leaves nothing of this transaction behind).
    crash_point: str | None = None


#: ``decide(snapshot) -> (result, transition or None)``.
Decide = Callable[[Snapshot], "tuple[T, Transition | None]"]


class DispatchClaim(LeanNamedTuple):
    """A cancellation dispatch record whose lease this node now holds (``record.version`` is the fence)."""

    record: DispatchRecord
    owner: str
    now_ms: int


@runtime_checkable
class RunJournal(Protocol):
    """Part 1 of 4, runs and events: the create commit, the decided transitions, the run reads and
    the recovery pages of active attempts and due deadlines. Every other part's rows hang off a run
    that this part created."""

    def create(self, new: NewRun) -> list[RunEventInfo]:
        """The *create* commit (before any side effect): run, attempt, log, journal row, ``run.created``.

        Calls ``crashpoint("create.before_commit")`` after its writes, before the commit.
        """
        ...

    def transition(self, attempt_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        """One write transaction: snapshot the attempt and its run, ``decide``, apply with CAS."""
        ...

    def run_transition(self, run_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        """Like :meth:`transition`, keyed by run (the snapshot's attempt is the run's current one)."""
        ...

    def run(self, run_id: str) -> RunRecord | None: ...

    def attempt(self, attempt_id: str) -> AttemptRecord | None: ...

    def view(self, run_id: str) -> RunView | None:
        """The run with its attempts (oldest first), or None."""
        ...

    def list_views(self, *, status: str | None, limit: int) -> list[RunView]:
        """Runs newest first (``created_at_ms`` desc, id desc), at most ``limit``."""
        ...

    def events(self, run_id: str) -> list[EventRecord] | None:
        """The run's events in ``seq`` order; None when the run is unknown."""
        ...

    def page_active_attempts(self, owner: str, after: str, limit: int) -> list[AttemptRecord]:
        """``starting``/``running`` attempts of ``owner`` with id > ``after``, by id."""
        ...

    def due_deadlines(self, owner: str, now_ms: int, limit: int) -> list[str]:
        """Run ids of ``owner``'s current active/blocked attempts whose deadline passed, no intent yet."""
        ...


@runtime_checkable
class ReceiptJournal(Protocol):
    """Part 2 of 4, the receipt journal (ADR-0007 §2.5): one row per attempt whose receipt may exist,
    written ``pending`` by the create commit; never deleted while that receipt may still exist."""

    def note_consumed(self, attempt_id: str) -> None:
        """Hint: the attempt's receipt was deleted after its terminal commit; drop its row in a later write."""
        ...

    def page_journal(self, after: str, limit: int) -> list[JournalEntry]:
        """Receipt-journal rows with attempt_id > ``after``, by attempt id, with their attempts."""
        ...

    def journal_entry(self, attempt_id: str) -> JournalEntry | None: ...

    def register_journal(self, entries: Mapping[str, tuple[str, str]], now_ms: int) -> int:
        """Back-register ``attempt_id -> (run_id, receipt_ref)`` rows that are missing; count added."""
        ...

    def mark_quarantined(self, attempt_id: str, reason: str, now_ms: int) -> bool:
        """Persist a quarantine decision before the file moves (first decision kept); False: no row."""
        ...

    def mark_terminal_seen(self, attempt_ids: list[str], now_ms: int) -> None:
        """Start the retention clock of rows whose attempt ended and whose receipt was seen missing."""
        ...

    def resolve(self, attempt_ids: list[str]) -> int:
        """Delete these rows (their receipt is gone and the attempt ended); count deleted."""
        ...

    def requeue_quarantined(self, attempt_id: str, seen_updated_at_ms: int, now_ms: int) -> bool:
        """A quarantined row of a still-active attempt goes back to ``pending`` (CAS on updated_at)."""
        ...


@runtime_checkable
class CancelDispatch(Protocol):
    """Part 3 of 4, cancel dispatch: the record a cancel or timeout intent leaves (inserted by a
    :class:`Transition` with ``dispatch``), leased to the node that signals the attempt."""

    def dispatch(self, run_id: str) -> DispatchRecord | None: ...

    def due_dispatches(self, owner: str, limit: int) -> list[str]:
        """Run ids whose active dispatch record is due by the store's clock, attempts of ``owner``."""
        ...

    def claim_dispatch(self, run_id: str, owner: str, lease_ms: int) -> DispatchClaim | None:
        """Take the record's lease (CAS on version; expiry by the store's clock) if due and free."""
        ...

    def finish_dispatch(self, claim: DispatchClaim, values: Mapping[str, object]) -> bool:
        """Write an outcome and release the lease — only while the claim's version still holds."""
        ...


@runtime_checkable
class LogLedger(Protocol):
    """Part 4 of 4, the log ledger: each attempt's log artifact (written by the create commit) — its
    quota, truncation, final size and deletion, and the bounded pages the supervisor works through."""

    def log_facts(self, log_id: str) -> LogFacts | None: ...

    def mark_log_truncated(self, log_id: str, event: EventSpec) -> list[RunEventInfo]:
        """Set ``truncated`` once and append ``event`` to the run; [] if it already was."""
        ...

    def record_log_sizes(self, sizes: Mapping[str, int]) -> None:
        """Record final sizes of many logs in one transaction."""
        ...

    def page_live_logs(self, owner: str, after: str, limit: int) -> list[LogFacts]:
        """Undeleted logs of ``owner``'s starting/running/blocked attempts, id > ``after``, by id."""
        ...

    def ended_logs(self, owner: str, *, unsized: bool = False, created_before_ms: int | None = None,
                   sized: bool = False, limit: int) -> list[LogFacts]:
        """Undeleted logs of ``owner``'s ended attempts, filtered as asked: ``unsized`` (the sizing
        queue, by id), ``created_before_ms`` or ``sized`` (oldest first). Served by an index of the
        undeleted/unsized logs, never a walk of history (docs/recovery.md "Cost of a round")."""
        ...

    def ended_log_bytes(self, owner: str) -> int:
        """Recorded total size of ``owner``'s undeleted logs of ended attempts (a supervisor round reads
        it every time: a kept running total, not a sum over history, where the store can)."""
        ...

    def mark_log_deleted(self, log_id: str, now_ms: int, size_bytes: int) -> None: ...


@runtime_checkable
class JournalBackend(RunJournal, ReceiptJournal, CancelDispatch, LogLedger, Protocol):
    """The whole run store: the four parts, a name and ``close`` (what a ``journal`` plugin registers)."""

    name: str

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


#: The four parts of :class:`JournalBackend`, in the order the docs and contract suites take them.
JOURNAL_PARTS: tuple[type, ...] = (RunJournal, ReceiptJournal, CancelDispatch, LogLedger)


# -- capabilities a journal backend may add (the cluster backend does) -----------------------


# A dataclass: executor wrappers change it with ``dataclasses.replace`` (docs/plugins.md); its
# methods are not generated (ql_core.value_class.lean_dataclass: start-up CPU).
@lean_dataclass(frozen=True, slots=True)
class TaskSpec:
    """What to run: only ever handed to the node that runs it (never logged, never in an event)."""

    command: tuple[str, ...] = field(repr=False)
    shell: bool = False
    cwd: str | None = field(default=None, repr=False)
    env: Mapping[str, str] | None = field(default=None, repr=False)
    #: Added to the environment the task gets where it runs (``env``, else that host's): a queued
    #: run's ``ql run --env`` (the worker merges it with its own environment).
    env_add: Mapping[str, str] | None = field(default=None, repr=False)

    def __init__(self, command: tuple[str, ...], shell: bool = False, cwd: str | None = None,
                 env: Mapping[str, str] | None = None, env_add: Mapping[str, str] | None = None) -> None:
        _set = object.__setattr__
        _set(self, "command", command)
        _set(self, "shell", shell)
        _set(self, "cwd", cwd)
        _set(self, "env", env)
        _set(self, "env_add", env_add)


# A value class, not a dataclass: see ql_core.value_class (start-up CPU of every command).
@value_class()  # as @dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run submitted on a node that does not run tasks itself: it waits in a queue for a worker."""

    __slots__ = ("run_id", "name", "created_at_ms", "spec", "timeout_ms", "max_attempts")
    run_id: str
    name: str | None
    created_at_ms: int
    spec: TaskSpec
    #: The task's time limit, counted from when its attempt starts running (None: none).
    timeout_ms: int | None
    #: 1 = never run twice; more only for tasks declared safe to run again after a lost attempt.
    max_attempts: int

    def __init__(self, run_id: str, name: str | None, created_at_ms: int, spec: TaskSpec,
                 timeout_ms: int | None = None, max_attempts: int = 1) -> None:
        _set = object.__setattr__
        _set(self, "run_id", run_id)
        _set(self, "name", name)
        _set(self, "created_at_ms", created_at_ms)
        _set(self, "spec", spec)
        _set(self, "timeout_ms", timeout_ms)
        _set(self, "max_attempts", max_attempts)


@runtime_checkable
class QueueingBackend(Protocol):
    """A run store that queues runs for workers (``ql run`` on a cluster-control node)."""

    def enqueue(self, run: QueuedRun) -> list[RunEventInfo]:
        """Commit the queued run (and ``run.created``); a worker claims it later."""
        ...

    def request_cancel(self, run_id: str, reason: str) -> str:
        """Commit a cancel intent where the workers learn it (on lease renewal); a queued run ends at
        once. Returns ``requested``, ``already_requested``, ``already_terminal`` or ``not_found``."""
        ...


@runtime_checkable
class RefusesSubmissions(Protocol):
    """A run store on which a run may not be submitted at all (a cluster worker's: it runs only what
    it claims). ``submit`` asks before anything is spawned or written and raises a usage error."""

    def submission_refused(self) -> str:
        """One line: why this node takes no submissions, naming its role and where to submit instead."""
        ...


@runtime_checkable
class BulkQueueing(Protocol):
    """A queueing run store that commits many queued runs at once (``Runtime.submit_many``: a cron
    burst). Without it core enqueues them one by one."""

    def enqueue_many(self, runs: list[QueuedRun]) -> list[list[RunEventInfo]]:
        """Commit the queued runs (each with its ``run.created``); one event list per run, in order.
        Committed in batches, each all or nothing; replay-safe (a run that exists gets no event)."""
        ...


@runtime_checkable
class BatchTransitions(Protocol):
    """A run store that applies several attempts' decisions in ONE write transaction.

    Recovery settles a page of receipts with it: one durable commit per page instead of one per
    attempt. Without this capability core makes one :meth:`JournalBackend.transition` each.
    """

    def transition_many(self, items: list[tuple[str, Decide[T]]]) -> list[tuple[T, list[RunEventInfo]]]:
        """Like :meth:`JournalBackend.transition` for each ``(attempt_id, decide)`` in order, all in
        one transaction: every decision sees the changes of those before it, and either all changes
        commit or none does (a conflict or an error rolls the whole batch back; core retries it).
        Returns one ``(result, events)`` per item, in order."""
        ...


@runtime_checkable
class HistoryRetention(Protocol):
    """A run store that can forget old history (runs, attempts, events, dispatch and log rows).

    Core calls it from the reconciler's round, a page at a time while the round's
    ``retention_budget_ms`` lasts; without this capability nothing is ever purged. Both calls must
    cost O(page), whatever the history (an index per statement; docs/recovery.md "Cost of a round").
    """

    def history_candidates(self, owner: str, *, finished_before_ms: int, keep_newest: int,
                           limit: int) -> dict[str, list[str]]:
        """At most ``limit`` terminal runs, oldest first, that are past the history limits —
        finished before ``finished_before_ms``, or not among the ``keep_newest`` newest runs — whose
        attempts all belong to ``owner`` and none of which still has a receipt-journal row.
        Returns ``run_id -> [undeleted log artifact ids]`` (core deletes those files first)."""
        ...

    def purge_runs(self, run_ids: list[str]) -> int:
        """Delete these runs (one page) and all their rows in ONE transaction; a run that is not
        terminal is never touched. Returns how many runs were deleted."""
        ...


@runtime_checkable
class RunningCreate(Protocol):
    """A backend that can write a run whose task already exists (a standby task) in one commit."""

    def create_running(self, new: NewRun, *, handle: str) -> list[RunEventInfo]:
        """The create commit with the spawned one folded in: everything :meth:`JournalBackend.create`
        writes, but the attempt ``running`` with ``handle`` and ``started_at_ms = created_at_ms``,
        the run ``running``, and the events ``run.created`` (1) and ``attempt.spawned`` (2, status
        ``running``). Same crash point (``create.before_commit``) and all-or-nothing rule."""
        ...


@runtime_checkable
class TerminalLogSize(Protocol):
    """A run store that can record an ended attempt's log size inside that attempt's terminal commit.

    A waiting host that reaped its task finds its log empty (most awaited tasks print nothing) before
    it commits the end: the size (0) then rides in the terminal transaction instead of a commit of
    its own after it. Only a size already true when it is offered may be offered (the launcher has
    exited); whoever offers it withdraws it once the terminal commit was tried, whatever its outcome.
    Without this capability the size is recorded after the terminal commit (``record_log_sizes``).
    """

    def offer_log_size(self, attempt_id: str, log_id: str, size: int) -> None:
        """Write ``size`` as ``log_id``'s ``size_bytes`` in any terminal transition of ``attempt_id``
        made before :meth:`withdraw_log_size` (an attempt that ends otherwise is sized as before)."""
        ...

    def withdraw_log_size(self, attempt_id: str) -> None:
        """Forget what :meth:`offer_log_size` offered for ``attempt_id`` (nothing offered: nothing)."""
        ...


class CreateFacts(LeanNamedTuple):
    """What a create commit writes beyond the :class:`~ql_core.records.NewRun` itself (core decides
    it, every backend writes it): the run's and attempt's states, the attempt's start and handle,
    and the events, numbered from 1 (the run's ``event_seq`` is their count)."""

    run_status: str
    attempt_status: str
    started_at_ms: int | None
    handle: str | None
    events: list[RunEventInfo]


def create_facts(new: NewRun, handle: str | None = None) -> CreateFacts:
    """The facts of :meth:`JournalBackend.create` (``handle`` None) or of
    :meth:`RunningCreate.create_running` (a standby task's handle: created running, spawned)."""
    events = [RunEventInfo(run_id=new.run_id, seq=1, type="run.created", attempt_id=new.attempt_id)]
    if handle is None:
        return CreateFacts("queued", "starting", None, None, events)
    events.append(RunEventInfo(run_id=new.run_id, seq=2, type="attempt.spawned", attempt_id=new.attempt_id,
                               status="running"))
    return CreateFacts("running", "running", new.created_at_ms, handle, events)
