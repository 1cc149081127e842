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


# -- runner threads (runner_threads.RunnerThreads) ---------------------------------------------------
def _held(n: int) -> Held:
    return Held(fence=_fence(f"attempt-{n:06d}"), run_id=f"r{n}")


def _until(check, limit_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``check`` (a safety limit only: the tests assert what happened, never how fast)."""
    import time

    end = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < end, "the runner threads never got there"
        time.sleep(0.005)


def test_a_runner_thread_runs_the_next_attempt_after_its_own() -> None:
    import threading

    from ql_plugins.cluster_fenced.runner_threads import RunnerThreads

    seen: list[tuple[str, int, str]] = []
    done = threading.Semaphore(0)

    def target(held: Held) -> None:
        me = threading.current_thread()
        seen.append((held.attempt_id, me.ident or 0, me.name))
        done.release()

    threads = RunnerThreads(target)
    for n in range(3):
        threads.run(_held(n))
        assert done.acquire(timeout=60)
        _until(lambda: threads.idle() == 1)
    assert [a for a, _, _ in seen] == [f"attempt-{n:06d}" for n in range(3)]
    assert len({ident for _, ident, _ in seen}) == 1  # one thread (and so one store connection) for all three
    assert [name for _, _, name in seen] == [f"ql-attempt-{n:06d}" for n in range(3)]


def test_attempts_that_run_at_once_each_get_a_thread_and_a_failing_one_does_not_end_its_thread() -> None:
    import threading

    from ql_plugins.cluster_fenced.runner_threads import RunnerThreads

    release = threading.Event()
    running: list[int] = []
    lock = threading.Lock()

    def target(held: Held) -> None:
        with lock:
            running.append(threading.get_ident())
        release.wait(60)
        if held.run_id == "r0":
            raise RuntimeError("a runner that fails")

    threads = RunnerThreads(target)
    for n in range(3):
        threads.run(_held(n))
    _until(lambda: len(running) == 3)  # all three at once: none waited for another's thread
    assert len(set(running)) == 3
    release.set()
    _until(lambda: threads.idle() == 3)  # the failed one's thread too waits for the next attempt
    for n in range(3, 6):
        threads.run(_held(n))
    _until(lambda: len(running) == 6)
    assert set(running[3:]) <= set(running[:3])  # idle threads took them: no new thread
    _until(lambda: threads.idle() == 3)


def test_an_idle_runner_thread_ends_and_a_later_attempt_still_runs() -> None:
    import threading

    from ql_plugins.cluster_fenced.runner_threads import RunnerThreads

    ran: list[threading.Thread] = []
    threads = RunnerThreads(lambda held: ran.append(threading.current_thread()), idle_s=0.01)
    threads.run(_held(0))
    _until(lambda: len(ran) == 1 and not ran[0].is_alive())
    assert threads.idle() == 0
    threads.run(_held(1))
    _until(lambda: len(ran) == 2)
    assert ran[1] is not ran[0]


# -- call deadlines (call_deadlines.CallDeadlines) -----------------------------------------------------
def test_a_short_deadline_armed_after_a_long_one_still_cuts_its_call() -> None:
    import socket

    from ql_plugins.cluster_fenced.call_deadlines import CallDeadlines

    deadlines = CallDeadlines()
    long_a, long_b = socket.socketpair()
    short_a, short_b = socket.socketpair()
    try:
        long_token = deadlines.arm(long_a.fileno(), 3600.0)
        _until(lambda: deadlines._sleeps_until is not None)  # the thread sleeps until the long one
        short_token = deadlines.arm(short_a.fileno(), 0.0)
        short_a.settimeout(60)
        assert short_a.recv(1) == b""  # shut down: the call waiting on it wakes with an error
        assert deadlines.disarm(short_token) is True
        assert deadlines.disarm(long_token) is False  # never cut
        long_b.sendall(b"x")
        long_a.settimeout(60)
        assert long_a.recv(1) == b"x"
    finally:
        for s in (long_a, long_b, short_a, short_b):
            s.close()


def test_stopping_the_runner_threads_ends_the_idle_ones() -> None:
    import threading

    from ql_plugins.cluster_fenced.runner_threads import RunnerThreads

    ran: list[threading.Thread] = []
    threads = RunnerThreads(lambda held: ran.append(threading.current_thread()))
    threads.run(_held(0))
    _until(lambda: threads.idle() == 1)
    threads.stop()
    _until(lambda: not ran[0].is_alive())
    assert threads.idle() == 0
    threads.run(_held(1))  # a later attempt still runs (in a new thread)
    _until(lambda: len(ran) == 2)
