"""ql_sweep (a)–(d), its bounds, and parallel sweepers that never double-act."""

from __future__ import annotations

import threading

import pytest

from ql_plugins.cluster_fenced import CompletionAnswer, LeaseAnswer, SweepCounts
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres


def test_a_expired_claim_goes_back_to_the_queue_without_consuming_a_retry(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(max_attempts=1)
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    assert cluster.db.sweep().acted == 0  # not expired yet
    cluster.expire(claimed.attempt_id)
    counts = cluster.db.sweep()
    assert (counts.requeued, counts.lost, counts.retried) == (1, 0, 0)
    run = cluster.run(run_id)
    assert (run["status"], run["current_attempt_id"]) == ("queued", None)
    attempt = cluster.attempt(claimed.attempt_id)
    assert (attempt["status"], attempt["reason"]) == ("lost", "CLAIM_EXPIRED")
    assert cluster.event_types(run_id)[-2:] == ["attempt.lost", "run.requeued"]
    assert cluster.lease(claimed.attempt_id)["end_reason"] == "expired"
    assert cluster.db.start(claimed.fence(w)).answer is LeaseAnswer.FENCED
    # Never started, so max_attempts = 1 still allows the real attempt.
    second, fence = cluster.running_attempt(w)
    assert (second.run_id, second.attempt_no) == (run_id, 2)
    assert cluster.complete(fence, 0).answer is CompletionAnswer.APPLIED
    assert cluster.db.sweep().acted == 0


def test_b_expired_started_lease_is_lost_without_retry_policy(cluster: Cluster) -> None:
    runs = cluster.submit(2, max_attempts=1)
    w = cluster.worker()
    (c1,) = cluster.claim(w)
    cluster.db.start(c1.fence(w))  # starting: may have spawned
    c2, _ = cluster.running_attempt(w)
    cluster.expire(c1.attempt_id)
    cluster.expire(c2.attempt_id)
    counts = cluster.db.sweep()
    assert (counts.requeued, counts.lost, counts.retried) == (0, 2, 0)
    assert {c1.run_id, c2.run_id} == set(runs)
    for run_id, attempt_id in ((c1.run_id, c1.attempt_id), (c2.run_id, c2.attempt_id)):
        run, attempt = cluster.run(run_id), cluster.attempt(attempt_id)
        assert (run["status"], run["reason"]) == ("lost", "LEASE_EXPIRED")
        assert (attempt["status"], attempt["reason"]) == ("lost", "LEASE_EXPIRED")
        assert cluster.event_types(run_id)[-2:] == ["attempt.lost", "run.lost"]
    assert cluster.db.sweep().acted == 0


def test_b_expired_lease_with_retries_creates_exactly_one_new_attempt(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(max_attempts=2)
    w = cluster.worker()
    c1, _ = cluster.running_attempt(w)
    cluster.expire(c1.attempt_id)
    assert cluster.db.sweep().retried == 1
    assert cluster.run(run_id)["status"] == "queued"
    assert cluster.event_types(run_id)[-2:] == ["attempt.lost", "run.requeued"]
    assert cluster.db.sweep().acted == 0
    c2, _ = cluster.running_attempt(w)
    assert cluster.claim(w) == []  # exactly one new attempt
    assert [a["attempt_no"] for a in cluster.attempts(run_id)] == [1, 2]
    cluster.expire(c2.attempt_id)
    counts = cluster.db.sweep()
    assert (counts.retried, counts.lost) == (0, 1)  # the policy is used up
    assert cluster.run(run_id)["status"] == "lost"


def test_b_no_retry_when_a_cancel_intent_is_committed(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(max_attempts=5)
    w = cluster.worker()
    c1, fence = cluster.running_attempt(w)
    cluster.db.request_cancel(run_id, "user")
    cluster.expire(c1.attempt_id)
    assert cluster.db.sweep().lost == 1
    assert cluster.run(run_id)["status"] == "lost"


def test_c_deadline_commits_one_timeout_intent_that_the_holder_learns(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(timeout_ms=60_000)
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    assert cluster.db.sweep().timeouts == 0
    past = cluster.now() - 10
    cluster.sql.execute("UPDATE ql_run SET deadline_at_ms = %s WHERE id = %s", (past, run_id))
    cluster.sql.execute("UPDATE ql_run_attempt SET deadline_at_ms = %s WHERE id = %s", (past, claimed.attempt_id))
    assert cluster.db.sweep().timeouts == 1
    assert cluster.db.sweep().timeouts == 0  # once
    run = cluster.run(run_id)
    assert run["cancel_reason"] == "timeout" and run["cancel_requested_at_ms"] >= past
    assert cluster.events(run_id)[-1]["type"] == "run.cancel_requested"
    assert cluster.events(run_id)[-1]["reason"] == "timeout"
    renewed = cluster.db.renew(fence)
    assert (renewed.intents.cancel_reason, renewed.intents.deadline_at_ms) == ("timeout", past)
    result = cluster.complete(fence, 143, signalled=True)
    assert (result.status, result.reason) == ("timed_out", "timeout")


def test_d_retention_deletes_old_ended_leases_and_leftover_specs(cluster: Cluster) -> None:
    runs = cluster.submit(3)
    w = cluster.worker()
    ended = []
    for _ in range(2):
        c, f = cluster.running_attempt(w)
        cluster.complete(f, 0)
        ended.append(c.attempt_id)
    assert cluster.db.sweep(retention_ms=3_600_000).leases_deleted == 0
    cluster.sql.execute("UPDATE ql_attempt_lease SET ended_at_ms = ended_at_ms - 7200000 WHERE attempt_id = %s",
                        (ended[0],))
    counts = cluster.db.sweep(retention_ms=3_600_000)
    assert counts.leases_deleted == 1
    assert cluster.lease(ended[0]) is None and cluster.lease(ended[1]) is not None
    # A replay after retention still gets a final answer (from the attempt's token hash).
    # A run ended by another path (e.g. core) leaves its spec: retention erases it. (The run left queued:
    # runs submitted in one millisecond are claimed in id order, not in submission order.)
    (left,) = [r for r in runs if cluster.run(r)["status"] == "queued"]
    cluster.sql.execute("UPDATE ql_run SET status = 'lost', event_seq = event_seq + 1 WHERE id = %s", (left,))
    cluster.sql.execute("INSERT INTO ql_run_event (run_id, seq, type, status, at_ms) SELECT id, event_seq, 'run.lost',"
                        " 'lost', 0 FROM ql_run WHERE id = %s", (left,))
    assert cluster.db.sweep().specs_deleted == 1
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0


def test_d_replay_after_the_lease_row_was_deleted_is_already_terminal(cluster: Cluster) -> None:
    cluster.submit()
    w = cluster.worker()
    c, f = cluster.running_attempt(w)
    cluster.complete(f, 0, finished_at_ms=1)
    cluster.sql.execute("UPDATE ql_attempt_lease SET ended_at_ms = 0")
    assert cluster.db.sweep(retention_ms=0).leases_deleted == 1
    again = cluster.complete(f, 0, finished_at_ms=1)
    assert (again.answer, again.status) == (CompletionAnswer.ALREADY_TERMINAL, "succeeded")
    import dataclasses

    wrong = cluster.complete(dataclasses.replace(f, lease_token="B" * 64), 0, finished_at_ms=1)
    assert (wrong.answer, wrong.fence_reason) == (CompletionAnswer.FENCED, "NO_LEASE")


def test_sweep_is_bounded_default_page_and_hard_cap(cluster: Cluster) -> None:
    cluster.submit(80)
    w = cluster.worker(slots=100)
    for _ in range(10):
        cluster.claim(w, 8)
    cluster.sql.execute("UPDATE ql_attempt_lease SET expires_at_ms = ql__clock_ms() - 1")
    assert cluster.db.sweep().requeued == 16
    assert cluster.db.sweep(limit=1000).requeued == 64  # hard cap
    assert cluster.db.sweep(limit=0).requeued == 0  # at least one row per step
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run WHERE status = 'queued'").fetchone()["n"] == 80


def _parallel_sweeps(cluster: Cluster, sweepers: int, rounds: int) -> list[SweepCounts]:
    counts: list[SweepCounts] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(sweepers)
    lock = threading.Lock()

    def sweeper() -> None:
        try:
            with cluster.client() as db:
                barrier.wait()
                for _ in range(rounds):
                    c = db.sweep(limit=64)
                    with lock:
                        counts.append(c)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=sweeper) for _ in range(sweepers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return counts


def test_parallel_sweepers_never_double_act(cluster: Cluster) -> None:
    runs = cluster.submit(96, max_attempts=2)
    w = cluster.worker(slots=200)
    claimed = []
    for _ in range(12):
        claimed += cluster.claim(w, 8)
    for c in claimed[::2]:  # half started (retry), half only claimed (requeue)
        f = c.fence(w)
        cluster.db.start(f)
        cluster.db.running(f, started_at_ms=0)
    cluster.sql.execute("UPDATE ql_attempt_lease SET expires_at_ms = ql__clock_ms() - 1")
    counts = _parallel_sweeps(cluster, sweepers=4, rounds=4)
    assert sum(c.requeued for c in counts) == 48
    assert sum(c.retried for c in counts) == 48
    assert sum(c.lost for c in counts) == 0
    for run_id in runs:
        assert cluster.event_types(run_id).count("run.requeued") == 1
        assert cluster.run(run_id)["status"] == "queued"
