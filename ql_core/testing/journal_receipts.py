"""Part 2 of the journal contract: the receipt journal (:class:`~ql_core.ports.journal.ReceiptJournal`).

Rows written ``pending`` by the create commit, their retention clock, the consumed hint that drops a
row only inside a later write, quarantine decisions, back-registration and resolution.
"""

from __future__ import annotations

from ql_core.ids import new_id
from ql_core.ports.journal import EventSpec, JournalBackend, Transition

from .journal_support import OWNER, JournalFixtures, new_run

__all__ = ["ReceiptJournalContract"]


class ReceiptJournalContract(JournalFixtures):
    """The receipt journal. Subclass and provide ``make_backend(tmp_path: Path)``."""

    def test_a_terminal_transition_starts_the_journal_rows_clock(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        store.transition(new.attempt_id, lambda snap: (None, Transition(
            attempt={"status": "failed", "exit_code": 3, "finished_at_ms": 9},
            run={"status": "failed", "exit_code": 3, "finished_at_ms": 9},
            events=(EventSpec("attempt.failed"), EventSpec("run.failed")), terminal=True)))
        entry = store.journal_entry(new.attempt_id)
        assert entry is not None and entry.terminal_seen_at_ms is not None and entry.attempt_status == "failed"

    def test_journal_pages_carry_their_attempts(self, store: JournalBackend) -> None:
        made = [new_run() for _ in range(5)]
        for new in made:
            store.create(new)
        page = store.page_journal("", 2)
        assert [e.attempt_id for e in page] == sorted(n.attempt_id for n in made)[:2]
        rest = store.page_journal(page[-1].attempt_id, 10)
        assert len(rest) == 3 and all(e.attempt_status == "starting" and e.attempt_owner == OWNER for e in rest)

    # -- journal rows ----------------------------------------------------------------------------
    def test_noted_rows_go_with_the_next_create_never_before(self, store: JournalBackend) -> None:
        first = new_run()
        store.create(first)
        store.note_consumed(first.attempt_id)
        assert store.journal_entry(first.attempt_id) is not None  # only a hint so far
        store.create(new_run())
        assert store.journal_entry(first.attempt_id) is None

    def test_quarantine_keeps_its_first_decision_and_requeue_is_compare_and_set(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        assert store.mark_quarantined(new.attempt_id, "wrong_token", 1_000)
        assert store.mark_quarantined(new.attempt_id, "codec:x", 2_000)
        entry = store.journal_entry(new.attempt_id)
        assert entry is not None and (entry.state, entry.quarantine_reason, entry.updated_at_ms) == (
            "quarantined", "wrong_token", 1_000)
        assert not store.mark_quarantined(new_id(), "x", 1)  # no row: not ours to judge
        assert not store.requeue_quarantined(new.attempt_id, 999, 3_000)
        assert store.requeue_quarantined(new.attempt_id, 1_000, 3_000)
        assert store.journal_entry(new.attempt_id).state == "pending"  # type: ignore[union-attr]

    def test_terminal_seen_once_resolve_and_back_registration(self, store: JournalBackend) -> None:
        a, b = new_run(), new_run()
        store.create(a)
        store.create(b)
        store.mark_terminal_seen([a.attempt_id], 5)
        store.mark_terminal_seen([a.attempt_id], 9)
        assert store.journal_entry(a.attempt_id).terminal_seen_at_ms == 5  # type: ignore[union-attr]
        assert store.resolve([a.attempt_id, b.attempt_id, new_id()]) == 2
        assert store.journal_entry(a.attempt_id) is None
        assert store.register_journal({a.attempt_id: (a.run_id, a.receipt_ref)}, 7) == 1
        assert store.register_journal({a.attempt_id: (a.run_id, a.receipt_ref)}, 8) == 0  # idempotent
        assert store.journal_entry(a.attempt_id).registered_at_ms == 7  # type: ignore[union-attr]

    def test_an_unknown_journal_row_reads_as_none(self, store: JournalBackend) -> None:
        assert store.journal_entry(new_id()) is None and store.page_journal("", 10) == []
