"""Part 1 of the journal contract: runs, attempts and events (:class:`~ql_core.ports.journal.RunJournal`).

The create commit (read back through every part: it writes the journal row and the log artifact
too), decided transitions with compare-and-set and numbered events, reads, the recovery pages.
"""

from __future__ import annotations

import threading

import pytest

from ql_core.ids import new_id
from ql_core.ports.journal import EventSpec, JournalBackend, RunningCreate, Snapshot, StoreError, Transition

from .journal_support import OTHER, OWNER, JournalFixtures, new_run, retrying

__all__ = ["RunJournalContract"]


class RunJournalContract(JournalFixtures):
    """Runs and events. Subclass and provide ``make_backend(tmp_path: Path)``."""

    # -- create --------------------------------------------------------------------------
    def test_create_writes_run_attempt_log_journal_and_event_together(self, store: JournalBackend) -> None:
        new = new_run(name="nightly", deadline_at_ms=10**13)
        events = store.create(new)
        assert [(e.run_id, e.seq, e.type, e.attempt_id) for e in events] == [
            (new.run_id, 1, "run.created", new.attempt_id)]
        view = store.view(new.run_id)
        assert view is not None and (view.status, view.name, view.deadline_at_ms) == ("queued", "nightly", 10**13)
        assert [(a.attempt_id, a.status, a.executor) for a in view.attempts] == [
            (new.attempt_id, "starting", "test-executor")]
        attempt = store.attempt(new.attempt_id)
        assert attempt is not None and attempt.runtime_owner == OWNER and attempt.handle is None
        assert attempt.callback_sequence == 0 and attempt.callback_token_hash == new.callback_token_hash
        assert [e.type for e in store.events(new.run_id) or []] == ["run.created"]
        entry = store.journal_entry(new.attempt_id)
        assert entry is not None and (entry.state, entry.receipt_ref) == ("pending", new.receipt_ref)
        assert entry.attempt_status == "starting" and entry.attempt_owner == OWNER
        facts = store.log_facts(new.log_artifact_id)
        assert facts is not None and (facts.attempt_id, facts.max_bytes, facts.truncated) == (
            new.attempt_id, 1 << 20, False)

    # -- create with a standby task's handle (optional: RunningCreate) ------------------------
    @staticmethod
    def _running_create(store: JournalBackend) -> RunningCreate:
        if not isinstance(store, RunningCreate):
            pytest.skip("this backend has no create_running (standby tasks then take the classic path)")
        return store

    def test_create_running_writes_the_run_running_with_its_handle_in_one_commit(self, store: JournalBackend) -> None:
        running = self._running_create(store)
        new = new_run(deadline_at_ms=10**13)
        events = running.create_running(new, handle='{"h":1}')
        assert [(e.seq, e.type, e.attempt_id, e.status) for e in events] == [
            (1, "run.created", new.attempt_id, None), (2, "attempt.spawned", new.attempt_id, "running")]
        view = store.view(new.run_id)
        assert view is not None and (view.status, view.deadline_at_ms) == ("running", 10**13)
        attempt = store.attempt(new.attempt_id)
        assert attempt is not None and (attempt.status, attempt.handle) == ("running", '{"h":1}')
        assert attempt.started_at_ms == new.created_at_ms and attempt.callback_sequence == 0
        assert [(e.seq, e.type) for e in store.events(new.run_id) or []] == [(1, "run.created"),
                                                                            (2, "attempt.spawned")]
        run = store.run(new.run_id)
        assert run is not None and run.event_seq == 2
        entry = store.journal_entry(new.attempt_id)
        assert entry is not None and (entry.state, entry.attempt_status) == ("pending", "running")
        assert store.log_facts(new.log_artifact_id) is not None
        # It pages as an active attempt, and the next event is numbered after both.
        assert [a.id for a in store.page_active_attempts(OWNER, "", 10)] == [new.attempt_id]
        _result, more = store.transition(new.attempt_id, lambda snap: (None, Transition(
            events=(EventSpec("attempt.note", attempt_id=new.attempt_id),))))
        assert [e.seq for e in more] == [3]

    def test_create_running_is_all_or_nothing(self, store: JournalBackend) -> None:
        running = self._running_create(store)
        new = new_run()
        store.create(new)
        clash = new._replace(attempt_id=new_id(), log_artifact_id=new_id())  # same run id: refused
        with pytest.raises(StoreError):
            running.create_running(clash, handle='{"h":2}')
        assert store.attempt(clash.attempt_id) is None and store.log_facts(clash.log_artifact_id) is None
        assert [e.type for e in store.events(new.run_id) or []] == ["run.created"]

    def test_create_is_all_or_nothing(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        clash = new._replace(attempt_id=new_id(), log_artifact_id=new_id())  # same run id: refused
        with pytest.raises(StoreError):
            store.create(clash)
        assert store.attempt(clash.attempt_id) is None
        assert [a.attempt_id for a in store.view(new.run_id).attempts] == [new.attempt_id]  # type: ignore[union-attr]
        assert [e.type for e in store.events(new.run_id) or []] == ["run.created"]

    def test_unknown_ids_read_as_none_and_reads_never_write(self, store: JournalBackend) -> None:
        assert store.view(new_id()) is None and store.run(new_id()) is None and store.attempt(new_id()) is None
        assert store.events(new_id()) is None
        assert store.list_views(status=None, limit=10) == []

    def test_list_views_newest_first_with_limit_and_status(self, store: JournalBackend) -> None:
        made = [new_run(created_at_ms=1_000 + i) for i in range(5)]
        for new in made:
            store.create(new)
        assert [v.run_id for v in store.list_views(status=None, limit=3)] == [m.run_id for m in made[::-1][:3]]
        assert [v.run_id for v in store.list_views(status="queued", limit=10)] == [m.run_id for m in made[::-1]]
        assert store.list_views(status="failed", limit=10) == []

    # -- decided transitions ----------------------------------------------------------------
    def test_a_transition_sees_the_snapshot_and_applies_with_numbered_events(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        seen: list[Snapshot] = []

        def decide(snap: Snapshot) -> tuple[str, Transition | None]:
            seen.append(snap)
            return "ok", Transition(attempt={"status": "running", "handle": '{"h":1}', "started_at_ms": 5},
                                    run={"status": "running"},
                                    events=(EventSpec("attempt.spawned", attempt_id=new.attempt_id, status="running"),
                                            EventSpec("test.second", reason="R")))

        result, events = store.transition(new.attempt_id, decide)
        assert result == "ok" and [(e.seq, e.type) for e in events] == [(2, "attempt.spawned"), (3, "test.second")]
        snap = seen[0]
        assert snap.attempt is not None and snap.attempt.id == new.attempt_id and snap.attempt.status == "starting"
        assert snap.run is not None and snap.run.id == new.run_id and snap.run.event_seq == 1
        assert snap.signalled is False and snap.has_dispatch is False and snap.now_ms > 0
        attempt = store.attempt(new.attempt_id)
        assert attempt is not None and (attempt.status, attempt.handle, attempt.started_at_ms) == (
            "running", '{"h":1}', 5)
        assert attempt.version == snap.attempt.version + 1
        run = store.run(new.run_id)
        assert run is not None and (run.status, run.event_seq) == ("running", 3) and run.version == snap.run.version + 1
        stored = store.events(new.run_id) or []
        assert [(e.seq, e.type, e.reason) for e in stored] == [(1, "run.created", None), (2, "attempt.spawned", None),
                                                               (3, "test.second", "R")]

    def test_a_batch_of_transitions_is_one_atomic_transaction(self, store: JournalBackend) -> None:
        """Only for stores with :class:`~ql_core.ports.journal.BatchTransitions`: all or nothing, in order."""
        from ql_core.ports.journal import BatchTransitions

        if not isinstance(store, BatchTransitions):
            pytest.skip("this store has no batch transitions: core makes one transaction each")
        first, second = new_run(), new_run()
        store.create(first)
        store.create(second)

        def running(snap: Snapshot) -> tuple[str, Transition | None]:
            assert snap.attempt is not None
            return snap.attempt.id, Transition(attempt={"status": "running"}, run={"status": "running"},
                                               events=(EventSpec("attempt.spawned", attempt_id=snap.attempt.id),))

        def broken(snap: Snapshot) -> tuple[str, Transition | None]:
            return "x", Transition(attempt={"runtime_owner": "me"})  # refused: rolls back the batch

        with pytest.raises(StoreError):
            store.transition_many([(first.attempt_id, running), (second.attempt_id, broken)])
        assert store.attempt(first.attempt_id).status == "starting"  # type: ignore[union-attr]
        assert [e.type for e in store.events(first.run_id) or []] == ["run.created"]
        done = store.transition_many([(first.attempt_id, running), (second.attempt_id, running),
                                      (new_id(), lambda snap: ("none", None))])
        assert [result for result, _events in done] == [first.attempt_id, second.attempt_id, "none"]
        assert [[(e.seq, e.type) for e in events] for _r, events in done] == [
            [(2, "attempt.spawned")], [(2, "attempt.spawned")], []]
        assert store.attempt(second.attempt_id).status == "running"  # type: ignore[union-attr]

    def test_no_transition_writes_nothing(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        before = (store.run(new.run_id), store.attempt(new.attempt_id), store.events(new.run_id))
        assert store.transition(new.attempt_id, lambda snap: ("nothing", None)) == ("nothing", [])
        assert (store.run(new.run_id), store.attempt(new.attempt_id), store.events(new.run_id)) == before

    def test_unknown_ids_give_an_empty_snapshot(self, store: JournalBackend) -> None:
        snaps: list[Snapshot] = []
        store.transition(new_id(), lambda snap: (snaps.append(snap), None))
        store.run_transition(new_id(), lambda snap: (snaps.append(snap), None))
        assert [(s.run, s.attempt) for s in snaps] == [(None, None), (None, None)]

    def test_a_columns_outside_the_protocol_is_refused(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        with pytest.raises(StoreError):
            store.transition(new.attempt_id, lambda snap: (None, Transition(attempt={"runtime_owner": "me"})))
        with pytest.raises(StoreError):
            store.transition(new.attempt_id, lambda snap: (None, Transition(run={"version": 99})))
        assert store.attempt(new.attempt_id).runtime_owner == OWNER  # type: ignore[union-attr]

    def test_concurrent_transitions_never_lose_or_duplicate_an_event(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        n, barrier = 8, threading.Barrier(8)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                barrier.wait()
                retrying(lambda: store.run_transition(new.run_id, lambda snap: (None, Transition(
                    events=(EventSpec(f"test.{i}"),)))))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        events = store.events(new.run_id) or []
        assert [e.seq for e in events] == list(range(1, n + 2))
        assert sorted(e.type for e in events[1:]) == sorted(f"test.{i}" for i in range(n))
        assert store.run(new.run_id).event_seq == n + 1  # type: ignore[union-attr]

    # -- paging ---------------------------------------------------------------------------------
    def test_active_attempts_page_by_cursor_owner_and_limit(self, store: JournalBackend) -> None:
        mine = [new_run() for _ in range(7)]
        for new in mine + [new_run(owner=OTHER) for _ in range(3)]:
            store.create(new)
        seen, cursor = [], ""
        while True:
            page = store.page_active_attempts(OWNER, cursor, 3)
            assert len(page) <= 3 and [a.id for a in page] == sorted(a.id for a in page)
            if not page:
                break
            assert all(a.id > cursor and a.runtime_owner == OWNER for a in page)
            seen += [a.id for a in page]
            cursor = page[-1].id
        assert seen == sorted(n.attempt_id for n in mine)

    def test_due_deadlines_only_passed_current_and_without_intent(self, store: JournalBackend) -> None:
        due, later, foreign, cancelled = (new_run(deadline_at_ms=100), new_run(deadline_at_ms=10**13),
                                          new_run(deadline_at_ms=100, owner=OTHER), new_run(deadline_at_ms=100))
        for new in (due, later, foreign, cancelled):
            store.create(new)
        store.run_transition(cancelled.run_id, lambda snap: (None, Transition(
            run={"cancel_reason": "user", "cancel_requested_at_ms": 1})))
        assert store.due_deadlines(OWNER, 1_000, 10) == [due.run_id]
        assert store.due_deadlines(OWNER, 50, 10) == []
