"""The completion-receipt journal (ADR-0007 §2.5, §5): which attempts may have a receipt.

It stores only a state (``pending`` / ``quarantined``), the receipt's relative
reference and a retention clock — never run state. Rows are written in the
caller's transaction, so the ``edge-sqlite`` backend registers an attempt in
the same commit that creates it (no spawn without a journal row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlmodel import Session

    from .db.models import CompletionReceiptJournal

__all__ = ["SqlReceiptJournal", "JOURNAL_PENDING", "JOURNAL_QUARANTINED"]

JOURNAL_PENDING = "pending"
JOURNAL_QUARANTINED = "quarantined"


@dataclass
class SqlReceiptJournal:
    """Journal rows in the run database (table ``ql_receipt_journal``)."""

    name: str = "edge-sqlite"

    def register(self, session: Session, *, run_id: str, attempt_id: str, receipt_ref: str, now_ms: int) -> bool:
        """Register an attempt as possibly having a receipt; idempotent. True if a row was added."""
        from .db.models import CompletionReceiptJournal

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
        """The receipt was consumed and deleted after its commit: drop the row."""
        from sqlalchemy import delete

        from .db.models import CompletionReceiptJournal

        result = session.execute(delete(CompletionReceiptJournal).where(
            CompletionReceiptJournal.attempt_id == attempt_id))
        return result.rowcount == 1

    def mark_quarantined(self, session: Session, attempt_id: str, reason: str, now_ms: int) -> None:
        """Persist the quarantine decision *before* the file moves."""
        from sqlalchemy import update

        from .db.models import CompletionReceiptJournal

        session.execute(update(CompletionReceiptJournal)
                        .where(CompletionReceiptJournal.attempt_id == attempt_id)
                        .values(state=JOURNAL_QUARANTINED, quarantine_reason=reason[:40], updated_at_ms=now_ms))

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
