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
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .clock import now_ms
from .crashpoints import crashpoint
from .dbclock import db_now_ms
from .interfaces import RunEventInfo, SignalOutcome
from .states import CANCEL_REASONS, RUN_TERMINAL
from .transitions import EventSpec, change_run, load_run, with_retries

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

    from .db.models import CancellationDispatch
    from .interfaces import Executor
    from .profiles import Profile

__all__ = ["CancelRequest", "Canceller", "DISPATCH_ACTIVE"]

DISPATCH_ACTIVE = ("pending", "term_sent")


class CancelRequest(enum.StrEnum):
    REQUESTED = "requested"
    ALREADY_REQUESTED = "already_requested"
    ALREADY_TERMINAL = "already_terminal"
    NOT_FOUND = "not_found"


@dataclass
class Canceller:
    engine: Engine
    executor: Executor | None
    node_id: str
    profile: Profile
    notify: Callable[[RunEventInfo], None] | None = None

    # -- intent ----------------------------------------------------------------------
    def request(self, run_id: str, reason: str = "user") -> CancelRequest:
        """Commit the cancel intent (and its dispatch record) first; signal nothing yet."""
        if reason not in CANCEL_REASONS:
            raise ValueError(f"cancel reason must be one of {sorted(CANCEL_REASONS)}")

        def work(session: Session) -> tuple[CancelRequest, list[RunEventInfo]]:
            from .db.models import CancellationDispatch

            run = load_run(session, run_id)
            if run is None:
                return CancelRequest.NOT_FOUND, []
            if run.status in RUN_TERMINAL:
                return CancelRequest.ALREADY_TERMINAL, []
            if run.cancel_reason is not None:
                return CancelRequest.ALREADY_REQUESTED, []
            now = now_ms()
            events = change_run(session, run, {"cancel_reason": reason, "cancel_requested_at_ms": now},
                                 [EventSpec("run.cancel_requested", attempt_id=run.current_attempt_id,
                                            reason=reason)], now)
            if run.current_attempt_id is not None and session.get(CancellationDispatch, run_id) is None:
                session.add(CancellationDispatch(run_id=run_id, attempt_id=run.current_attempt_id, reason=reason,
                                                 state="pending", next_attempt_at_ms=now, created_at_ms=now,
                                                 updated_at_ms=now))
            return CancelRequest.REQUESTED, events

        result, events = with_retries(self.engine, work, retries=self.profile.completion_retries)
        for event in events:
            if self.notify:
                self.notify(event)
        if result is CancelRequest.REQUESTED:
            crashpoint("cancel.after_intent")
        return result

    # -- dispatch --------------------------------------------------------------------
    def dispatch_due(self, limit: int) -> dict[str, int]:
        """Work through at most ``limit`` due dispatch records; returns outcome counts."""
        from sqlmodel import select

        from .db.models import CancellationDispatch
        from .db.engine import session_scope

        counts: dict[str, int] = {}
        with session_scope(self.engine, write=False) as session:
            now = db_now_ms(session)
            due = list(session.exec(
                select(CancellationDispatch.run_id)
                .where(CancellationDispatch.state.in_(DISPATCH_ACTIVE),  # type: ignore[attr-defined]
                       CancellationDispatch.next_attempt_at_ms <= now)
                .order_by(CancellationDispatch.next_attempt_at_ms, CancellationDispatch.run_id).limit(limit)))
        for run_id in due:
            outcome = self.dispatch_one(run_id)
            if outcome:
                counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def _claim(self, run_id: str) -> CancellationDispatch | None:
        from sqlalchemy import or_, update
        from sqlmodel import select

        from .db.models import CancellationDispatch
        from .db.engine import session_scope

        with session_scope(self.engine) as session:
            record = session.exec(select(CancellationDispatch).where(
                CancellationDispatch.run_id == run_id)).first()
            if record is None or record.state not in DISPATCH_ACTIVE:
                return None
            now = db_now_ms(session)
            if record.next_attempt_at_ms > now:
                return None
            lease_free = or_(CancellationDispatch.lease_expires_at_ms.is_(None),  # type: ignore[union-attr]
                             CancellationDispatch.lease_expires_at_ms < now)
            result = session.execute(
                update(CancellationDispatch)
                .where(CancellationDispatch.run_id == run_id, CancellationDispatch.version == record.version,
                       lease_free)
                .values(lease_owner=self.node_id, version=record.version + 1,
                        lease_expires_at_ms=now + int(self.profile.cancel_lease_s * 1000), updated_at_ms=now)
                .execution_options(synchronize_session=False))
            if result.rowcount != 1:
                return None
            record.version += 1
            return record

    def _finish(self, record: CancellationDispatch, **values: object) -> None:
        """Write the outcome and release the lease — only if we still hold it."""
        from sqlalchemy import update

        from .db.models import CancellationDispatch
        from .db.engine import session_scope

        with session_scope(self.engine) as session:
            session.execute(
                update(CancellationDispatch)
                .where(CancellationDispatch.run_id == record.run_id, CancellationDispatch.version == record.version,
                       CancellationDispatch.lease_owner == self.node_id)
                .values(version=record.version + 1, lease_owner=None, lease_expires_at_ms=None,
                        updated_at_ms=now_ms(), **values)
                .execution_options(synchronize_session=False))

    def dispatch_one(self, run_id: str) -> str | None:
        """Claim, verify and signal one run's dispatch record. Returns the outcome name or None."""
        from .db.models import RunAttempt
        from .db.engine import session_scope

        record = self._claim(run_id)
        if record is None:
            return None
        with session_scope(self.engine, write=False) as session:
            attempt = session.get(RunAttempt, record.attempt_id)
        if attempt is None or attempt.status in RUN_TERMINAL or self.executor is None \
                or attempt.runtime_owner != self.node_id:
            if attempt is not None and attempt.status not in RUN_TERMINAL and attempt.runtime_owner != self.node_id:
                self._finish(record)  # another node's task: leave it to its owner
                return None
            self._finish(record, state="done", outcome="already_exited")
            return "already_exited"
        handle = _handle_of(attempt)
        now = now_ms()
        kill = record.state == "term_sent"
        if kill and record.term_sent_at_ms is not None and now < record.term_sent_at_ms + self.profile.cancel_grace_s * 1000:
            self._finish(record, next_attempt_at_ms=record.term_sent_at_ms + int(self.profile.cancel_grace_s * 1000))
            return None
        try:
            outcome = self.executor.signal(handle, signal.SIGKILL if kill else signal.SIGTERM)
        except OSError:
            tries = record.tries + 1
            backoff = min(self.profile.cancel_backoff_cap_s, 2 ** tries)
            self._finish(record, tries=tries, next_attempt_at_ms=now + int(backoff * 1000))
            return "retry"
        crashpoint("cancel.after_signal")
        if outcome is SignalOutcome.SIGNALLED and not kill:
            self._finish(record, state="term_sent", outcome="signalled", term_sent_at_ms=now,
                         next_attempt_at_ms=now + int(self.profile.cancel_grace_s * 1000))
            return "signalled"
        if outcome is SignalOutcome.SIGNALLED:
            self._finish(record, state="done", outcome="killed", kill_sent_at_ms=now)
            return "killed"
        if outcome is SignalOutcome.ALREADY_EXITED:
            self._finish(record, state="done", outcome="already_exited" if not kill else "signalled")
            return "already_exited"
        self._finish(record, state="blocked", outcome="blocked")
        return "blocked"


def _handle_of(attempt: object) -> dict[str, object] | None:
    if getattr(attempt, "pid", None) is None:
        return None
    return {"boot_id": attempt.boot_id, "pid": attempt.pid, "pgid": attempt.pgid,  # type: ignore[attr-defined]
            "start_time": attempt.process_start_time}  # type: ignore[attr-defined]
