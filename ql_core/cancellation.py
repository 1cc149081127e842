"""Durable cancellation (ADR-0007 §2.7, DESIGN.md §2): persist the intent, then dispatch.

1. :meth:`Canceller.request` commits ``run.cancel_requested(reason)`` and one
   dispatch record bound to the run's current attempt — before any signal.
   A run that is already terminal is left alone: no event, no signal.
2. :meth:`Canceller.dispatch_due` claims due records with a lease
   (compare-and-set on the record's version, expiry from the *database*
   clock), re-verifies the process identity and signals the process group:
   TERM first, KILL after ``cancel_grace_s``. Outcomes: signalled, already
   exited, blocked (identity mismatch/unsupported: never retried), or retry
   later with capped exponential backoff.

Every dispatch time (due, lease expiry, TERM sent, KILL due) is read from the
database clock, so nodes with skewed clocks agree; the record's version is the
fencing token — an outcome is written only by the holder of that version.
A record is only ever selected by the node that owns its attempt.
What "identity" means is the executor's (recorded on the attempt; one that is
not installed here blocks). For the local executor a handle whose
pid is gone or carries another start time names a process that *exited*
(pid reuse), so nothing is sent and the outcome is ``already_exited``; a handle
that is not a group leader's, whose process sits in another group, or that
cannot be verified at all is ``blocked``. A ``starting`` attempt whose host has
not committed the handle yet is retried (backoff) while its host lives; once the
host is gone the command provably never started (``already_exited``); a host
that cannot be identified is retried for the spawn grace, then blocked.

The deadline rule lives here, once, for every path that notices a deadline (the waiting host, a
reader settling a run, a recovery round): :meth:`Canceller.enforce_deadline` gives a run whose
deadline passed and that has no intent yet the intent ``timeout`` — a request like any other.
Whether it passed is a duration on the attempt's executor's clock (:meth:`Canceller.deadline_passed`).
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .clock import now_ms
from .crashpoints import crashpoint
from .never_started import StartState, start_state
from .ports.context import RunEventInfo
from .ports.executor import SignalOutcome
from .ports.journal import EventSpec, Snapshot, Transition
from .records import NewDispatch
from .retrying import retrying
from .states import CANCEL_REASONS, RUN_TERMINAL

if TYPE_CHECKING:
    from .ports.executor import Executor
    from .ports.journal import DispatchClaim, JournalBackend
    from .profiles import Profile
    from .records import AttemptRecord

__all__ = ["CancelRequest", "Canceller", "DISPATCH_ACTIVE"]

DISPATCH_ACTIVE = ("pending", "term_sent")
#: Same window as the reconciler's: a ``starting`` attempt without a handle may be mid-spawn.
_SPAWN_GRACE_MS = 30_000


class CancelRequest(enum.StrEnum):
    REQUESTED = "requested"
    ALREADY_REQUESTED = "already_requested"
    ALREADY_TERMINAL = "already_terminal"
    NOT_FOUND = "not_found"


@dataclass
class Canceller:
    store: JournalBackend
    #: The executor registered under a name, or None when this runtime cannot load it.
    executor_for: Callable[[str], Executor | None]
    node_id: str
    profile: Profile
    notify: Callable[[RunEventInfo], None] | None = None
    #: How long an attempt has run since its committed start on its executor's clock that does not
    #: step (``Node.attempt_elapsed_ms``); None (or an answer of None): the wall clock decides.
    elapsed: Callable[[AttemptRecord], int | None] | None = None

    # -- the deadline rule -------------------------------------------------------------------
    def enforce_deadline(self, run_id: str, *, has_deadline: bool = True, has_intent: bool = False,
                         remaining_s: float | None = None) -> CancelRequest | None:
        """A run whose deadline passed and that has no cancel intent yet gets the intent ``timeout``
        (committed before any signal, then dispatched like any intent). The one home of that rule.

        ``has_deadline`` / ``has_intent``: what the caller already read (a view, its own
        submission), so nothing is read again when nothing can be due. ``remaining_s``: the
        caller's own measure of the time left (the waiting host's, on the boot clock from the
        committed start); without it :meth:`deadline_passed` measures. Returns what the request
        answered, or None when no timeout was due.
        """
        if not has_deadline or has_intent:
            return None
        passed = remaining_s <= 0 if remaining_s is not None else self.deadline_passed(run_id)
        return self.request(run_id, "timeout") if passed else None

    def deadline_passed(self, run_id: str) -> bool:
        """Has ``run_id``'s deadline passed? A duration: the current attempt's time since its
        committed start on its executor's clock that does not step, compared with the deadline's
        distance from that start — never two wall clocks (the submitter's, ours). The wall clock
        only when the executor cannot measure (then the task cannot have survived a reboot, or it
        runs elsewhere)."""
        run = self.store.run(run_id)
        if run is None or run.deadline_at_ms is None:
            return False
        attempt = self.store.attempt(run.current_attempt_id) if run.current_attempt_id else None
        if attempt is not None and attempt.started_at_ms is not None and self.elapsed is not None:
            elapsed = self.elapsed(attempt)
            if elapsed is not None:
                return elapsed >= run.deadline_at_ms - attempt.started_at_ms
        return now_ms() >= run.deadline_at_ms

    # -- intent ----------------------------------------------------------------------
    def request(self, run_id: str, reason: str = "user") -> CancelRequest:
        """Commit the cancel intent (and its dispatch record) first; signal nothing yet."""
        if reason not in CANCEL_REASONS:
            raise ValueError(f"cancel reason must be one of {sorted(CANCEL_REASONS)}")

        def decide(snap: Snapshot) -> tuple[CancelRequest, Transition | None]:
            run = snap.run
            if run is None:
                return CancelRequest.NOT_FOUND, None
            if run.status in RUN_TERMINAL:
                return CancelRequest.ALREADY_TERMINAL, None
            if run.cancel_reason is not None:
                return CancelRequest.ALREADY_REQUESTED, None
            now = snap.now_ms
            dispatch = None
            if run.current_attempt_id is not None and not snap.has_dispatch:
                # Due at once by the clock that decides dispatch (the store's, as the lease).
                dispatch = NewDispatch(attempt_id=run.current_attempt_id, reason=reason, due_at_ms=now)
            change = Transition(run={"cancel_reason": reason, "cancel_requested_at_ms": now},
                                events=(EventSpec("run.cancel_requested", attempt_id=run.current_attempt_id,
                                                  reason=reason),),
                                dispatch=dispatch)
            return CancelRequest.REQUESTED, change

        result, events = retrying(lambda: self.store.run_transition(run_id, decide),
                                  retries=self.profile.completion_retries)
        for event in events:
            if self.notify:
                self.notify(event)
        if result is CancelRequest.REQUESTED:
            crashpoint("cancel.after_intent")
        return result

    # -- dispatch --------------------------------------------------------------------
    def dispatch_due(self, limit: int) -> dict[str, int]:
        """Work through at most ``limit`` due dispatch records of *this node's* attempts; outcome counts.

        Records bound to another node's attempt are not even selected: on a shared
        database they would otherwise fill every page and starve our own.
        """
        counts: dict[str, int] = {}
        for run_id in self.store.due_dispatches(self.node_id, limit):
            outcome = self.dispatch_one(run_id)
            if outcome:
                counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def _finish(self, claim: DispatchClaim, **values: object) -> bool:
        """Write the outcome and release the lease — only if we still hold it (same version)."""
        return self.store.finish_dispatch(claim, values)

    def _retry(self, claim: DispatchClaim) -> str:
        tries = claim.record.tries + 1
        backoff = min(self.profile.cancel_backoff_cap_s, float(2 ** min(tries, 30)))
        self._finish(claim, tries=tries, next_attempt_at_ms=claim.now_ms + int(backoff * 1000))
        return "retry"

    def dispatch_one(self, run_id: str) -> str | None:
        """Claim, verify and signal one run's dispatch record. Returns the outcome name or None.

        Outcomes: ``signalled`` (TERM sent; KILL is due after ``cancel_grace_s``), ``killed``,
        ``already_exited`` (nothing sent), ``blocked`` (identity mismatched or unverifiable:
        nothing sent, never retried), ``retry`` (a transient failure, or the attempt has no
        handle *yet*: bounded exponential backoff). None: not claimed (not due, leased by
        someone else, or another node's attempt).
        """
        claim = self.store.claim_dispatch(run_id, self.node_id, int(self.profile.cancel_lease_s * 1000))
        if claim is None:
            return None
        record, now = claim.record, claim.now_ms
        attempt = self.store.attempt(record.attempt_id)
        if attempt is not None and attempt.status not in RUN_TERMINAL and attempt.runtime_owner != self.node_id:
            self._finish(claim)  # another node's task: leave it to its owner
            return None
        if attempt is None or attempt.status in RUN_TERMINAL:
            self._finish(claim, state="done", outcome="already_exited")
            return "already_exited"
        executor = self.executor_for(attempt.executor)
        if executor is None:
            # The executor that started it is not installed here: nothing can verify it, so nothing is sent.
            self._finish(claim, state="blocked", outcome="blocked")
            return "blocked"
        if attempt.handle is None and attempt.status == "starting":
            proof = start_state(self.executor_for, attempt)
            if proof is StartState.NEVER_STARTED:
                # Its host died before releasing it: the command never ran, there is nothing to signal.
                self._finish(claim, state="done", outcome="already_exited")
                return "already_exited"
            if proof is StartState.HOST_ALIVE or now - attempt.created_at_ms < _SPAWN_GRACE_MS:
                # Its host is between spawn and the handle commit: signal once the handle exists.
                return self._retry(claim)
        grace_ms = int(self.profile.cancel_grace_s * 1000)
        kill = record.state == "term_sent"
        if kill and record.term_sent_at_ms is not None and now < record.term_sent_at_ms + grace_ms:
            self._finish(claim, next_attempt_at_ms=record.term_sent_at_ms + grace_ms)
            return None
        try:
            outcome = executor.signal(attempt.handle, signal.SIGKILL if kill else signal.SIGTERM)
        except OSError:
            return self._retry(claim)
        crashpoint("cancel.after_signal")
        if outcome is SignalOutcome.SIGNALLED and not kill:
            self._finish(claim, state="term_sent", outcome="signalled", term_sent_at_ms=now,
                         next_attempt_at_ms=now + grace_ms)
            return "signalled"
        if outcome is SignalOutcome.SIGNALLED:
            self._finish(claim, state="done", outcome="killed", kill_sent_at_ms=now)
            return "killed"
        if outcome is SignalOutcome.ALREADY_EXITED:
            self._finish(claim, state="done", outcome="already_exited" if not kill else "signalled")
            return "already_exited"
        self._finish(claim, state="blocked", outcome="blocked")
        return "blocked"
