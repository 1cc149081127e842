"""The worker's parts that stand alone: the renewal rule and the held attempts (no PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql_plugins.cluster_fenced.fence_guard import renew_due_at
from ql_plugins.cluster_fenced.held_attempts import Held, HeldAttempts
from ql_plugins.cluster_fenced.results import LeaseFence
from ql_plugins.cluster_fenced.worker_tables import WorkerLeases


@pytest.mark.parametrize(("sent", "own_deadline", "ttl_s", "due"), [
    (100.0, 100.0 + 30 - 5, 30.0, 112.5),   # a fresh lease: half way to its own deadline
    (100.0, 140.0, 30.0, 115.0),            # a deadline further than a lease: half a lease after the call
    (100.0, 110.0, 30.0, 105.0),            # an answer that did not extend it: half way to the deadline
    (100.0, 99.0, 30.0, 100.0),             # already past its own deadline: renew at once
])
def test_a_renewal_is_due_at_latest_half_way_to_the_own_deadline(sent: float, own_deadline: float,
                                                                 ttl_s: float, due: float) -> None:
    assert renew_due_at(sent, own_deadline, ttl_s) == pytest.approx(due)
    assert renew_due_at(sent, own_deadline, ttl_s) <= sent + max(0.0, own_deadline - sent) / 2


def _fence(attempt_id: str) -> LeaseFence:
    return LeaseFence("w1", 1, "session-1", attempt_id, 1, "token-" + attempt_id)


def test_forgetting_an_attempt_answers_its_row_and_drops_it(tmp_path: Path) -> None:
    leases = WorkerLeases(tmp_path / "worker.db")
    try:
        held = HeldAttempts(leases)
        leases.insert_claimed([(_fence("a1"), "r1"), (_fence("a2"), "r2")])
        first, second = Held(fence=_fence("a1"), run_id="r1"), Held(fence=_fence("a2"), run_id="r2", state="running")
        held.add(first)
        held.add(second)
        held.outbox_next["a1"] = 5.0
        assert held.live_processes() == 2

        held.forget(first, "fenced")

        row = leases.get("a1")
        assert row is not None and row.state == "answered" and row.answer == "fenced"
        assert held.get("a1") is None and "a1" not in held.outbox_next
        assert held.select() == [second]
        second.ended = True
        assert held.live_processes() == 0
    finally:
        leases.close()
