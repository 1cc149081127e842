"""The completion-receipt journal (ADR-0007 §2.5, §5): which attempts may have a receipt.

It stores only a state (``pending`` / ``quarantined``), the receipt's relative
reference and a retention clock — never run state. Rows are written in the
caller's transaction, so the ``edge-sqlite`` backend registers an attempt in
the same commit that creates it (no spawn without a journal row).

Life of a row (DESIGN.md §3.6 — three commits per task, none of them for the journal alone):

1. *create* commit: :meth:`SqlReceiptJournal.register` adds it (``pending``);
2. *terminal* commit: :func:`mark_terminal` starts its retention clock
   (``terminal_seen_at_ms``) in the CompletionService's own transaction;
3. after that commit the consumer deletes the receipt file and only *notes* the
   attempt in memory (:meth:`SqlReceiptJournal.note_consumed`); the row is
   deleted in the next journal write this runtime makes anyway (the next
   create), or — if the process ends first — by the reconciler's retention,
   which purges a terminal row only once it has seen its receipt missing.

So a row never disappears while its receipt may still exist: it is deleted
either after the file is gone (noted) or after the reconciler found no file.
A ``quarantined`` row outlives a later successful completion: it keeps the
quarantined copy on the retention clock, which purges both.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlmodel import Session

    from .db.models import CompletionReceiptJournal

__all__ = ["SqlReceiptJournal", "JOURNAL_PENDING", "JOURNAL_QUARANTINED", "mark_terminal",
           "MAX_NOTED", "FLUSH_BATCH"]

JOURNAL_PENDING = "pending"
JOURNAL_QUARANTINED = "quarantined"
#: Consumed attempts remembered in memory at most (beyond that, retention purges their rows).
MAX_NOTED = 4096
#: Noted rows deleted per piggybacked flush (keeps the host's create transaction small).
FLUSH_BATCH = 256


def mark_terminal(session: Session, attempt_id: str, now_ms: int) -> None:
    """In the terminal transaction: start the row's retention clock (once; no-op without a row)."""
    from sqlalchemy import update

    from .db.models import CompletionReceiptJournal

    session.execute(update(CompletionReceiptJournal)
                    .where(CompletionReceiptJournal.attempt_id == attempt_id,
                           CompletionReceiptJournal.terminal_seen_at_ms.is_(None))  # type: ignore[union-attr]
                    .values(terminal_seen_at_ms=now_ms)
                    .execution_options(synchronize_session=False))


@dataclass
class SqlReceiptJournal:
    """Journal rows in the run database (table ``ql_receipt_journal``)."""

    name: str = "edge-sqlite"
    #: Attempts whose receipt was deleted after their terminal commit, rows not yet deleted.
    _noted: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    # -- consumed rows: deleted in a later write, never in a commit of their own --------
    def note_consumed(self, attempt_id: str) -> None:
        """The attempt's receipt was deleted after its terminal commit: drop the row later.

        Only a hint: losing it (process exit, full set, rolled-back flush) just
        leaves the row to the reconciler's retention.
        """
        with self._lock:
            if len(self._noted) < MAX_NOTED:
                self._noted.add(attempt_id)

    def noted(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._noted)

    def flush_consumed(self, session: Session) -> int:
        """Delete up to :data:`FLUSH_BATCH` noted ``pending`` rows in the caller's transaction."""
        from sqlalchemy import delete

        from .db.models import CompletionReceiptJournal

        with self._lock:
            batch = sorted(self._noted)[:FLUSH_BATCH]
            self._noted.difference_update(batch)
        if not batch:
            return 0
        result = session.execute(
            delete(CompletionReceiptJournal)
            .where(CompletionReceiptJournal.attempt_id.in_(batch),  # type: ignore[attr-defined]
                   CompletionReceiptJournal.state == JOURNAL_PENDING)
            .execution_options(synchronize_session=False))
        return int(result.rowcount or 0)

    def register(self, session: Session, *, run_id: str, attempt_id: str, receipt_ref: str, now_ms: int) -> bool:
        """Register an attempt as possibly having a receipt; idempotent. True if a row was added.

        Rows noted as consumed are deleted in the same transaction (piggyback: no extra commit).
        """
        from .db.models import CompletionReceiptJournal

        self.flush_consumed(session)
        if session.get(CompletionReceiptJournal, attempt_id) is not None:
            return False
        session.add(CompletionReceiptJournal(attempt_id=attempt_id, run_id=run_id, state=JOURNAL_PENDING,
                                             receipt_ref=receipt_ref, registered_at_ms=now_ms, updated_at_ms=now_ms))
        session.flush()
        return True

    def get(self, session: Session, attempt_id: str) -> CompletionReceiptJournal | None:
        from .db.models import CompletionReceiptJournal

        return session.get(CompletionReceiptJournal, attempt_id)

    def resolve(self, session: Session, attempt_id: str) -> bool:
        """Drop the row (its receipt is gone and the attempt ended); noted rows go along."""
        from sqlalchemy import delete

        from .db.models import CompletionReceiptJournal

        with self._lock:
            self._noted.discard(attempt_id)
        self.flush_consumed(session)
        result = session.execute(delete(CompletionReceiptJournal).where(
            CompletionReceiptJournal.attempt_id == attempt_id))
        return result.rowcount == 1

    def mark_quarantined(self, session: Session, attempt_id: str, reason: str, now_ms: int) -> None:
        """Persist the quarantine decision *before* the file moves.

        A row that is already ``quarantined`` keeps its first decision and its
        clock: the quarantine slot still holds that file (a re-run after a crash
        before the move, or a second bad file that cannot take the slot), and
        its retention window counts from when it was quarantined — refreshing it
        every round would keep the copy forever.
        """
        from sqlalchemy import update

        from .db.models import CompletionReceiptJournal

        session.execute(update(CompletionReceiptJournal)
                        .where(CompletionReceiptJournal.attempt_id == attempt_id,
                               CompletionReceiptJournal.state != JOURNAL_QUARANTINED)
                        .values(state=JOURNAL_QUARANTINED, quarantine_reason=reason[:40], updated_at_ms=now_ms)
                        .execution_options(synchronize_session=False))

    def mark_terminal_seen(self, session: Session, attempt_id: str, now_ms: int) -> None:
        """Start the retention clock of a terminal attempt whose receipt is missing (once)."""
        from sqlalchemy import update

        from .db.models import CompletionReceiptJournal

        session.execute(update(CompletionReceiptJournal)
                        .where(CompletionReceiptJournal.attempt_id == attempt_id,
                               CompletionReceiptJournal.terminal_seen_at_ms.is_(None))  # type: ignore[union-attr]
                        .values(terminal_seen_at_ms=now_ms))

    def page(self, session: Session, *, after: str, limit: int) -> list[CompletionReceiptJournal]:
        """Journal rows with attempt_id > ``after``, in id order (stable cursor)."""
        from sqlmodel import select

        from .db.models import CompletionReceiptJournal

        stmt = (select(CompletionReceiptJournal).where(CompletionReceiptJournal.attempt_id > after)
                .order_by(CompletionReceiptJournal.attempt_id).limit(limit))
        return list(session.exec(stmt))
