"""CompletionService: the single entry point that ends an attempt (ADR-0007 §2.5).

The live fast path (the host waited for its child) and receipt recovery both
call :meth:`CompletionService.complete`. In ONE store transaction it checks
the claim — run/attempt relation, runtime owner, executor, token (SHA-256,
constant time), callback sequence — asks :mod:`ql_core.outcome` for the
verdict and compare-and-sets the run and attempt with ordered events.
Receipts are found at least once; this makes the terminal state take effect
at most once.

Every terminal transaction also starts the attempt's receipt-journal
retention clock, so the consumer needs no commit of its own after the receipt
is deleted: a task's life is exactly three commits — create, spawned,
terminal (DESIGN.md §3.6).
"""

from __future__ import annotations

import enum
import functools
from typing import TYPE_CHECKING, Callable, Sequence

from .outcome import clamp_times, decide_never_ran, decide_outcome, decide_without_receipt
from .ports.context import RunEventInfo
from .ports.journal import EventSpec, Snapshot, Transition
from .records import run_view
from .retrying import retrying
from .states import RECOVERABLE_ATTEMPT, RUN_ACTIVE
from .tokens import hash_token, same_hash
from .value_class import value_class

if TYPE_CHECKING:
    from .ports.journal import JournalBackend
    from .receipts.codec import Receipt
    from .records import AttemptRecord, RunView

__all__ = [
    "CompletionOutcome",
    "CompletionRejection",
    "CompletionResult",
    "CompletionService",
    "hash_token",
]


class CompletionOutcome(enum.StrEnum):
    APPLIED = "applied"
    ALREADY_TERMINAL = "already_terminal"
    REJECTED = "rejected"
    #: ``complete(..., bound=True)`` only: the claim's finish time is an upper bound, and an intent
    #: (a committed cancel, or the deadline at or before that bound) may have been beaten by the
    #: task's true end: nothing was written; the caller lets a precise claim decide.
    DEFERRED = "deferred"


class CompletionRejection(enum.StrEnum):
    """Deterministic reasons a claim can never be accepted (the receipt is quarantined)."""

    UNKNOWN_ATTEMPT = "unknown_attempt"
    WRONG_RUN = "wrong_run"
    WRONG_OWNER = "wrong_owner"
    WRONG_EXECUTOR = "wrong_executor"
    WRONG_TOKEN = "wrong_token"
    WRONG_SEQUENCE = "wrong_sequence"
    INCONSISTENT_STATE = "inconsistent_state"


@value_class()  # as @dataclass(frozen=True, slots=True), without its import-time code generation
class CompletionResult:
    __slots__ = ("outcome", "status", "rejection", "late", "events", "view")
    outcome: CompletionOutcome
    status: str | None
    rejection: CompletionRejection | None
    #: A valid claim that arrived after another path had already ended the attempt.
    late: bool
    events: tuple[RunEventInfo, ...]
    #: ``complete(..., bound=True)`` APPLIED: the run as this commit left it, built from the rows the
    #: transaction read and the change it wrote (the waiting host returns it without reading the run
    #: again); None when the attempt is not the run's only one.
    view: RunView | None

    def __init__(self, outcome: CompletionOutcome, status: str | None = None,
                 rejection: CompletionRejection | None = None, late: bool = False,
                 events: tuple[RunEventInfo, ...] = (), view: RunView | None = None) -> None:
        _set = object.__setattr__
        _set(self, "outcome", outcome)
        _set(self, "status", status)
        _set(self, "rejection", rejection)
        _set(self, "late", late)
        _set(self, "events", events)
        _set(self, "view", view)


def _rejected(reason: CompletionRejection) -> tuple[CompletionResult, None]:
    return CompletionResult(CompletionOutcome.REJECTED, rejection=reason), None


def _terminal_events(attempt_id: str, status: str, exit_code: int | None, reason: str | None) -> tuple[EventSpec, ...]:
    return (EventSpec(f"attempt.{status}", attempt_id=attempt_id, status=status, exit_code=exit_code, reason=reason),
            EventSpec(f"run.{status}", attempt_id=attempt_id, status=status, exit_code=exit_code, reason=reason))


