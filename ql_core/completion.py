"""CompletionService: the single entry point that ends an attempt (ADR-0007 §2.5).

The live fast path (the host waited for its child) and receipt recovery both
call :meth:`CompletionService.complete`. In ONE transaction it checks the
claim — run/attempt relation, runtime owner, executor type, token (SHA-256,
constant time), callback sequence — maps the outcome and compare-and-sets the
run and attempt with two ordered events. Receipts are found at least once;
this makes the terminal state take effect at most once.

Outcome mapping (DESIGN.md §2):
- a committed cancel intent wins: ``timed_out`` for reason ``timeout``, else
  ``cancelled`` — unless the claim's ``finishedAtMs`` is *earlier* than the
  intent's effective time (the deadline, or the cancel request time): then the
  task really finished first, its own outcome stands and the intent is moot;
- otherwise exit code 0 → ``succeeded``, anything else → ``failed``.

Every terminal transaction also starts the attempt's receipt-journal retention
clock (:func:`ql_core.journal.mark_terminal`), so the consumer needs no commit
of its own after the receipt is deleted: a task's life is exactly three
commits — create, spawned, terminal (DESIGN.md §3.6). Other bookkeeping that
belongs to the end of an attempt (e.g. recording its log's final size) can ride
in the same transaction through :meth:`CompletionService.add_terminal_hook`
instead of costing a fourth commit.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .clock import now_ms
from .crashpoints import crashpoint
from .interfaces import RunEventInfo
from .journal import mark_terminal
from .log import logger
from .states import RECOVERABLE_ATTEMPT, RUN_ACTIVE
from .transitions import EventSpec, change_attempt, change_run, load_attempt, load_run, with_retries

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

    from .db.models import Run, RunAttempt
    from .receipts.codec import Receipt

__all__ = [
    "CompletionOutcome",
    "CompletionRejection",
    "CompletionResult",
    "CompletionService",
    "hash_token",
    "map_outcome",
    "TerminalHook",
]

#: ``hook(session, attempt, status)``: extra writes inside a terminal transaction (see add_terminal_hook).
TerminalHook = Callable[["Session", "RunAttempt", str], None]


class CompletionOutcome(enum.StrEnum):
    APPLIED = "applied"
    ALREADY_TERMINAL = "already_terminal"
    REJECTED = "rejected"


class CompletionRejection(enum.StrEnum):
    """Deterministic reasons a claim can never be accepted (the receipt is quarantined)."""

    UNKNOWN_ATTEMPT = "unknown_attempt"
    WRONG_RUN = "wrong_run"
    WRONG_OWNER = "wrong_owner"
    WRONG_EXECUTOR = "wrong_executor"
    WRONG_TOKEN = "wrong_token"
    WRONG_SEQUENCE = "wrong_sequence"
    INCONSISTENT_STATE = "inconsistent_state"


@dataclass(frozen=True, slots=True)
class CompletionResult:
    outcome: CompletionOutcome
    status: str | None = None
    rejection: CompletionRejection | None = None
    #: A valid claim that arrived after another path had already ended the attempt.
    late: bool = False
    events: tuple[RunEventInfo, ...] = ()


def hash_token(token: str) -> str:
    """SHA-256 hex of a callback token; only this is ever stored."""
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def map_outcome(run: Run, exit_code: int, finished_at_ms: int) -> tuple[str, str | None, bool]:
    """(status, reason, intent_moot) for a completion of ``run``."""
    natural = "succeeded" if exit_code == 0 else "failed"
    if run.cancel_reason is None:
        return natural, None, False
    if run.cancel_reason == "timeout":
        effective = run.deadline_at_ms if run.deadline_at_ms is not None else run.cancel_requested_at_ms
        intent_status = "timed_out"
    else:
        effective = run.cancel_requested_at_ms
        intent_status = "cancelled"
    if effective is not None and finished_at_ms < effective:
        return natural, None, True
    return intent_status, run.cancel_reason, False


class CompletionService:
    """Ends attempts exactly once. One instance per runtime (node)."""

    def __init__(self, engine: Engine, *, node_id: str, retries: int,
                 notify: Callable[[RunEventInfo], None] | None = None) -> None:
        self._engine = engine
        self._node_id = node_id
        self._retries = retries
        self._notify = notify
        self._terminal_hooks: list[TerminalHook] = []

    def add_terminal_hook(self, hook: TerminalHook) -> None:
        """Run ``hook(session, attempt, status)`` inside every transaction that ends an attempt.

        For bookkeeping that would otherwise need a commit of its own after the
        terminal one. Each call runs in a SAVEPOINT: a hook that raises is
        logged and rolled back alone — it can never block or undo the terminal
        commit. ``attempt`` is the row as loaded before the change; ``status``
        the terminal status being written.
        """
        self._terminal_hooks.append(hook)

    def _run_terminal_hooks(self, session: Session, attempt: RunAttempt, status: str) -> None:
        for hook in self._terminal_hooks:
            try:
                with session.begin_nested():
                    hook(session, attempt, status)
            except Exception as exc:  # noqa: BLE001 - bookkeeping never blocks a terminal state
                logger.warning("terminal hook {} failed for attempt {}: {}",
                               getattr(hook, "__qualname__", repr(hook)), attempt.id, type(exc).__name__)

    def complete(self, claim: Receipt, *, executor_type: str = "local_process") -> CompletionResult:
        """Apply ``claim`` (a parsed receipt, or a live observation built the same way)."""
        return self._transact(lambda session: self._complete_in(session, claim, executor_type))

    def _transact(self, work: Callable[[Session], CompletionResult]) -> CompletionResult:
        """One retried transaction; observers hear about its events only after the commit."""
        result = with_retries(self._engine, work, retries=self._retries)
        if self._notify is not None:
            for event in result.events:
                self._notify(event)
        return result

    def end_without_receipt(self, attempt_id: str, *, status: str, reason: str,
                            exit_code: int | None = None) -> CompletionResult:
        """End an attempt that nothing proves finished (``lost``, spawn failure, ...).

        Used by recovery and by the spawn path's compensation. The callback
        sequence is not consumed, so a true receipt found later is recorded as
        ``attempt.late_callback_ignored`` and never changes the outcome.
        """
        def work(session: Session) -> CompletionResult:
            attempt = load_attempt(session, attempt_id)
            if attempt is None:
                return _rejected(CompletionRejection.UNKNOWN_ATTEMPT)
            if attempt.status not in RECOVERABLE_ATTEMPT:
                return CompletionResult(CompletionOutcome.ALREADY_TERMINAL, status=attempt.status)
            run = load_run(session, attempt.run_id)
            if run is None or run.current_attempt_id != attempt.id or run.status not in RUN_ACTIVE:
                # A second run.<terminal> event must never be written, whatever the attempt says.
                return _rejected(CompletionRejection.INCONSISTENT_STATE)
            now = now_ms()
            change_attempt(session, attempt, {"status": status, "reason": reason, "exit_code": exit_code,
                                              "finished_at_ms": max(now, attempt.created_at_ms)})
            infos = change_run(session, run, {"status": status, "reason": reason, "exit_code": exit_code,
                                              "finished_at_ms": max(now, run.created_at_ms)}, [
                EventSpec(f"attempt.{status}", attempt_id=attempt.id, status=status, exit_code=exit_code,
                          reason=reason),
                EventSpec(f"run.{status}", attempt_id=attempt.id, status=status, exit_code=exit_code,
                          reason=reason),
            ], now)
            mark_terminal(session, attempt.id, now)
            self._run_terminal_hooks(session, attempt, status)
            crashpoint("completion.before_commit")
            return CompletionResult(CompletionOutcome.APPLIED, status=status, events=tuple(infos))

        return self._transact(work)

    def mark_blocked(self, attempt_id: str, reason: str) -> CompletionResult:
        """Identity cannot be verified: record ``blocked`` (never a signal, never a guess).

        The run stays non-terminal — nothing proves an end — and a valid receipt
        found later still completes the attempt.
        """
        def work(session: Session) -> CompletionResult:
            attempt = load_attempt(session, attempt_id)
            if attempt is None or attempt.status not in ("starting", "running"):
                return CompletionResult(CompletionOutcome.ALREADY_TERMINAL,
                                        status=attempt.status if attempt else None)
            run = load_run(session, attempt.run_id)
            if run is None:
                return _rejected(CompletionRejection.INCONSISTENT_STATE)
            change_attempt(session, attempt, {"status": "blocked", "reason": reason})
            infos = change_run(session, run, {}, [EventSpec("attempt.blocked", attempt_id=attempt.id,
                                                            status="blocked", reason=reason)], now_ms())
            return CompletionResult(CompletionOutcome.APPLIED, status="blocked", events=tuple(infos))

        return self._transact(work)

    # -- the transaction ---------------------------------------------------------------
    def _complete_in(self, session: Session, claim: Receipt, executor_type: str) -> CompletionResult:
        attempt = load_attempt(session, claim.attempt_id)
        if attempt is None:
            return _rejected(CompletionRejection.UNKNOWN_ATTEMPT)
        checked = self._verify(attempt, claim, executor_type)
        if checked is not None:
            return _rejected(checked)
        run = load_run(session, attempt.run_id)
        if run is None:
            return _rejected(CompletionRejection.INCONSISTENT_STATE)
        stored = attempt.callback_sequence
        if attempt.status not in RECOVERABLE_ATTEMPT:
            return self._after_terminal(session, run, attempt, claim)
        if claim.callback_sequence != stored + 1:
            return _rejected(CompletionRejection.WRONG_SEQUENCE)
        if run.status not in RUN_ACTIVE or run.current_attempt_id != attempt.id:
            return _rejected(CompletionRejection.INCONSISTENT_STATE)
        return self._apply(session, run, attempt, claim)

    def _verify(self, attempt: RunAttempt, claim: Receipt, executor_type: str) -> CompletionRejection | None:
        if attempt.run_id != claim.run_id:
            return CompletionRejection.WRONG_RUN
        if attempt.runtime_owner != self._node_id:
            return CompletionRejection.WRONG_OWNER
        if attempt.executor_type != executor_type:
            return CompletionRejection.WRONG_EXECUTOR
        if not hmac.compare_digest(attempt.callback_token_hash, hash_token(claim.token)):
            return CompletionRejection.WRONG_TOKEN
        return None

    def _after_terminal(self, session: Session, run: Run, attempt: RunAttempt, claim: Receipt) -> CompletionResult:
        stored, sequence = attempt.callback_sequence, claim.callback_sequence
        if sequence == stored:
            if attempt.exit_code is not None and claim.exit_code != attempt.exit_code:
                # Same token and sequence, another exit code: not a replay of what was committed.
                # Not "consistent", so the consumer quarantines it instead of deleting the evidence.
                return _rejected(CompletionRejection.INCONSISTENT_STATE)
            # The same claim again (replay after a crash before cleanup): no write.
            return CompletionResult(CompletionOutcome.ALREADY_TERMINAL, status=attempt.status)
        if sequence == stored + 1:
            # A true completion that lost the race to another terminal path (e.g. `lost`):
            # record it once — consuming the sequence makes any replay plain already_terminal.
            now = now_ms()
            change_attempt(session, attempt, {"callback_sequence": sequence})
            events = change_run(session, run, {}, [EventSpec("attempt.late_callback_ignored",
                                                             attempt_id=attempt.id, status=attempt.status)], now)
            crashpoint("completion.before_commit")
            return CompletionResult(CompletionOutcome.ALREADY_TERMINAL, status=attempt.status, late=True,
                                    events=tuple(events))
        return _rejected(CompletionRejection.WRONG_SEQUENCE)

    def _apply(self, session: Session, run: Run, attempt: RunAttempt, claim: Receipt) -> CompletionResult:
        now = now_ms()
        status, reason, moot = map_outcome(run, claim.exit_code, claim.finished_at_ms)
        # Times never precede what the database already committed for this attempt.
        floor = max(attempt.created_at_ms, attempt.started_at_ms or 0)
        started = max(claim.started_at_ms, attempt.created_at_ms)
        finished = max(claim.finished_at_ms, floor, started)
        change_attempt(session, attempt, {
            "status": status, "exit_code": claim.exit_code, "reason": reason,
            "callback_sequence": claim.callback_sequence, "finished_at_ms": finished,
            "started_at_ms": attempt.started_at_ms or started,
        })
        events = []
        if moot:
            events.append(EventSpec("run.cancel_moot", attempt_id=attempt.id, reason=run.cancel_reason))
        events += [
            EventSpec(f"attempt.{status}", attempt_id=attempt.id, status=status, exit_code=claim.exit_code,
                      reason=reason),
            EventSpec(f"run.{status}", attempt_id=attempt.id, status=status, exit_code=claim.exit_code,
                      reason=reason),
        ]
        infos = change_run(session, run, {"status": status, "exit_code": claim.exit_code, "reason": reason,
                                          "finished_at_ms": max(finished, run.created_at_ms)}, events, now)
        mark_terminal(session, attempt.id, now)
        self._run_terminal_hooks(session, attempt, status)
        crashpoint("completion.before_commit")
        return CompletionResult(CompletionOutcome.APPLIED, status=status, events=tuple(infos))


def _rejected(reason: CompletionRejection) -> CompletionResult:
    return CompletionResult(CompletionOutcome.REJECTED, rejection=reason)
