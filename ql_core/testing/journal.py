"""The promises a journal backend (the run store) makes to core (:mod:`ql_core.ports.journal`).

Subclass :class:`JournalBackendContract` and provide ``make_backend(tmp_path)``
returning a fresh, empty, migrated backend. Every test goes through the
protocol only (create, transitions decided by small ``decide`` functions,
reads, paging, journal rows, dispatch leases, log facts); concurrency is real
threads on the same backend.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from ql_core.ids import new_id
from ql_core.ports.journal import (
    ConflictError,
    EventSpec,
    JournalBackend,
    Snapshot,
    StoreBusyError,
    RunningCreate,
    StoreError,
    Transition,
)
from ql_core.records import NewDispatch, NewRun

__all__ = ["JournalBackendContract", "new_run"]

OWNER = "01a00000-0000-7000-8000-00000000000a"
OTHER = "01a00000-0000-7000-8000-00000000000b"


def new_run(*, owner: str = OWNER, deadline_at_ms: int | None = None, created_at_ms: int | None = None,
            name: str | None = None, executor: str = "test-executor") -> NewRun:
    """A NewRun with fresh ids (what core's create commit hands the backend)."""
    run_id, attempt_id, log_id = new_id(), new_id(), new_id()
    return NewRun(run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id, name=name, executor=executor,
                  runtime_owner=owner, callback_token_hash="0" * 64,
                  created_at_ms=created_at_ms if created_at_ms is not None else time.time_ns() // 1_000_000,
                  deadline_at_ms=deadline_at_ms, log_relative_path=f"{log_id[-2:]}/{log_id}.log",
                  log_max_bytes=1 << 20, receipt_ref=f"{attempt_id[-2:]}/{attempt_id}.json")


def _retrying(call: Callable[[], Any], tries: int = 200) -> Any:
    for _ in range(tries):
        try:
            return call()
        except (ConflictError, StoreBusyError):
            time.sleep(0.002)
    raise AssertionError("still conflicting after many tries")


class JournalBackendContract:
    """Subclass and provide ``make_backend(tmp_path: Path) -> JournalBackend``."""

    @pytest.fixture
    def make_backend(self) -> Callable[[Path], JournalBackend]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide a make_backend fixture")

    @pytest.fixture
    def store(self, make_backend: Callable[[Path], JournalBackend], tmp_path: Path) -> Any:
        backend = make_backend(tmp_path)
        yield backend
        backend.close()

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

    def test_unknown_ids_read_as_none_and_reads_never_write(self, store: JournalBackend) -> None:
        assert store.view(new_id()) is None and store.run(new_id()) is None and store.attempt(new_id()) is None
        assert store.events(new_id()) is None and store.journal_entry(new_id()) is None
        assert store.log_facts(new_id()) is None and store.dispatch(new_id()) is None
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

    def test_a_terminal_transition_starts_the_journal_rows_clock(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        store.transition(new.attempt_id, lambda snap: (None, Transition(
            attempt={"status": "failed", "exit_code": 3, "finished_at_ms": 9},
            run={"status": "failed", "exit_code": 3, "finished_at_ms": 9},
            events=(EventSpec("attempt.failed"), EventSpec("run.failed")), terminal=True)))
        entry = store.journal_entry(new.attempt_id)
        assert entry is not None and entry.terminal_seen_at_ms is not None and entry.attempt_status == "failed"

    def test_concurrent_transitions_never_lose_or_duplicate_an_event(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        n, barrier = 8, threading.Barrier(8)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                barrier.wait()
                _retrying(lambda: store.run_transition(new.run_id, lambda snap: (None, Transition(
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

    # -- cancellation dispatch leases ---------------------------------------------------------------
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

    # -- log facts -------------------------------------------------------------------------------
    def test_log_truncation_is_recorded_once_with_its_event(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        event = EventSpec("log.truncated", attempt_id=new.attempt_id, reason="LOG_MAX_BYTES")
        first = store.mark_log_truncated(new.log_artifact_id, event)
        assert [(e.type, e.seq, e.reason) for e in first] == [("log.truncated", 2, "LOG_MAX_BYTES")]
        assert store.mark_log_truncated(new.log_artifact_id, event) == []
        assert store.log_facts(new.log_artifact_id).truncated is True  # type: ignore[union-attr]

    def test_log_pages_sizes_and_deletion(self, store: JournalBackend) -> None:
        live, ended = new_run(created_at_ms=1_000), new_run(created_at_ms=2_000)
        for new in (live, ended):
            store.create(new)
        store.transition(ended.attempt_id, lambda snap: (None, Transition(
            attempt={"status": "succeeded", "exit_code": 0}, run={"status": "succeeded", "exit_code": 0},
            events=(EventSpec("attempt.succeeded"), EventSpec("run.succeeded")), terminal=True)))
        assert [f.id for f in store.page_live_logs(OWNER, "", 10)] == [live.log_artifact_id]
        assert [f.id for f in store.ended_logs(OWNER, unsized=True, limit=10)] == [ended.log_artifact_id]
        store.record_log_sizes({ended.log_artifact_id: 77})
        assert store.ended_logs(OWNER, unsized=True, limit=10) == []
        assert [f.size_bytes for f in store.ended_logs(OWNER, sized=True, limit=10)] == [77]
        assert store.ended_log_bytes(OWNER) == 77
        assert [f.id for f in store.ended_logs(OWNER, created_before_ms=3_000, limit=10)] == [ended.log_artifact_id]
        assert store.ended_logs(OWNER, created_before_ms=1_500, limit=10) == []
        store.mark_log_deleted(ended.log_artifact_id, 4_000, 77)
        assert store.log_facts(ended.log_artifact_id).deleted  # type: ignore[union-attr]
        assert store.ended_log_bytes(OWNER) == 0 and store.ended_logs(OWNER, sized=True, limit=10) == []

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
