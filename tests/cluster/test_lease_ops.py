"""start / running / renew only under a live lease; intents reach the holder; cancel paths."""

from __future__ import annotations

import dataclasses
import time

import pytest

from ql_plugins.cluster_fenced import CancelAnswer, LeaseAnswer
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres


def test_start_then_running_sets_states_event_and_deadline(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(timeout_ms=60_000)
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    started = cluster.db.start(fence)
    assert started.answer is LeaseAnswer.OK and started.intents.deadline_at_ms is None
    assert cluster.lease(claimed.attempt_id)["status"] == "starting"
    assert cluster.db.start(fence).answer is LeaseAnswer.OK  # replay: no change
    assert cluster.lease(claimed.attempt_id)["version"] == 2
    t0 = cluster.now()
    running = cluster.db.running(fence, started_at_ms=t0 - 5)
    assert running.answer is LeaseAnswer.OK
    assert running.intents.deadline_at_ms == running.db_now_ms + 60_000
    attempt = cluster.attempt(claimed.attempt_id)
    # The reported start, never earlier than the attempt's creation (a busy machine may claim < 5 ms before t0).
    assert (attempt["status"], attempt["started_at_ms"], attempt["deadline_at_ms"]) == (
        "running", max(t0 - 5, attempt["created_at_ms"]), running.intents.deadline_at_ms)
    assert cluster.run(run_id)["deadline_at_ms"] == running.intents.deadline_at_ms
    assert cluster.event_types(run_id) == ["run.created", "attempt.claimed", "attempt.spawned"]
    again = cluster.db.running(fence, started_at_ms=t0)  # replay after a lost answer
    assert again.answer is LeaseAnswer.OK and again.intents.deadline_at_ms == running.intents.deadline_at_ms
    assert cluster.event_types(run_id).count("attempt.spawned") == 1


def test_running_start_time_is_clamped_to_the_database_clock(cluster: Cluster) -> None:
    cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    cluster.db.start(fence)
    r = cluster.db.running(fence, started_at_ms=cluster.now() + 3_600_000)
    started = cluster.attempt(claimed.attempt_id)["started_at_ms"]
    assert r.db_now_ms - 1000 <= started <= r.db_now_ms


def test_running_before_start_is_fenced(cluster: Cluster) -> None:
    cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    result = cluster.db.running(claimed.fence(w), started_at_ms=0)
    assert (result.answer, result.reason) == (LeaseAnswer.FENCED, "NOT_STARTED")
    assert cluster.attempt(claimed.attempt_id)["status"] == "starting"


@pytest.mark.parametrize("bad", ["token", "lease_generation", "worker_generation", "worker_id", "session"])
def test_start_with_a_wrong_fence_is_fenced(cluster: Cluster, bad: str) -> None:
    cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    wrong = {"token": dataclasses.replace(fence, lease_token="x" * 64),
             "lease_generation": dataclasses.replace(fence, lease_generation=fence.lease_generation + 1),
             "worker_generation": dataclasses.replace(fence, worker_generation=fence.worker_generation + 1),
             "worker_id": dataclasses.replace(fence, worker_id="w9"),
             "session": dataclasses.replace(fence, session="00000000-0000-4000-8000-000000000000")}[bad]
    before = cluster.lease(claimed.attempt_id)
    for call in (cluster.db.start, cluster.db.renew):
        assert call(wrong).answer is LeaseAnswer.FENCED
    assert cluster.lease(claimed.attempt_id) == before


def test_start_renew_and_running_after_expiry_are_fenced_and_never_revive(cluster: Cluster) -> None:
    cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    cluster.expire(claimed.attempt_id)
    for result in (cluster.db.start(fence), cluster.db.renew(fence)):
        assert (result.answer, result.reason) == (LeaseAnswer.FENCED, "LEASE_EXPIRED")
    assert cluster.lease(claimed.attempt_id)["status"] == "claimed"


def test_a_real_one_second_lease_expires_by_the_database_clock(cluster: Cluster) -> None:
    cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w, lease_ttl_ms=1000)
    fence = claimed.fence(w)
    assert cluster.db.start(fence).answer is LeaseAnswer.OK
    deadline = time.monotonic() + 10
    while cluster.now() <= claimed.lease_expires_at_ms and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.db.renew(fence).answer is LeaseAnswer.FENCED


def test_renew_extends_the_lease_and_returns_the_intents(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(timeout_ms=120_000)
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    renewed = cluster.db.renew(fence, ttl_ms=20_000)
    assert renewed.answer is LeaseAnswer.OK
    assert renewed.lease_expires_at_ms == renewed.db_now_ms + 20_000 == cluster.lease(claimed.attempt_id)["expires_at_ms"]
    assert renewed.intents.cancel_reason is None and renewed.intents.deadline_at_ms is not None
    assert cluster.lease(claimed.attempt_id)["intent_delivered_at_ms"] is None
    cancel = cluster.db.request_cancel(run_id, "user")
    assert cancel.answer is CancelAnswer.REQUESTED
    renewed = cluster.db.renew(fence)
    assert renewed.intents.cancel_reason == "user"
    assert renewed.intents.cancel_requested_at_ms == cluster.run(run_id)["cancel_requested_at_ms"]
    delivered = cluster.lease(claimed.attempt_id)["intent_delivered_at_ms"]
    assert delivered is not None
    cluster.db.renew(fence)
    assert cluster.lease(claimed.attempt_id)["intent_delivered_at_ms"] == delivered  # first delivery kept
    assert cluster.db.request_cancel(run_id, "policy").answer is CancelAnswer.ALREADY_REQUESTED
    assert cluster.event_types(run_id).count("run.cancel_requested") == 1


def test_cancel_of_a_queued_run_ends_it_at_once(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    result = cluster.db.request_cancel(run_id, "user")
    assert (result.answer, result.status) == (CancelAnswer.CANCELLED, "cancelled")
    assert cluster.event_types(run_id) == ["run.created", "run.cancel_requested", "run.cancelled"]
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0
    assert cluster.db.request_cancel(run_id, "user").answer is CancelAnswer.ALREADY_TERMINAL
    assert len(cluster.events(run_id)) == 3  # a cancel after the terminal commit is a no-op
    from ql_core.ids import new_id

    assert cluster.db.request_cancel(new_id(), "user").answer is CancelAnswer.NOT_FOUND


def test_cancel_while_claimed_ends_the_never_started_attempt_and_fences_start(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    assert cluster.db.request_cancel(run_id, "shutdown").answer is CancelAnswer.CANCELLED
    start = cluster.db.start(claimed.fence(w))
    assert (start.answer, start.reason) == (LeaseAnswer.FENCED, "LEASE_ENDED")
    assert cluster.attempt(claimed.attempt_id)["status"] == "cancelled"
    assert cluster.run(run_id)["reason"] == "shutdown"
    assert cluster.event_types(run_id)[-3:] == ["run.cancel_requested", "attempt.cancelled", "run.cancelled"]


def test_start_hands_over_an_intent_committed_before_it(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    cluster.db.start(fence)
    assert cluster.db.request_cancel(run_id, "user").answer is CancelAnswer.REQUESTED  # may have spawned
    running = cluster.db.running(fence, started_at_ms=0)
    assert running.answer is LeaseAnswer.OK and running.intents.cancel_reason == "user"
