"""The supervisor's lifecycle (ADR-0007 §2.6, ADR-0005 rules in DESIGN.md §2).

No overlapping rounds, the next round only after the previous one ended, a bounded drain on
stop(), a daemon thread that never keeps the interpreter alive, and a loop that survives a bad
round (including a cursor that fails closed).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from tests.recovery.recovery_support import insert_attempts, wait_until

from ql_core.reconciler import CursorStuckError, Reconciler, RoundReport
from ql_core.supervisor import Supervisor


class Instrumented(Reconciler):
    """A real reconciler whose rounds take a while and record when they ran (and how many at once)."""

    def __init__(self, rt: Any, *, hold_s: float = 0.0, gate: threading.Event | None = None) -> None:
        super().__init__(rt)
        self.hold_s = hold_s
        self.gate = gate
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.spans: list[tuple[float, float]] = []

    def round(self, **kw: Any) -> RoundReport:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        started = time.monotonic()
        try:
            report = super().round(**kw)
            if self.gate is not None:
                self.gate.wait()
            time.sleep(self.hold_s)
            return report
        finally:
            with self.lock:
                self.active -= 1
                self.spans.append((started, time.monotonic()))


def _supervisor(rt: Any, reconciler: Reconciler, interval_s: float) -> Supervisor:
    sup = Supervisor(rt.node, interval_s=interval_s)
    sup.reconciler = reconciler
    return sup


def test_rounds_never_overlap(rt_factory, sleeper_handle: dict) -> None:
    rt = rt_factory(page_size=4, pages_per_round=2)
    insert_attempts(rt, 20, handle=sleeper_handle)
    rec = Instrumented(rt, hold_s=0.05)
    sup = _supervisor(rt, rec, interval_s=0.01)
    sup.start()
    sup.start()  # idempotent: still one loop
    stop_hammer = threading.Event()

    def hammer() -> None:
        while not stop_hammer.is_set():
            sup.wake()
            sup.run_round()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: len(rec.spans) >= 30, timeout=30, message="30 rounds")
    stop_hammer.set()
    for t in threads:
        t.join(10)
    assert sup.stop(drain_s=5)
    assert rec.max_active == 1
    spans = sorted(rec.spans)
    assert all(end <= nxt_start for (_, end), (nxt_start, _) in zip(spans, spans[1:]))
    assert sup.failures == 0 and sup.rounds == len(rec.spans)
    assert [t.name for t in threading.enumerate()].count("ql-supervisor") == 0


def test_next_round_only_after_the_previous_one(rt_factory) -> None:
    rt = rt_factory()
    rec = Instrumented(rt, hold_s=0.3)
    sup = _supervisor(rt, rec, interval_s=0.05)
    sup.start()
    wait_until(lambda: len(rec.spans) >= 3, timeout=20, message="3 rounds")
    assert sup.stop(drain_s=5)
    spans = rec.spans[:3]
    # The interval (0.05 s) is shorter than a round (0.3 s): rounds still follow one another.
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_stop_drains_within_its_cap(rt_factory) -> None:
    rt = rt_factory()
    gate = threading.Event()
    rec = Instrumented(rt, gate=gate)
    sup = _supervisor(rt, rec, interval_s=0.05)
    sup.start()
    wait_until(lambda: rec.active == 1, timeout=10, message="a round in progress")

    started = time.monotonic()
    drained = sup.stop(drain_s=0.5)
    elapsed = time.monotonic() - started
    assert drained is False  # the round is stuck longer than the cap
    assert 0.45 <= elapsed < 3.0
    assert not sup.running

    gate.set()  # the stuck round finishes; the loop then ends without another round
    assert sup.stop(drain_s=5) is True
    assert len(rec.spans) == 1


def test_stop_while_idle_returns_at_once(rt_factory) -> None:
    rt = rt_factory()
    sup = Supervisor(rt.node, interval_s=3600)
    sup.start()
    wait_until(lambda: sup.rounds >= 1, timeout=10, message="the startup round")
    started = time.monotonic()
    assert sup.stop(drain_s=5) is True
    assert time.monotonic() - started < 2.0
    assert Supervisor(rt.node, interval_s=1).stop() is True  # never started


def test_wake_runs_the_next_round_early(rt_factory) -> None:
    rt = rt_factory()
    sup = Supervisor(rt.node, interval_s=3600)
    sup.start()
    try:
        wait_until(lambda: sup.rounds >= 1, timeout=10, message="the startup round")
        sup.wake()
        wait_until(lambda: sup.rounds >= 2, timeout=10, message="a woken round")
    finally:
        assert sup.stop(drain_s=5)


def test_restart_while_the_old_loop_drains_never_overlaps(rt_factory) -> None:
    rt = rt_factory()
    gate = threading.Event()
    rec = Instrumented(rt, gate=gate)
    sup = _supervisor(rt, rec, interval_s=0.05)
    sup.start()
    wait_until(lambda: rec.active == 1, timeout=10, message="a round in progress")
    assert sup.stop(drain_s=0.1) is False
    sup.start()  # a fresh loop; it must wait for the old one's round
    time.sleep(0.3)
    assert rec.max_active == 1 and len(rec.spans) == 0
    gate.set()
    wait_until(lambda: len(rec.spans) >= 3, timeout=10, message="rounds of the new loop")
    assert sup.running
    assert sup.stop(drain_s=5)
    assert rec.max_active == 1


def test_a_failing_round_does_not_kill_the_loop(rt_factory, sleeper_handle: dict) -> None:
    rt = rt_factory(page_size=2, pages_per_round=2)
    insert_attempts(rt, 6, handle=sleeper_handle)

    class Stuck(Reconciler):
        calls = 0

        def _fetch_attempts(self, cursor: str, limit: int) -> list[Any]:
            Stuck.calls += 1
            if Stuck.calls <= 3:
                return super()._fetch_attempts("", limit)  # a cursor that does not advance
            return super()._fetch_attempts(cursor, limit)

    seen: list[RoundReport] = []
    sup = Supervisor(rt.node, interval_s=0.05, on_round=seen.append)
    sup.reconciler = Stuck(rt)
    sup.start()
    try:
        wait_until(lambda: sup.failures >= 1 and len(seen) >= 3, timeout=20, message="failures then rounds")
    finally:
        assert sup.stop(drain_s=5)
    assert sup.last_error == CursorStuckError.__name__
    assert sum(r.counts["still_running"] for r in seen) >= 6


_DAEMON = textwrap.dedent("""
    import sys, threading, time
    from ql_core.config import load_config
    from ql_core.reconciler import Reconciler
    from ql_core.runtime import Runtime
    from ql_core.supervisor import Supervisor

    entered = threading.Event()

    class Forever(Reconciler):
        def round(self, **kw):
            super().round(**kw)
            print("in-round", flush=True)
            entered.set()
            threading.Event().wait()  # a round that never ends

    def main():
        data_dir, mode = sys.argv[1], sys.argv[2]
        rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
        sup = Supervisor(rt.node, interval_s=0.05)
        if mode == "stuck":
            sup.reconciler = Forever(rt)
        sup.start()
        assert sup._thread.daemon
        deadline = time.monotonic() + 20
        while sup.rounds < 2 and mode == "idle" and time.monotonic() < deadline:
            time.sleep(0.01)
        if mode == "stuck":
            assert entered.wait(20)
        time.sleep(0.2)
        print("main-returns", flush=True)

    main()
""")


def test_the_supervisor_never_keeps_the_interpreter_alive(data_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "daemon_host.py"
    script.write_text(_DAEMON)
    # idle five times: a host leaving while its supervisor is inside a statement used to crash
    # at exit (its connection closed under it by an atexit finalizer) about once in ten exits.
    for mode in ("idle",) * 5 + ("stuck",):
        started = time.monotonic()
        proc = subprocess.run([sys.executable, str(script), str(data_dir), mode], capture_output=True, text=True,
                              timeout=60)
        elapsed = time.monotonic() - started
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith("main-returns")
        if mode == "stuck":
            assert "in-round" in proc.stdout
        assert elapsed < 30  # returns from main, then exits: no join on the supervisor thread
