"""Races between sweepers, completions and claimers on real concurrent connections."""

from __future__ import annotations

import threading

import pytest

from ql_plugins.cluster_fenced import CompletionAnswer
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres

ROUNDS = 60


def test_expire_versus_complete_exactly_one_terminal_event(cluster: Cluster) -> None:
    """A sweep and the holder's completion start together on a lease that expires right now.
    Whoever commits first wins; the other changes nothing. Never both, never neither."""
    w = cluster.worker(slots=1000)
    sweeper, completer = cluster.client(), cluster.client()
    outcomes = {"applied": 0, "fenced": 0}
    try:
        for i in range(ROUNDS):
            (run_id,) = cluster.submit()
            claimed, fence = cluster.running_attempt(w)
            # Expiry lands inside the race window: a few ms from now on the database clock.
            cluster.sql.execute("UPDATE ql_attempt_lease SET expires_at_ms = ql__clock_ms() + %s"
                                " WHERE attempt_id = %s", (i % 4, claimed.attempt_id))
            barrier = threading.Barrier(2)
            results: dict[str, object] = {}

            def sweep() -> None:
                barrier.wait()
                # Keep sweeping until this lease was handled one way or the other.
                for _ in range(200):
                    results["sweep"] = sweeper.sweep(limit=4)
                    if cluster.lease(claimed.attempt_id)["status"] == "ended":
                        return

            def complete() -> None:
                barrier.wait()
                results["complete"] = cluster.complete(fence, 0, db=completer)

            threads = [threading.Thread(target=sweep), threading.Thread(target=complete)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            answer = results["complete"].answer  # type: ignore[union-attr]
            terminal = [e for e in cluster.events(run_id) if e["type"].startswith("run.")
                        and e["type"] in ("run.succeeded", "run.lost")]
            assert len(terminal) == 1, (i, terminal)
            run = cluster.run(run_id)
            if answer is CompletionAnswer.APPLIED:
                outcomes["applied"] += 1
                assert run["status"] == "succeeded" and terminal[0]["type"] == "run.succeeded"
            else:
                assert answer is CompletionAnswer.FENCED, answer
                outcomes["fenced"] += 1
                assert run["status"] == "lost" and terminal[0]["type"] == "run.lost"
                assert "attempt.completion_fenced" in cluster.event_types(run_id)
    finally:
        sweeper.close()
        completer.close()
    assert sum(outcomes.values()) == ROUNDS
    print("expire-vs-complete outcomes:", outcomes)


def test_lease_expiring_mid_run_with_retries_makes_exactly_one_new_attempt_under_contention(
        cluster: Cluster) -> None:
    """Two sweepers and two claimers race over runs whose started leases all expired."""
    runs = cluster.submit(24, max_attempts=3)
    w = cluster.worker(slots=1000)
    started = []
    for _ in range(3):
        for c in cluster.claim(w, 8):
            f = c.fence(w)
            cluster.db.start(f)
            cluster.db.running(f, started_at_ms=0)
            started.append(c)
    cluster.sql.execute("UPDATE ql_attempt_lease SET expires_at_ms = ql__clock_ms() - 1")
    errors: list[BaseException] = []
    claimed_again: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def sweeper() -> None:
        try:
            with cluster.client() as db:
                barrier.wait()
                for _ in range(6):
                    db.sweep(limit=8)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def claimer(name: str) -> None:
        try:
            with cluster.client() as db:
                me = cluster.worker(name, db=db)
                barrier.wait()
                for _ in range(40):
                    got = cluster.claim(me, 8, db=db)
                    with lock:
                        claimed_again.extend(c.run_id for c in got)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=sweeper), threading.Thread(target=sweeper),
               threading.Thread(target=claimer, args=("c1",)), threading.Thread(target=claimer, args=("c2",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    cluster.db.sweep(limit=64)  # whatever the racers left
    claimed_again += [c.run_id for c in cluster.claim(w, 8) + cluster.claim(w, 8) + cluster.claim(w, 8)]
    assert sorted(claimed_again) == sorted(runs)  # each run re-claimed exactly once
    for run_id in runs:
        attempts = cluster.attempts(run_id)
        assert [a["attempt_no"] for a in attempts] == [1, 2]
        assert (attempts[0]["status"], attempts[0]["reason"]) == ("lost", "LEASE_EXPIRED")
        assert attempts[1]["status"] == "starting"
        assert cluster.event_types(run_id).count("run.requeued") == 1


def test_cancel_versus_complete_converge_once(cluster: Cluster) -> None:
    """A user cancel and the completion race: the run ends once, cancelled only if the intent
    committed first and the task had not already finished before it."""
    w = cluster.worker(slots=1000)
    canceller, completer = cluster.client(), cluster.client()
    try:
        for _ in range(30):
            (run_id,) = cluster.submit()
            claimed, fence = cluster.running_attempt(w)
            barrier = threading.Barrier(2)
            out: dict[str, object] = {}

            def cancel() -> None:
                barrier.wait()
                out["cancel"] = canceller.request_cancel(run_id, "user")

            def complete() -> None:
                barrier.wait()
                out["complete"] = cluster.complete(fence, 0, finished_at_ms=cluster.now() + 1000, db=completer)

            threads = [threading.Thread(target=cancel), threading.Thread(target=complete)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            run = cluster.run(run_id)
            if out["cancel"].answer.value == "requested":  # type: ignore[union-attr]
                assert run["status"] == "cancelled"  # finished after the request, by a clamped clock
            else:
                assert out["cancel"].answer.value == "already_terminal"  # type: ignore[union-attr]
                assert run["status"] == "succeeded"
    finally:
        canceller.close()
        completer.close()
