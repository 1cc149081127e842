"""The reconciler: after any crash, find every attempt's true end in bounded rounds (ADR-0007 §2.6).

One round, in this fixed order, every step capped by the profile:
1. passed deadlines → commit ``run.cancel_requested(reason=timeout)`` (before any signal);
2. due cancellation dispatch records → lease, verify, TERM/KILL;
3. this runtime's active attempts, paged from the *database* with a stable
   cursor (``id > cursor ORDER BY id``; never a walk of the receipt directory):
   a receipt → the consumer; no receipt → the durable identity:
   running → keep; exited → wait the publish grace once, look again, still
   missing → ``lost`` (``RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT``), or the
   intent's state when a committed cancel/timeout was dispatched;
   unverifiable → ``blocked`` (never a signal). Missing journal rows of active
   attempts are back-registered;
4. the journal, paged the same way: receipts of attempts that already ended
   are replayed (``already_terminal``, then cleaned), blocked attempts get
   their late receipts, and retention purges terminal rows whose receipt is
   gone and quarantined files, after the profile's windows.
A page that comes back full but does not move the cursor forward stops the
round (fail closed) instead of looping.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .clock import now_ms
from .consumer import ConsumeOutcome
from .interfaces import IdentityState
from .log import logger
from .states import ATTEMPT_ACTIVE, RUN_TERMINAL

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["Reconciler", "RoundReport", "CursorStuckError", "REPORT_KEYS", "SPAWN_GRACE_MS"]

#: A ``starting`` attempt without a handle may belong to a host that is spawning it right now.
SPAWN_GRACE_MS = 30_000
#: Counters every report carries (``ql reconcile`` prints them even when zero).
REPORT_KEYS = ("applied", "already_terminal", "quarantined", "still_running", "lost", "blocked",
               "timed_out", "cancelled")
LOST_REASON = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"


class CursorStuckError(RuntimeError):
    """A full page did not advance the cursor: stop rather than loop (fail closed)."""


@dataclass
class RoundReport:
    counts: Counter[str] = field(default_factory=Counter)
    attempts_touched: int = 0
    journal_touched: int = 0
    #: The attempt cursor after the round ("" = the pass wrapped around).
    attempt_cursor: str = ""
    journal_cursor: str = ""

    def merge(self, other: RoundReport) -> None:
        self.counts.update(other.counts)
        self.attempts_touched += other.attempts_touched
        self.journal_touched += other.journal_touched

    def as_dict(self) -> dict[str, int]:
        return {key: self.counts.get(key, 0) for key in REPORT_KEYS} | {
            k: v for k, v in sorted(self.counts.items()) if k not in REPORT_KEYS}


class Reconciler:
    """Bounded recovery rounds for one runtime. Stateless apart from its two cursors."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.profile = runtime.profile
        self.attempt_cursor = ""
        self.journal_cursor = ""

    # -- one round -------------------------------------------------------------------
    def round(self) -> RoundReport:
        report = RoundReport()
        limit = self.profile.page_size * self.profile.pages_per_round
        self._deadlines(report, limit)
        for outcome, n in self.rt.canceller.dispatch_due(limit).items():
            report.counts[f"dispatch_{outcome}"] += n
        if self.rt.consumer is not None:
            self._active_attempts(report)
            self._journal(report)
        report.attempt_cursor, report.journal_cursor = self.attempt_cursor, self.journal_cursor
        return report

    def full_pass(self, *, max_rounds: int = 100_000) -> tuple[RoundReport, int]:
        """Rounds until both cursors wrap (every attempt and journal row seen once); bounded."""
        total = RoundReport()
        self.attempt_cursor = self.journal_cursor = ""
        for rounds in range(1, max_rounds + 1):
            one = self.round()
            total.merge(one)
            if not self.attempt_cursor and not self.journal_cursor:
                return total, rounds
        return total, max_rounds

    # -- step 1: deadlines ---------------------------------------------------------
    def _deadlines(self, report: RoundReport, limit: int) -> None:
        from sqlmodel import col, select

        from .db.engine import session_scope
        from .db.models import Run, RunAttempt

        now = now_ms()
        with session_scope(self.rt.engine, write=False) as session:
            due = list(session.exec(
                select(Run.id).join(RunAttempt, col(RunAttempt.id) == col(Run.current_attempt_id))
                .where(col(RunAttempt.runtime_owner) == self.rt.node_id,
                       col(RunAttempt.status).in_(sorted(ATTEMPT_ACTIVE | {"blocked"})),
                       col(Run.deadline_at_ms) <= now, col(Run.cancel_reason).is_(None))
                .order_by(col(Run.deadline_at_ms)).limit(limit)))
        for run_id in due:
            if str(self.rt.canceller.request(run_id, "timeout")) == "requested":
                report.counts["timeouts_requested"] += 1

    # -- step 3: active attempts -----------------------------------------------------
    def _page(self, model: Any, key: Any, where: list[Any], cursor: str, limit: int) -> list[Any]:
        from sqlmodel import col, select

        from .db.engine import session_scope

        with session_scope(self.rt.engine, write=False) as session:
            return list(session.exec(select(model).where(*where, col(key) > cursor)
                                     .order_by(col(key)).limit(limit)))

    def _pages(self, model: Any, key: str, where: list[Any], cursor_attr: str) -> Any:
        """Yield rows page by page (capped), moving the named cursor; wraps to "" at the end."""
        page_size, pages = self.profile.page_size, self.profile.pages_per_round
        for _ in range(pages):
            cursor = getattr(self, cursor_attr)
            rows = self._page(model, getattr(model, key), where, cursor, page_size)
            if not rows:
                setattr(self, cursor_attr, "")
                return
            last = getattr(rows[-1], key)
            if last <= cursor:
                raise CursorStuckError(f"{cursor_attr} did not advance past {cursor!r}")
            yield from rows
            setattr(self, cursor_attr, last if len(rows) == page_size else "")
            if len(rows) < page_size:
                return

    def _active_attempts(self, report: RoundReport) -> None:
        from sqlmodel import col

        from .db.models import RunAttempt

        where = [col(RunAttempt.runtime_owner) == self.rt.node_id,
                 col(RunAttempt.status).in_(sorted(ATTEMPT_ACTIVE))]
        attempts = list(self._pages(RunAttempt, "id", where, "attempt_cursor"))
        report.attempts_touched += len(attempts)
        self._settle(attempts, report)

    def check_attempt(self, attempt_id: str) -> RoundReport:
        """The same recovery steps for one attempt (a follower uses this when no supervisor runs)."""
        from .db.engine import session_scope
        from .db.models import RunAttempt

        report = RoundReport()
        with session_scope(self.rt.engine, write=False) as session:
            attempt = session.get(RunAttempt, attempt_id)
        if attempt is None or attempt.runtime_owner != self.rt.node_id or self.rt.consumer is None:
            return report
        if attempt.status in ATTEMPT_ACTIVE:
            report.attempts_touched = 1
            self._settle([attempt], report)
        elif attempt.status == "blocked":
            self._consume(attempt.id, report)
        return report

    def _settle(self, attempts: list[Any], report: RoundReport) -> None:
        exited: list[Any] = []
        for attempt in attempts:
            self._ensure_journal(attempt, report)
            if self._consume(attempt.id, report):
                continue
            state = self._identity(attempt)
            if state is IdentityState.RUNNING:
                report.counts["still_running"] += 1
            elif state is IdentityState.EXITED:
                exited.append(attempt)
            elif state is IdentityState.UNVERIFIABLE:
                reason = "RECOVERY_NO_DURABLE_HANDLE" if attempt.pid is None else "RECOVERY_IDENTITY_UNVERIFIABLE"
                if self.rt.completion.mark_blocked(attempt.id, reason).status == "blocked":
                    report.counts["blocked"] += 1
            else:
                report.counts["still_starting"] += 1
        if exited:
            # One bounded grace for the whole batch: a launcher may be between exit and link().
            time.sleep(self.profile.publish_grace_ms / 1000)
            for attempt in exited:
                if not self._consume(attempt.id, report):
                    self._end_without_receipt(attempt, report)

    def _identity(self, attempt: Any) -> IdentityState | None:
        if attempt.pid is None:
            if now_ms() - attempt.created_at_ms < SPAWN_GRACE_MS:
                return None  # its host may be between spawn and the handle commit
            return IdentityState.UNVERIFIABLE
        assert self.rt.executor is not None
        return self.rt.executor.inspect({"boot_id": attempt.boot_id, "pid": attempt.pid, "pgid": attempt.pgid,
                                         "start_time": attempt.process_start_time})

    def _consume(self, attempt_id: str, report: RoundReport) -> bool:
        """True when the receipt settled the attempt (or must be retried): no identity check then."""
        assert self.rt.consumer is not None
        result = self.rt.consumer.consume(attempt_id)
        if result.outcome is ConsumeOutcome.MISSING:
            return False
        if result.outcome is ConsumeOutcome.QUARANTINED:
            report.counts["quarantined"] += 1
            return False  # a bad receipt proves nothing: identity decides, a later valid one still wins
        if result.outcome is ConsumeOutcome.RETRY:
            report.counts["retry"] += 1
            return True
        report.counts[str(result.outcome)] += 1
        if result.outcome is ConsumeOutcome.APPLIED and result.status in ("timed_out", "cancelled"):
            report.counts[result.status] += 1
        return True

    def _end_without_receipt(self, attempt: Any, report: RoundReport) -> None:
        from .db.engine import session_scope
        from .db.models import CancellationDispatch, Run

        with session_scope(self.rt.engine, write=False) as session:
            run = session.get(Run, attempt.run_id)
            dispatch = session.get(CancellationDispatch, attempt.run_id)
        signalled = (dispatch is not None and dispatch.attempt_id == attempt.id
                     and dispatch.term_sent_at_ms is not None)
        if run is not None and run.cancel_reason is not None and signalled:
            status = "timed_out" if run.cancel_reason == "timeout" else "cancelled"
            reason = run.cancel_reason
        else:
            status, reason = "lost", LOST_REASON
        result = self.rt.completion.end_without_receipt(attempt.id, status=status, reason=reason)
        if str(result.outcome) == "applied":
            report.counts[status] += 1
            logger.info("attempt {} ended {} ({})", attempt.id, status, reason)
        else:
            report.counts["already_terminal"] += 1

    def _ensure_journal(self, attempt: Any, report: RoundReport) -> None:
        """Attempts from before the journal existed get their row (idempotent back-registration)."""
        from .db.engine import session_scope

        with session_scope(self.rt.engine, write=False) as session:
            if self.rt.journal.get(session, attempt.id) is not None:
                return
        with session_scope(self.rt.engine) as session:
            if self.rt.journal.register(session, run_id=attempt.run_id, attempt_id=attempt.id,
                                        receipt_ref=self.rt.receipts.relative_ref(attempt.id), now_ms=now_ms()):
                report.counts["journal_registered"] += 1

    # -- step 4: the journal -------------------------------------------------------------
    def _journal(self, report: RoundReport) -> None:
        from .db.engine import session_scope
        from .db.models import CompletionReceiptJournal, RunAttempt

        now = now_ms()
        for row in self._pages(CompletionReceiptJournal, "attempt_id", [], "journal_cursor"):
            report.journal_touched += 1
            with session_scope(self.rt.engine, write=False) as session:
                attempt = session.get(RunAttempt, row.attempt_id)
            status = attempt.status if attempt is not None else None
            if status in ATTEMPT_ACTIVE:
                continue  # step 3 owns active attempts
            if row.state == "quarantined":
                self._expire_quarantine(row, status, now, report)
                continue
            # Terminal (or blocked, or unknown) attempt: a receipt left behind is replayed and cleaned.
            outcome = self.rt.consumer.consume(row.attempt_id)  # type: ignore[union-attr]
            if outcome.outcome is not ConsumeOutcome.MISSING:
                report.counts[str(outcome.outcome)] += 1
                continue
            if status == "blocked":
                continue
            self._expire_missing(row, now, report)

    def _expire_missing(self, row: Any, now: int, report: RoundReport) -> None:
        from .db.engine import session_scope

        window = int(self.profile.terminal_journal_retention_s * 1000)
        with session_scope(self.rt.engine) as session:
            if row.terminal_seen_at_ms is None:
                self.rt.journal.mark_terminal_seen(session, row.attempt_id, now)
            elif now - row.terminal_seen_at_ms >= window:
                if self.rt.journal.resolve(session, row.attempt_id):
                    report.counts["journal_purged"] += 1

    def _expire_quarantine(self, row: Any, status: str | None, now: int, report: RoundReport) -> None:
        from .db.engine import session_scope
        from .db.models import CompletionReceiptJournal

        if now - row.updated_at_ms < int(self.profile.quarantine_retention_s * 1000):
            return
        assert self.rt.receipts is not None
        if self.rt.receipts.purge_quarantined(row.attempt_id):
            report.counts["quarantine_purged"] += 1
        with session_scope(self.rt.engine) as session:
            if status in RUN_TERMINAL or status is None:
                self.rt.journal.resolve(session, row.attempt_id)
            else:
                live = session.get(CompletionReceiptJournal, row.attempt_id)
                if live is not None:
                    live.state, live.updated_at_ms = "pending", now
