"""ADR-0007 §6 gate 9: every scan round is hard-capped, resumes from a cursor, and fails closed.

Rows are inserted directly with SQLModel into the real, migrated SQLite file; identities are real
(/proc): a live sleeper process (→ running), a reaped child's pid with an impossible start time
(→ exited), a corrupt handle (→ unverifiable).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import pytest
from tests.recovery.recovery_support import attempt_row, count_rows, dead_handle, insert_attempts, statuses, unverifiable_handle

from ql_core.reconciler import CursorStuckError, Reconciler


class Recording(Reconciler):
    """A reconciler that records every page it was given (the pages themselves come from SQLite)."""

    def __init__(self, rt: Any) -> None:
        super().__init__(rt)
        self.attempt_pages: list[list[str]] = []
        self.journal_pages: list[list[str]] = []

    def _fetch_attempts(self, cursor: str, limit: int) -> list[Any]:
        rows = super()._fetch_attempts(cursor, limit)
        self.attempt_pages.append([r.id for r in rows])
        return rows

    def _fetch_journal(self, cursor: str, limit: int) -> list[Any]:
        rows = super()._fetch_journal(cursor, limit)
        self.journal_pages.append([r.attempt_id for r in rows])
        return rows


def test_round_is_capped_and_resumes_from_the_cursor(rt_factory, sleeper_handle: dict) -> None:
    rt = rt_factory(page_size=3, pages_per_round=2, publish_grace_ms=0)
    inserted = insert_attempts(rt, 20, handle=sleeper_handle)
    rec = Recording(rt)

    seen: list[str] = []
    cursors = []
    for _ in range(4):
        report = rec.round()
        assert report.attempts_touched <= 6 and report.journal_touched <= 6
        cursors.append(report.attempt_cursor)
    seen = [i for page in rec.attempt_pages for i in page]
    # 6 + 6 + 6 + 2: every attempt exactly once, in id order, then the cursor wraps.
    assert seen == sorted(inserted.attempt_ids)
    assert cursors[:3] == [seen[5], seen[11], seen[17]] and cursors[3] == ""
    assert all(len(page) <= 3 for page in rec.attempt_pages)
    # The next round starts over from the beginning.
    rec.attempt_pages.clear()
    rec.round()
    assert rec.attempt_pages[0] == seen[:3]


def test_full_pass_rounds_are_bounded_by_the_larger_phase(rt_factory, sleeper_handle: dict) -> None:
    """A pass does not spin until both cursors happen to wrap together: each phase runs until it wrapped."""
    rt = rt_factory(page_size=2, pages_per_round=1, publish_grace_ms=0)
    insert_attempts(rt, 5, handle=sleeper_handle)              # 5 active attempts: 3 rounds to wrap
    ended = insert_attempts(rt, 4, handle=dead_handle())       # they end lost below → journal rows only
    Reconciler(rt.node).full_pass()
    assert set(statuses(rt, ended.run_ids).values()) == {"lost"}
    rec = Recording(rt)
    total, rounds = rec.full_pass()
    # Phases of 5 active attempts (2+2+1) and 9 journal rows (2+2+2+2+1): max(3, 5) rounds, not lcm.
    assert rounds == 5
    assert total.attempts_touched == 5 and total.journal_touched == 9
    assert total.counts["still_running"] == 5


def test_ten_thousand_active_attempts_stay_bounded(rt_factory, sleeper_handle: dict) -> None:
    rt = rt_factory(page_size=64, pages_per_round=4, publish_grace_ms=0)
    cap = 64 * 4
    running = insert_attempts(rt, 9_600, handle=sleeper_handle)
    exited = insert_attempts(rt, 300, handle=dead_handle())
    unverifiable = insert_attempts(rt, 100, handle=unverifiable_handle())
    total = 10_000

    rec = Recording(rt)
    report = rec.round()
    assert report.attempts_touched == cap and report.journal_touched == cap
    assert sum(len(p) for p in rec.attempt_pages) == cap
    first_cursor = report.attempt_cursor
    assert first_cursor == rec.attempt_pages[-1][-1]

    # Successive rounds resume from the cursor: the second round starts right after the first.
    rec.attempt_pages.clear()
    second = rec.round()
    assert rec.attempt_pages[0][0] > first_cursor and second.attempts_touched == cap

    # A full pass finishes in ceil(total / cap) + 1 rounds, each within the cap.
    rec2 = Recording(rt)
    started = time.monotonic()
    pass_report, rounds = rec2.full_pass()
    elapsed = time.monotonic() - started
    assert rounds <= math.ceil(total / cap) + 1
    assert all(len(p) <= 64 for p in rec2.attempt_pages + rec2.journal_pages)
    assert len(rec2.attempt_pages) <= 4 * rounds
    assert elapsed < 120  # (a liveness guard, not a benchmark)

    assert set(statuses(rt, exited.run_ids).values()) == {"lost"}
    assert set(statuses(rt, running.run_ids).values()) == {"running"}
    assert count_rows(rt, "ql_run_attempt", "status = 'blocked'") == 100
    assert count_rows(rt, "ql_run_attempt", "status = 'running'") == 9_600
    assert count_rows(rt, "ql_run_attempt", "status = 'lost'") == 300
    assert set(statuses(rt, unverifiable.run_ids).values()) == {"running"}  # blocked attempt: run not ended


def test_deadline_and_dispatch_steps_are_capped(rt_factory) -> None:
    rt = rt_factory(page_size=4, pages_per_round=2, publish_grace_ms=0)
    past = int(time.time() * 1000) - 1_000
    inserted = insert_attempts(rt, 30, handle=dead_handle(), deadline_at_ms=past)
    rec = Reconciler(rt.node)
    reports = [rec.round() for _ in range(8)]
    assert reports[0].counts["timeouts_requested"] == 8
    for report in reports:
        assert report.counts["timeouts_requested"] <= 8
        assert sum(v for k, v in report.counts.items() if k.startswith("dispatch_")) <= 8
        assert report.attempts_touched <= 8
    Reconciler(rt.node).full_pass()
    # The handles name no live process: the dispatcher sent nothing, so no intent's state can be
    # claimed — every run ends lost (exited without receipt), never timed_out.
    assert set(statuses(rt, inserted.run_ids).values()) == {"lost"}
    assert count_rows(rt, "ql_cancel_dispatch", "term_sent_at_ms IS NOT NULL") == 0


def test_cursor_that_does_not_advance_fails_closed(rt_factory, sleeper_handle: dict) -> None:
    rt = rt_factory(page_size=3, pages_per_round=4)
    insert_attempts(rt, 10, handle=sleeper_handle)

    class Stuck(Reconciler):
        def _fetch_attempts(self, cursor: str, limit: int) -> list[Any]:
            return super()._fetch_attempts("", limit)  # ignores the cursor: the same page again

    stuck = Stuck(rt)
    with pytest.raises(CursorStuckError):
        stuck.round()
    with pytest.raises(CursorStuckError):
        stuck.full_pass(max_rounds=5)

    class Unordered(Reconciler):
        def _fetch_journal(self, cursor: str, limit: int) -> list[Any]:
            return list(reversed(super()._fetch_journal(cursor, limit)))

    with pytest.raises(CursorStuckError):
        Unordered(rt).round()


def test_unverifiable_and_handle_less_attempts_fail_closed(rt_factory, sleeper_handle: dict) -> None:
    """No signal and no guess: unverifiable → blocked; no handle → its host's identity decides.

    A handle-less ``starting`` attempt whose host lives is left to it however old it is; whose host is
    gone provably never started (tasks are held until their handle is committed) → lost; whose host
    cannot be identified is left alone for the spawn grace, then blocked — never ended by a timer.
    """
    rt = rt_factory(publish_grace_ms=0)
    old = int(time.time() * 1000) - 60_000
    unverifiable = insert_attempts(rt, 2, handle=unverifiable_handle())
    fresh = insert_attempts(rt, 2, handle=None, status="starting")
    host_alive = insert_attempts(rt, 2, handle=None, status="starting", created_at_ms=old,
                                 host_handle=sleeper_handle)
    host_gone = insert_attempts(rt, 2, handle=None, status="starting", created_at_ms=old,
                                host_handle=dead_handle())
    host_unknown = insert_attempts(rt, 2, handle=None, status="starting", created_at_ms=old)

    report, _ = Reconciler(rt.node).full_pass()
    assert report.counts["blocked"] == 4 and report.counts["still_starting"] == 4
    assert report.counts["lost"] == 2

    def outcome(attempt_id: str) -> tuple[str, str | None]:
        row = attempt_row(rt, attempt_id)
        return row.status, row.reason

    assert {outcome(a) for a in unverifiable.attempt_ids} == {("blocked", "RECOVERY_IDENTITY_UNVERIFIABLE")}
    assert {outcome(a) for a in host_unknown.attempt_ids} == {("blocked", "RECOVERY_NO_DURABLE_HANDLE")}
    assert {outcome(a) for a in host_gone.attempt_ids} == {("lost", "RECOVERY_NEVER_STARTED")}
    assert set(statuses(rt, fresh.run_ids + host_alive.run_ids).values()) == {"queued"}  # hosts may spawn
    assert count_rows(rt, "ql_run_attempt", "status = 'starting'") == 4
    # Nothing was signalled and the blocked runs stay open: only a receipt can still end them.
    assert set(statuses(rt, unverifiable.run_ids + host_unknown.run_ids).values()) <= {"running", "queued"}
