"""The promises a journal backend (the run store) makes to core (:mod:`ql_core.ports.journal`).

One suite per part of the port — :class:`RunJournalContract`, :class:`ReceiptJournalContract`,
:class:`CancelDispatchContract`, :class:`LogLedgerContract` — and :class:`JournalBackendContract`,
the whole: every part's tests, plus what only a whole store can promise (it is every part, and it
forgets history across all of them when it offers :class:`~ql_core.ports.journal.HistoryRetention`).

Subclass a suite and provide ``make_backend(tmp_path)`` returning a fresh, empty, migrated backend.
Every test goes through the protocol only (create, transitions decided by small ``decide``
functions, reads, paging, journal rows, dispatch leases, log facts); concurrency is real threads on
the same backend. A part's suite creates its rows with the run part's ``create`` and
``transition`` (every row hangs off a run), so a store written part by part runs
:class:`RunJournalContract` first, then each part's suite as it lands, then the whole.
"""

from __future__ import annotations

import pytest

from ql_core.ports.journal import JOURNAL_PARTS, EventSpec, JournalBackend, Transition

from .journal_dispatch import CancelDispatchContract
from .journal_logs import LogLedgerContract
from .journal_receipts import ReceiptJournalContract
from .journal_runs import RunJournalContract
from .journal_support import OWNER, new_run

__all__ = ["JournalBackendContract", "RunJournalContract", "ReceiptJournalContract", "CancelDispatchContract",
           "LogLedgerContract", "new_run"]


class JournalBackendContract(RunJournalContract, ReceiptJournalContract, CancelDispatchContract, LogLedgerContract):
    """The whole run store: every part's suite, and the promises across parts.
    Subclass and provide ``make_backend(tmp_path: Path) -> JournalBackend``."""

    def test_the_backend_is_every_part_of_the_port(self, store: JournalBackend) -> None:
        missing = [part.__name__ for part in JOURNAL_PARTS if not isinstance(store, part)]
        assert missing == [] and isinstance(store, JournalBackend)
        assert isinstance(store.name, str) and store.name

    # -- history retention (stores with the HistoryRetention capability) ---------------------------
    def test_history_by_count_and_age_pages_terminal_runs_and_keeps_totals(self, store: JournalBackend) -> None:
        from ql_core.ports.journal import HistoryRetention

        if not isinstance(store, HistoryRetention):
            pytest.skip("this store keeps history forever (no HistoryRetention)")
        made = [new_run(created_at_ms=1_000 + i) for i in range(6)]
        for new in made:
            store.create(new)
            store.resolve([new.attempt_id])  # its receipt was consumed: no journal row
        for new in made[1:]:  # the oldest stays non-terminal: never a candidate
            store.transition(new.attempt_id, lambda snap: (None, Transition(
                attempt={"status": "succeeded", "exit_code": 0, "finished_at_ms": snap.now_ms},
                run={"status": "succeeded", "exit_code": 0, "finished_at_ms": snap.now_ms},
                events=(EventSpec("attempt.succeeded"), EventSpec("run.succeeded")), terminal=True)))
            store.record_log_sizes({new.log_artifact_id: 10})
        assert store.ended_log_bytes(OWNER) == 50
        # By count: 6 runs, keep 3 -> the 3 oldest are in excess; the non-terminal one is stepped over.
        found = store.history_candidates(OWNER, finished_before_ms=0, keep_newest=3, limit=10)
        assert set(found) == {made[1].run_id, made[2].run_id}
        assert found[made[1].run_id] == [made[1].log_artifact_id]
        assert store.purge_runs(list(found) + [made[0].run_id]) == 2  # the live one is refused
        assert store.view(made[0].run_id) is not None and store.view(made[1].run_id) is None
        assert store.ended_log_bytes(OWNER) == 30  # the purged logs left the total
        assert store.history_candidates(OWNER, finished_before_ms=0, keep_newest=4, limit=10) == {}
        # By age: every terminal run finished before the cutoff, oldest first, at most `limit`.
        by_age = store.history_candidates(OWNER, finished_before_ms=10**15, keep_newest=10**6, limit=2)
        assert len(by_age) == 2 and set(by_age) <= {m.run_id for m in made[3:]}
        assert store.purge_runs(list(by_age)) == 2
        assert len(store.list_views(status=None, limit=10)) == 2  # the live one and one terminal run
        assert store.view(made[0].run_id) is not None
        assert store.ended_log_bytes(OWNER) == 10
