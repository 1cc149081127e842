"""Every completion answer; fencing never changes a run; clamping; replays."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from ql_plugins.cluster_fenced import CompletionAnswer, EndAnswer, EndStatus, LeaseAnswer, completion_digest
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres


def test_applied_then_exact_replay_then_other_payload(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    finished = cluster.now()
    first = cluster.complete(fence, 0, finished_at_ms=finished)
    assert (first.answer, first.status) == (CompletionAnswer.APPLIED, "succeeded")
    events = cluster.events(run_id)
    assert [e["type"] for e in events] == ["run.created", "attempt.claimed", "attempt.spawned",
                                           "attempt.succeeded", "run.succeeded"]
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0  # erased at the end
    lease = cluster.lease(claimed.attempt_id)
    assert (lease["status"], lease["end_reason"]) == ("ended", "completed")
    state = cluster.state(run_id)
    # The same completion again (its COMMIT's answer was lost): already_completed, nothing written.
    for _ in range(3):
        again = cluster.complete(fence, 0, finished_at_ms=finished)
        assert (again.answer, again.status) == (CompletionAnswer.ALREADY_COMPLETED, "succeeded")
    assert cluster.state(run_id) == state and len(cluster.events(run_id)) == 5
    # Another payload for the same attempt: already_terminal and one late-callback event at most.
    for _ in range(2):
        other = cluster.complete(fence, 1, finished_at_ms=finished)
        assert (other.answer, other.status) == (CompletionAnswer.ALREADY_TERMINAL, "succeeded")
    assert cluster.state(run_id) == state
    assert cluster.event_types(run_id)[5:] == ["attempt.late_callback_ignored"]


def _assert_fenced(cluster: Cluster, run_id: str, fence, reason: str, *, exit_code: int = 0) -> None:
    state = cluster.state(run_id)
    n = len(cluster.events(run_id))
    for _ in range(2):  # a replayed fenced completion is audited once
        result = cluster.complete(fence, exit_code, finished_at_ms=1_000)
        assert (result.answer, result.fence_reason, result.status) == (CompletionAnswer.FENCED, reason, None)
    assert cluster.state(run_id) == state  # never a state change of run, attempt or lease
    audit = cluster.events(run_id)[n:]
    assert [(e["type"], e["reason"], e["exit_code"]) for e in audit] == [
        ("attempt.completion_fenced", reason, exit_code)]
    assert audit[0]["dedupe_key"].startswith(f"fenced:{fence.attempt_id}:")


def test_stale_worker_generation_is_fenced_with_an_audit_event(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    old = cluster.worker("w1")
    claimed, fence = cluster.running_attempt(old)
    new = cluster.db.register("w1", str(uuid.uuid4()), slots=8, ql_version="0.test").worker
    assert new.generation == old.generation + 1
    _assert_fenced(cluster, run_id, fence, "STALE_WORKER_GENERATION")
    # The new process of the same id cannot complete the old process's lease either.
    _assert_fenced(cluster, run_id, dataclasses.replace(fence, worker_generation=new.generation,
                                                         session=new.session), "STALE_WORKER_GENERATION",
                   exit_code=7)
    assert cluster.db.renew(fence).answer is LeaseAnswer.FENCED


def test_stale_lease_generation_wrong_token_and_another_worker_are_fenced(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker("w1")
    other = cluster.worker("w2")
    claimed, fence = cluster.running_attempt(w)
    _assert_fenced(cluster, run_id, dataclasses.replace(fence, lease_generation=fence.lease_generation - 1),
                   "STALE_LEASE_GENERATION")
    _assert_fenced(cluster, run_id, dataclasses.replace(fence, lease_token="A" * 64), "WRONG_TOKEN", exit_code=1)
    _assert_fenced(cluster, run_id, dataclasses.replace(fence, worker_id=other.worker_id,
                                                         worker_generation=other.generation,
                                                         session=other.session), "WRONG_WORKER", exit_code=2)
    # The real holder still completes.
    assert cluster.complete(fence, 0).answer is CompletionAnswer.APPLIED


def test_a_previous_attempts_lease_cannot_complete_the_new_attempt(cluster: Cluster) -> None:
    """ABA: the run was re-claimed; the old lease's fence names the old attempt and is fenced, and
    the old token/generation presented for the new attempt are fenced too."""
    (run_id,) = cluster.submit(max_attempts=2)
    w = cluster.worker()
    first, old_fence = cluster.running_attempt(w)
    cluster.expire(first.attempt_id)
    assert cluster.db.sweep().retried == 1
    second, new_fence = cluster.running_attempt(w)
    assert second.run_id == run_id and second.attempt_no == 2
    _assert_fenced(cluster, run_id, old_fence, "LEASE_EXPIRED")
    _assert_fenced(cluster, run_id, dataclasses.replace(old_fence, attempt_id=second.attempt_id),
                   "STALE_LEASE_GENERATION", exit_code=3)
    assert cluster.complete(new_fence, 0).answer is CompletionAnswer.APPLIED
    assert cluster.run(run_id)["status"] == "succeeded"


def test_expired_lease_is_fenced_even_before_the_sweeper_ran(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    cluster.expire(claimed.attempt_id)
    _assert_fenced(cluster, run_id, fence, "LEASE_EXPIRED")
    assert cluster.attempt(claimed.attempt_id)["status"] == "running"
    assert cluster.db.sweep().lost == 1
    assert cluster.run(run_id)["status"] == "lost"
    result = cluster.complete(fence, 0, finished_at_ms=1_000)  # same payload: still fenced, audited once
    assert (result.answer, result.fence_reason) == (CompletionAnswer.FENCED, "LEASE_EXPIRED")
    assert cluster.event_types(run_id).count("attempt.completion_fenced") == 1


def test_completion_of_a_never_started_attempt_is_fenced(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    _assert_fenced(cluster, run_id, claimed.fence(w), "NOT_STARTED")


def test_unknown_attempt_is_fenced_without_writing(cluster: Cluster) -> None:
    from ql_core.ids import new_id

    w = cluster.worker()
    cluster.submit()
    (claimed,) = cluster.claim(w)
    fence = dataclasses.replace(claimed.fence(w), attempt_id=new_id())
    result = cluster.complete(fence, 0)
    assert (result.answer, result.fence_reason) == (CompletionAnswer.FENCED, "UNKNOWN_ATTEMPT")


def test_worker_times_are_clamped_to_the_database_clock(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    result = cluster.complete(fence, 0, finished_at_ms=cluster.now() + 3_600_000)  # an hour ahead
    assert result.answer is CompletionAnswer.APPLIED
    finished = cluster.attempt(claimed.attempt_id)["finished_at_ms"]
    assert result.db_now_ms - 1000 <= finished <= result.db_now_ms
    assert cluster.run(run_id)["finished_at_ms"] == finished

    (run2,) = cluster.submit()
    c2, f2 = cluster.running_attempt(w)
    started = cluster.attempt(c2.attempt_id)["started_at_ms"]
    ahead = cluster.now() + 200_000  # within 5 minutes: kept
    assert cluster.complete(f2, 0, finished_at_ms=ahead).answer is CompletionAnswer.APPLIED
    assert cluster.attempt(c2.attempt_id)["finished_at_ms"] == ahead

    (run3,) = cluster.submit()
    c3, f3 = cluster.running_attempt(w, started_at_ms=cluster.now())
    started = cluster.attempt(c3.attempt_id)["started_at_ms"]
    assert cluster.complete(f3, 0, finished_at_ms=5).answer is CompletionAnswer.APPLIED  # far in the past
    assert cluster.attempt(c3.attempt_id)["finished_at_ms"] == started  # never before its start


def test_completion_without_running_report_takes_its_deadline_from_the_reported_start(cluster: Cluster) -> None:
    """The worker spawned but crashed before ql_running committed; its outbox completes later."""
    (run_id,) = cluster.submit(timeout_ms=1_000)
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    assert cluster.db.start(fence).answer is LeaseAnswer.OK
    t = cluster.now()  # not before the claim: a reported start is never earlier than the attempt
    result = cluster.complete(fence, 0, started_at_ms=t, finished_at_ms=t + 2_000)
    assert (result.answer, result.status, result.reason) == (CompletionAnswer.APPLIED, "timed_out", "timeout")
    assert cluster.run(run_id)["deadline_at_ms"] == t + 1_000
    (run2,) = cluster.submit(timeout_ms=10_000)
    (c2,) = cluster.claim(w)
    f2 = c2.fence(w)
    cluster.db.start(f2)
    t = cluster.now()
    assert cluster.complete(f2, 0, started_at_ms=t, finished_at_ms=t + 2_000).status == "succeeded"


def test_end_without_completion_lost_and_replays(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    result = cluster.db.end_without_completion(fence, status=EndStatus.LOST)
    assert (result.answer, result.outcome) == (EndAnswer.APPLIED, "lost")
    attempt = cluster.attempt(claimed.attempt_id)
    assert (attempt["status"], attempt["reason"]) == ("lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT")
    assert cluster.db.end_without_completion(fence, status=EndStatus.LOST).answer is EndAnswer.ALREADY_ENDED
    # A receipt that shows up afterwards is a late callback, not a second terminal state.
    late = cluster.complete(fence, 0)
    assert (late.answer, late.status) == (CompletionAnswer.ALREADY_TERMINAL, "lost")
    assert cluster.run(run_id)["status"] == "lost"


def test_end_without_completion_lost_retries_when_the_policy_allows(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(max_attempts=2)
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    result = cluster.db.end_without_completion(fence, status=EndStatus.LOST, reason="EXECUTOR_GONE")
    assert (result.answer, result.outcome) == (EndAnswer.APPLIED, "requeued")
    assert cluster.run(run_id)["status"] == "queued"
    assert cluster.event_types(run_id)[-2:] == ["attempt.lost", "run.requeued"]
    c2, f2 = cluster.running_attempt(w)
    assert c2.attempt_no == 2
    assert cluster.db.end_without_completion(f2, status=EndStatus.LOST).outcome == "lost"


def test_end_without_completion_lost_after_a_delivered_and_signalled_intent(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(max_attempts=3)
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    cluster.db.request_cancel(run_id, "user")
    assert cluster.db.renew(fence).intents.cancel_reason == "user"
    result = cluster.db.end_without_completion(fence, status=EndStatus.LOST, signalled=True)
    assert (result.answer, result.outcome) == (EndAnswer.APPLIED, "cancelled")
    assert cluster.run(run_id)["reason"] == "user"


def test_release_hands_unstarted_attempts_back_and_refuses_running_ones(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    assert cluster.db.end_without_completion(fence, status=EndStatus.LOST).answer is EndAnswer.REFUSED
    released = cluster.db.end_without_completion(fence, status=EndStatus.RELEASED)
    assert (released.answer, released.outcome) == (EndAnswer.APPLIED, "requeued")
    assert cluster.db.end_without_completion(fence, status=EndStatus.RELEASED).answer is EndAnswer.ALREADY_ENDED
    assert cluster.db.start(fence).answer is LeaseAnswer.FENCED
    assert cluster.run(run_id)["status"] == "queued"
    # Released twice (claimed, then starting): no retry consumed with max_attempts = 1.
    (c2,) = cluster.claim(w)
    f2 = c2.fence(w)
    cluster.db.start(f2)
    assert cluster.db.end_without_completion(f2, status="released").outcome == "requeued"
    c3, f3 = cluster.running_attempt(w)
    assert c3.attempt_no == 3
    refused = cluster.db.end_without_completion(f3, status=EndStatus.RELEASED)
    assert (refused.answer, refused.fence_reason) == (EndAnswer.REFUSED, "RUNNING")
    assert cluster.complete(f3, 0).answer is CompletionAnswer.APPLIED


def test_completion_digest_covers_every_field() -> None:
    base = dict(exit_code=0, started_at_ms=1, finished_at_ms=2, signalled=False)
    d = completion_digest("a", **base)
    assert len(d) == 64 and d == completion_digest("a", **base)
    for key, value in (("exit_code", 1), ("started_at_ms", 3), ("finished_at_ms", 4), ("signalled", True)):
        assert completion_digest("a", **{**base, key: value}) != d
    assert completion_digest("b", **base) != d
