"""Many processes completing the same attempts at once, on one SQLite file: each applied exactly once.

Receipts are found at least once (every process sees every receipt); the
CompletionService must make each terminal state take effect at most once
(ADR-0007 §2.1, §2.5).
"""

from __future__ import annotations

import json
import subprocess
import time
import sys
from pathlib import Path
from typing import Any

from tests.completion.completion_support import (
    DEADLINE_S,
    QL,
    assert_one_terminal,
    create_with_receipts,
    receipt_path,
    run_consume_workers,
)

N_RUNS = 60
WORKERS = 6


def test_parallel_consumers_apply_each_completion_exactly_once(runtime: Any, data_dir: Path,
                                                               tmp_path: Path) -> None:
    subs = create_with_receipts(runtime, N_RUNS)
    results = run_consume_workers(data_dir, [s.attempt_id for s in subs], WORKERS, tmp=tmp_path)
    total: dict[str, int] = {}
    for counts in results:
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    assert total.get("applied") == N_RUNS, results
    assert set(total) <= {"applied", "already_terminal", "missing"}, results  # no retry, no quarantine
    assert sum(total.values()) == N_RUNS * WORKERS
    for i, sub in enumerate(subs):
        assert_one_terminal(runtime, sub.run_id, "succeeded" if i % 7 == 0 else "failed", i % 7)
        assert not receipt_path(data_dir, sub.attempt_id).exists()


def test_parallel_reconcile_commands_on_real_tasks(runtime: Any, submit: Any, ql_env: dict[str, str],
                                                   data_dir: Path) -> None:
    subs = [submit(["sh", "-c", f"exit {i % 7}"]) for i in range(N_RUNS)]
    for sub in subs:
        sub.task.live.process.wait(timeout=DEADLINE_S)  # the launcher exits only after publishing
        assert receipt_path(data_dir, sub.attempt_id).exists()
    procs = [subprocess.Popen(QL + ["--json", "reconcile"], env=ql_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(WORKERS)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=DEADLINE_S * 2)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.splitlines()[0]))
    assert sum(r["applied"] for r in reports) == N_RUNS, reports
    for key in ("lost", "quarantined", "blocked", "retry"):
        assert sum(r.get(key, 0) for r in reports) == 0, (key, reports)
    for i, sub in enumerate(subs):
        assert_one_terminal(runtime, sub.run_id, "succeeded" if i % 7 == 0 else "failed", i % 7)
        assert not receipt_path(data_dir, sub.attempt_id).exists()


RECONCILE_LOOP = r"""
import sys, time
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime
data_dir, stop = Path(sys.argv[1]), Path(sys.argv[2])
rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
(stop.parent / f"ready-{__import__('os').getpid()}").touch()
rounds = 0
while not stop.exists():
    rt.reconcile()
    rounds += 1
print(rounds)
"""


def test_live_waiters_race_background_reconcilers(runtime: Any, submit: Any, data_dir: Path,
                                                  tmp_path: Path) -> None:
    """The live fast path (`wait`) and recovery call the same service concurrently: one end each."""
    stop = tmp_path / "stop"
    loops = [subprocess.Popen([sys.executable, "-c", RECONCILE_LOOP, str(data_dir), str(stop)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        # Race for real: the waiters start only once every reconcile loop is up.
        deadline = time.monotonic() + DEADLINE_S
        while len(list(tmp_path.glob("ready-*"))) < len(loops) and time.monotonic() < deadline:
            time.sleep(0.02)
        subs = [submit(["sh", "-c", f"exit {i % 5}"]) for i in range(20)]
        views = [runtime.wait(sub) for sub in subs]
    finally:
        stop.touch()
        outputs = [p.communicate(timeout=DEADLINE_S * 2) for p in loops]
    for proc, (out, err) in zip(loops, outputs):
        assert proc.returncode == 0, err
        assert int(out.strip()) >= 1
    for i, (sub, view) in enumerate(zip(subs, views)):
        assert (view.status, view.exit_code) == ("succeeded" if i % 5 == 0 else "failed", i % 5)
        assert_one_terminal(runtime, sub.run_id, view.status, i % 5)
        assert not receipt_path(data_dir, sub.attempt_id).exists()
