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
What "identity" means is the executor's: for local processes a handle whose
pid is gone or carries another start time names a process that *exited*
(pid reuse), so nothing is sent and the outcome is ``already_exited``; a handle
that is not a group leader's, whose process sits in another group, or that
cannot be verified at all is ``blocked``. A ``starting`` attempt whose host has
not committed the handle yet is retried (backoff) for the spawn grace, then
blocked.
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
#: Same window as the reconciler's: a ``starting`` attempt without a handle may be mid-spawn.
_SPAWN_GRACE_MS = 30_000


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
                # Due at once by the clock that decides dispatch (the database's, as the lease).
                due = min(now, db_now_ms(session))
                session.add(CancellationDispatch(run_id=run_id, attempt_id=run.current_attempt_id, reason=reason,
                                                 state="pending", next_attempt_at_ms=due, created_at_ms=now,
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
        """Work through at most ``limit`` due dispatch records of *this node's* attempts; outcome counts.

        Records bound to another node's attempt are not even selected: on a shared
        database they would otherwise fill every page and starve our own.
        """
        from sqlmodel import col, select

        from .db.engine import session_scope
        from .db.models import CancellationDispatch, RunAttempt

        counts: dict[str, int] = {}
        with session_scope(self.engine, write=False) as session:
            now = db_now_ms(session)
            due = list(session.exec(
                select(CancellationDispatch.run_id)
                .join(RunAttempt, col(RunAttempt.id) == col(CancellationDispatch.attempt_id))
                .where(col(CancellationDispatch.state).in_(DISPATCH_ACTIVE),
                       col(CancellationDispatch.next_attempt_at_ms) <= now,
                       col(RunAttempt.runtime_owner) == self.node_id)
                .order_by(col(CancellationDispatch.next_attempt_at_ms), col(CancellationDispatch.run_id))
                .limit(limit)))
        for run_id in due:
            outcome = self.dispatch_one(run_id)
            if outcome:
                counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def _claim(self, run_id: str) -> tuple[CancellationDispatch, int] | None:
        """Take the record's lease (version compare-and-set; expiry from the database clock).

        Returns the record (at its new version, our fencing token) and the database's now,
        or None when the record is not due, not active, or someone else holds a live lease.
        """
        from sqlalchemy import or_, update
        from sqlmodel import select

        from .db.engine import session_scope
        from .db.models import CancellationDispatch

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
            return record, now

    def _finish(self, record: CancellationDispatch, now: int, **values: object) -> bool:
        """Write the outcome and release the lease — only if we still hold it (same version)."""
        from sqlalchemy import update

        from .db.engine import session_scope
        from .db.models import CancellationDispatch

        with session_scope(self.engine) as session:
            result = session.execute(
                update(CancellationDispatch)
                .where(CancellationDispatch.run_id == record.run_id, CancellationDispatch.version == record.version,
                       CancellationDispatch.lease_owner == self.node_id)
                .values(version=record.version + 1, lease_owner=None, lease_expires_at_ms=None,
                        updated_at_ms=now, **values)
                .execution_options(synchronize_session=False))
            return result.rowcount == 1

    def _retry(self, record: CancellationDispatch, now: int) -> str:
        tries = record.tries + 1
        backoff = min(self.profile.cancel_backoff_cap_s, float(2 ** min(tries, 30)))
        self._finish(record, now, tries=tries, next_attempt_at_ms=now + int(backoff * 1000))
        return "retry"

    def dispatch_one(self, run_id: str) -> str | None:
        """Claim, verify and signal one run's dispatch record. Returns the outcome name or None.

        Outcomes: ``signalled`` (TERM sent; KILL is due after ``cancel_grace_s``), ``killed``,
        ``already_exited`` (nothing sent), ``blocked`` (identity mismatched or unverifiable:
        nothing sent, never retried), ``retry`` (a transient failure, or the attempt has no
        handle *yet*: bounded exponential backoff). None: not claimed (not due, leased by
        someone else, or another node's attempt).
        """
        from .db.engine import session_scope
        from .db.models import RunAttempt

        claimed = self._claim(run_id)
        if claimed is None:
            return None
        record, now = claimed
        with session_scope(self.engine, write=False) as session:
            attempt = session.get(RunAttempt, record.attempt_id)
        if attempt is not None and attempt.status not in RUN_TERMINAL and attempt.runtime_owner != self.node_id:
            self._finish(record, now)  # another node's task: leave it to its owner
            return None
        if attempt is None or attempt.status in RUN_TERMINAL or self.executor is None:
            self._finish(record, now, state="done", outcome="already_exited")
            return "already_exited"
        handle = _handle_of(attempt)
        if handle is None and attempt.status == "starting" and now - attempt.created_at_ms < _SPAWN_GRACE_MS:
            # Its host is between spawn and the handle commit: signal once the handle exists.
            return self._retry(record, now)
        grace_ms = int(self.profile.cancel_grace_s * 1000)
        kill = record.state == "term_sent"
        if kill and record.term_sent_at_ms is not None and now < record.term_sent_at_ms + grace_ms:
            self._finish(record, now, next_attempt_at_ms=record.term_sent_at_ms + grace_ms)
            return None
        try:
            outcome = self.executor.signal(handle, signal.SIGKILL if kill else signal.SIGTERM)
        except OSError:
            return self._retry(record, now)
        crashpoint("cancel.after_signal")
        if outcome is SignalOutcome.SIGNALLED and not kill:
            self._finish(record, now, state="term_sent", outcome="signalled", term_sent_at_ms=now,
                         next_attempt_at_ms=now + grace_ms)
            return "signalled"
        if outcome is SignalOutcome.SIGNALLED:
            self._finish(record, now, state="done", outcome="killed", kill_sent_at_ms=now)
            return "killed"
        if outcome is SignalOutcome.ALREADY_EXITED:
            self._finish(record, now, state="done", outcome="already_exited" if not kill else "signalled")
            return "already_exited"
        self._finish(record, now, state="blocked", outcome="blocked")
        return "blocked"


def _handle_of(attempt: object) -> dict[str, object] | None:
    if getattr(attempt, "pid", None) is None:
        return None
    return {"boot_id": attempt.boot_id, "pid": attempt.pid, "pgid": attempt.pgid,  # type: ignore[attr-defined]
            "start_time": attempt.process_start_time}  # type: ignore[attr-defined]
