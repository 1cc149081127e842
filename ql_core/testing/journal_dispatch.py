"""Part 3 of the journal contract: cancel dispatch (:class:`~ql_core.ports.journal.CancelDispatch`).

The record a transition inserts once, the ``signalled`` flag later snapshots see, the lease fenced
by the record's version, the due page by owner.
"""

from __future__ import annotations

import pytest

from ql_core.ids import new_id
from ql_core.ports.journal import JournalBackend, Snapshot, StoreError, Transition
from ql_core.records import NewDispatch, NewRun

from .journal_support import OTHER, OWNER, JournalFixtures, new_run

__all__ = ["CancelDispatchContract"]


class CancelDispatchContract(JournalFixtures):
    """Cancel dispatch. Subclass and provide ``make_backend(tmp_path: Path)``."""

    def test_a_cancel_dispatch_is_inserted_once_and_signalled_is_seen(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        dispatch = NewDispatch(attempt_id=new.attempt_id, reason="user", due_at_ms=0)
        for _ in range(2):
            store.run_transition(new.run_id, lambda snap: (None, Transition(dispatch=dispatch)))
        record = store.dispatch(new.run_id)
        assert record is not None and (record.attempt_id, record.state, record.version) == (
            new.attempt_id, "pending", 1)
        claim = store.claim_dispatch(new.run_id, OWNER, 60_000)
        assert claim is not None
        assert store.finish_dispatch(claim, {"state": "term_sent", "term_sent_at_ms": claim.now_ms})
        snaps: list[Snapshot] = []
        store.transition(new.attempt_id, lambda snap: (snaps.append(snap), None))
        assert snaps[0].signalled is True and snaps[0].has_dispatch is True

    def _with_dispatch(self, store: JournalBackend, owner: str = OWNER) -> NewRun:
        new = new_run(owner=owner)
        store.create(new)
        dispatch = NewDispatch(attempt_id=new.attempt_id, reason="user", due_at_ms=0)
        store.run_transition(new.run_id, lambda snap: (None, Transition(
            run={"cancel_reason": "user", "cancel_requested_at_ms": 1}, dispatch=dispatch)))
        return new

    def test_a_dispatch_lease_is_exclusive_and_fenced_by_version(self, store: JournalBackend) -> None:
        new = self._with_dispatch(store)
        claim = store.claim_dispatch(new.run_id, OWNER, 60_000)
        assert claim is not None and claim.record.lease_owner == OWNER
        assert store.claim_dispatch(new.run_id, OWNER, 60_000) is None  # held
        stale = claim._replace(record=claim.record._replace(version=claim.record.version - 1))
        assert not store.finish_dispatch(stale, {"state": "done"})
        assert store.finish_dispatch(claim, {"state": "done", "outcome": "already_exited"})
        record = store.dispatch(new.run_id)
        assert record is not None and (record.state, record.outcome, record.lease_owner) == (
            "done", "already_exited", None)
        assert store.claim_dispatch(new.run_id, OWNER, 60_000) is None  # done: never claimed again

    def test_due_dispatches_select_only_the_owners(self, store: JournalBackend) -> None:
        ours, theirs = self._with_dispatch(store), self._with_dispatch(store, owner=OTHER)
        assert store.due_dispatches(OWNER, 10) == [ours.run_id]
        assert store.due_dispatches(OTHER, 10) == [theirs.run_id]

    def test_finish_refuses_columns_outside_the_protocol(self, store: JournalBackend) -> None:
        new = self._with_dispatch(store)
        claim = store.claim_dispatch(new.run_id, OWNER, 60_000)
        assert claim is not None
        with pytest.raises(StoreError):
            store.finish_dispatch(claim, {"attempt_id": new_id()})

    def test_an_unknown_dispatch_reads_as_none(self, store: JournalBackend) -> None:
        assert store.dispatch(new_id()) is None and store.due_dispatches(OWNER, 10) == []
        assert store.claim_dispatch(new_id(), OWNER, 60_000) is None