class CompletionService:
    """Ends attempts exactly once. One instance per runtime (node)."""

    def __init__(self, store: JournalBackend, *, node_id: str, retries: int,
                 notify: Callable[[RunEventInfo], None] | None = None,
                 executor_known: Callable[[str], bool] = lambda name: True,
                 elapsed: Callable[[AttemptRecord], int | None] = lambda attempt: None) -> None:
        self._store = store
        self._node_id = node_id
        self._retries = retries
        self._notify = notify
        #: Is an executor of that name installed here? A receipt of an attempt started by an executor
        #: this runtime does not have is not ours to accept (``wrong_executor``).
        self._executor_known = executor_known
        #: The attempt's duration so far on a clock that does not step, if its executor can tell
        #: (outcome.clamp_times: "now" on the start's clock).
        self._elapsed = elapsed

    def _transition(self, attempt_id: str, decide: Callable[[Snapshot], tuple[CompletionResult, Transition | None]]
                    ) -> CompletionResult:
        """One retried store transaction; observers hear about its events only after the commit."""
        result, events = retrying(lambda: self._store.transition(attempt_id, decide), retries=self._retries)
        if events:
            result = CompletionResult(result.outcome, result.status, result.rejection, result.late, tuple(events),
                                      result.view)
            if self._notify is not None:
                for event in events:
                    self._notify(event)
        return result

    # -- a claim: a parsed receipt, or the spawning host's own observation ------------------
    def complete(self, claim: Receipt, *, executor: str | None = None,
                 audit: tuple[EventSpec, ...] = (), bound: bool = False) -> CompletionResult:
        """Apply ``claim``. ``executor``: the executor that observed it (the live path; it must be the
        attempt's own); None for a receipt (the attempt's executor must be installed here).
        ``audit``: events recorded before the terminal ones, in the same transaction, if it applies.
        ``bound``: the claim's finish time is only an upper bound of the true end (a waiting host's
        reap): where an intent would apply to it — a committed cancel, or a deadline at or before
        it — nothing is written and the result is ``DEFERRED`` (the same transaction's snapshot
        decides, so no intent committed meanwhile is missed)."""
        return self._transition(claim.attempt_id,
                                 lambda snap: self._decide_claim(snap, claim, executor, audit, bound))

    def complete_many(self, claims: Sequence[Receipt]) -> list[CompletionResult]:
        """Apply several receipts (recovery's page): in one transaction when the store can
        (:class:`~ql_core.ports.journal.BatchTransitions`), else one each. Same decisions as
        :meth:`complete`; a failure of the batch raises and nothing of it is committed."""
        from .ports.journal import BatchTransitions

        if len(claims) < 2 or not isinstance(self._store, BatchTransitions):
            return [self.complete(claim) for claim in claims]
        store = self._store
        items = [(claim.attempt_id, functools.partial(self._decide_claim, claim=claim, executor=None))
                 for claim in claims]
        outcomes = retrying(lambda: store.transition_many(items), retries=self._retries)
        results = []
        for result, events in outcomes:
            if events:
                result = CompletionResult(result.outcome, result.status, result.rejection, result.late, tuple(events))
                if self._notify is not None:
                    for event in events:
                        self._notify(event)
            results.append(result)
        return results

    def _decide_claim(self, snap: Snapshot, claim: Receipt, executor: str | None,
                      audit: tuple[EventSpec, ...] = (), bound: bool = False
                      ) -> tuple[CompletionResult, Transition | None]:
        attempt, run = snap.attempt, snap.run
        if attempt is None:
            return _rejected(CompletionRejection.UNKNOWN_ATTEMPT)
        rejection = self._verify(attempt, claim, executor)
        if rejection is not None:
            return _rejected(rejection)
        if run is None:
            return _rejected(CompletionRejection.INCONSISTENT_STATE)
        stored = attempt.callback_sequence
        if attempt.status not in RECOVERABLE_ATTEMPT:
            return self._after_terminal(attempt, claim)
        if claim.callback_sequence != stored + 1:
            return _rejected(CompletionRejection.WRONG_SEQUENCE)
        if run.status not in RUN_ACTIVE or run.current_attempt_id != attempt.id:
            return _rejected(CompletionRejection.INCONSISTENT_STATE)
        if bound and (run.cancel_reason is not None
                      or run.deadline_at_ms is not None and claim.finished_at_ms >= run.deadline_at_ms):
            return CompletionResult(CompletionOutcome.DEFERRED), None
        started, finished = clamp_times(started_at_ms=claim.started_at_ms, finished_at_ms=claim.finished_at_ms,
                                        created_at_ms=attempt.created_at_ms,
                                        committed_started_at_ms=attempt.started_at_ms, now_ms=snap.now_ms,
                                        elapsed_ms=self._elapsed(attempt))
        verdict = decide_outcome(exit_code=claim.exit_code, finished_at_ms=finished,
                                 deadline_at_ms=run.deadline_at_ms, cancel_reason=run.cancel_reason,
                                 cancel_requested_at_ms=run.cancel_requested_at_ms, signalled=snap.signalled)
        events: tuple[EventSpec, ...] = audit
        if verdict.moot is not None:
            events = (EventSpec("run.cancel_moot", attempt_id=attempt.id, reason=verdict.moot),)
        events += _terminal_events(attempt.id, verdict.status, claim.exit_code, verdict.reason)
        change = Transition(
            attempt={"status": verdict.status, "exit_code": claim.exit_code, "reason": verdict.reason,
                     "callback_sequence": claim.callback_sequence, "finished_at_ms": finished,
                     "started_at_ms": attempt.started_at_ms or started},
            run={"status": verdict.status, "exit_code": claim.exit_code, "reason": verdict.reason,
                 "finished_at_ms": max(finished, run.created_at_ms)},
            events=events, terminal=True, crash_point="completion.before_commit")
        view = None
        if bound and attempt.attempt_no == 1:
            # The run's only attempt (a later one would be the current one): the view after this
            # commit is fully known here, as these rows with the change applied.
            view = run_view(run._replace(**change.run), [attempt._replace(**change.attempt)])
        return CompletionResult(CompletionOutcome.APPLIED, status=verdict.status, view=view), change

    def _verify(self, attempt: AttemptRecord, claim: Receipt, executor: str | None) -> CompletionRejection | None:
        if attempt.run_id != claim.run_id:
            return CompletionRejection.WRONG_RUN
        if attempt.runtime_owner != self._node_id:
            return CompletionRejection.WRONG_OWNER
        if attempt.executor != executor if executor is not None else not self._executor_known(attempt.executor):
            return CompletionRejection.WRONG_EXECUTOR
        if not same_hash(attempt.callback_token_hash, claim.token):
            return CompletionRejection.WRONG_TOKEN
        return None

    @staticmethod
    def _after_terminal(attempt: AttemptRecord, claim: Receipt) -> tuple[CompletionResult, Transition | None]:
        stored, sequence = attempt.callback_sequence, claim.callback_sequence
        if sequence == stored:
            if attempt.exit_code is not None and claim.exit_code != attempt.exit_code:
                # Same token and sequence, another exit code: not a replay of what was committed.
                # Not "consistent", so the consumer quarantines it instead of deleting the evidence.
                return _rejected(CompletionRejection.INCONSISTENT_STATE)
            # The same claim again (replay after a crash before cleanup): no write.
            return CompletionResult(CompletionOutcome.ALREADY_TERMINAL, status=attempt.status), None
        if sequence == stored + 1:
            # A true completion that lost the race to another terminal path (e.g. `lost`):
            # record it once — consuming the sequence makes any replay plain already_terminal.
            change = Transition(attempt={"callback_sequence": sequence},
                                events=(EventSpec("attempt.late_callback_ignored", attempt_id=attempt.id,
                                                  status=attempt.status),),
                                crash_point="completion.before_commit")
            return CompletionResult(CompletionOutcome.ALREADY_TERMINAL, status=attempt.status, late=True), change
        return _rejected(CompletionRejection.WRONG_SEQUENCE)

    # -- ends without a receipt -----------------------------------------------------------
    def end_never_ran(self, attempt_id: str, *, reason: str) -> CompletionResult:
        """End an attempt whose task provably never ran (nothing was handed over to it): ``failed``
        with ``reason``, or the committed intent's state when ql had signalled it
        (:func:`ql_core.outcome.decide_never_ran`)."""
        return self.end_without_receipt(attempt_id, reason=reason, never_ran=True)

    def end_without_receipt(self, attempt_id: str, *, status: str | None = None, reason: str,
                            exit_code: int | None = None, never_ran: bool = False) -> CompletionResult:
        """End an attempt that nothing proves finished.

        ``status=None``: the process exited without a receipt — ``lost`` with
        ``reason``, or the committed intent's state when ql signalled it
        (:func:`ql_core.outcome.decide_without_receipt`). ``never_ran``: nothing was
        ever handed to the task (:meth:`end_never_ran`). An explicit status (``lost``
        for an attempt recovery proved never started) is written as given. The callback sequence is not
        consumed, so a true receipt found later is recorded as
        ``attempt.late_callback_ignored`` and never changes the outcome.
        """
        def decide(snap: Snapshot) -> tuple[CompletionResult, Transition | None]:
            attempt, run = snap.attempt, snap.run
            if attempt is None:
                return _rejected(CompletionRejection.UNKNOWN_ATTEMPT)
            if attempt.status not in RECOVERABLE_ATTEMPT:
                return CompletionResult(CompletionOutcome.ALREADY_TERMINAL, status=attempt.status), None
            if run is None or run.current_attempt_id != attempt.id or run.status not in RUN_ACTIVE:
                # A second run.<terminal> event must never be written, whatever the attempt says.
                return _rejected(CompletionRejection.INCONSISTENT_STATE)
            if never_ran:
                verdict = decide_never_ran(cancel_reason=run.cancel_reason, signalled=snap.signalled, reason=reason)
                final, why = verdict.status, verdict.reason
            elif status is None:
                verdict = decide_without_receipt(cancel_reason=run.cancel_reason, signalled=snap.signalled,
                                                 lost_reason=reason)
                final, why = verdict.status, verdict.reason
            else:
                final, why = status, reason
            now = snap.now_ms
            change = Transition(
                attempt={"status": final, "reason": why, "exit_code": exit_code,
                         "finished_at_ms": max(now, attempt.created_at_ms)},
                run={"status": final, "reason": why, "exit_code": exit_code,
                     "finished_at_ms": max(now, run.created_at_ms)},
                events=_terminal_events(attempt.id, final, exit_code, why), terminal=True,
                crash_point="completion.before_commit")
            return CompletionResult(CompletionOutcome.APPLIED, status=final), change

        return self._transition(attempt_id, decide)

    def note(self, attempt_id: str, event: EventSpec) -> CompletionResult:
        """Record one low-sensitivity event about a still-active attempt (no state change)."""
        def decide(snap: Snapshot) -> tuple[CompletionResult, Transition | None]:
            attempt = snap.attempt
            if attempt is None or snap.run is None or attempt.status not in RECOVERABLE_ATTEMPT:
                return CompletionResult(CompletionOutcome.ALREADY_TERMINAL,
                                        status=attempt.status if attempt else None), None
            return CompletionResult(CompletionOutcome.APPLIED, status=attempt.status), Transition(events=(event,))

        return self._transition(attempt_id, decide)

    def audit(self, attempt_id: str, event: EventSpec) -> CompletionResult:
        """Record one audit event about an attempt whatever its state (a receipt rejected after the
        run ended is still worth a line in its history); no state change, never a terminal event."""
        def decide(snap: Snapshot) -> tuple[CompletionResult, Transition | None]:
            attempt = snap.attempt
            if attempt is None or snap.run is None:
                return _rejected(CompletionRejection.UNKNOWN_ATTEMPT)
            return CompletionResult(CompletionOutcome.APPLIED, status=attempt.status), Transition(events=(event,))

        return self._transition(attempt_id, decide)

    def mark_blocked(self, attempt_id: str, reason: str) -> CompletionResult:
        """Identity cannot be verified: record ``blocked`` (never a signal, never a guess).

        The run stays non-terminal — nothing proves an end — and a valid receipt
        found later still completes the attempt.
        """
        def decide(snap: Snapshot) -> tuple[CompletionResult, Transition | None]:
            attempt = snap.attempt
            if attempt is None or attempt.status not in ("starting", "running"):
                return CompletionResult(CompletionOutcome.ALREADY_TERMINAL,
                                        status=attempt.status if attempt else None), None
            if snap.run is None:
                return _rejected(CompletionRejection.INCONSISTENT_STATE)
            change = Transition(attempt={"status": "blocked", "reason": reason},
                                events=(EventSpec("attempt.blocked", attempt_id=attempt.id, status="blocked",
                                                  reason=reason),))
            return CompletionResult(CompletionOutcome.APPLIED, status="blocked"), change

        return self._transition(attempt_id, decide)

    def record_spawned(self, attempt_id: str, *, handle: str, started_at_ms: int) -> CompletionResult:
        """The *spawned* commit: the durable handle; ``starting`` → ``running``, ``attempt.spawned``.

        An attempt that already left ``starting`` (a fast task completed through
        recovery first) is left alone: nothing to add.
        """
        def decide(snap: Snapshot) -> tuple[CompletionResult, Transition | None]:
            attempt = snap.attempt
            if attempt is None or snap.run is None or attempt.status != "starting":
                return CompletionResult(CompletionOutcome.ALREADY_TERMINAL,
                                        status=attempt.status if attempt else None), None
            change = Transition(attempt={"status": "running", "started_at_ms": started_at_ms, "handle": handle},
                                run={"status": "running"},
                                events=(EventSpec("attempt.spawned", attempt_id=attempt.id, status="running"),),
                                crash_point="spawn.before_handle_commit")
            return CompletionResult(CompletionOutcome.APPLIED, status="running"), change

        return self._transition(attempt_id, decide)
