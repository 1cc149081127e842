"""No verdict depends on two clocks agreeing (faketime produces the skew for real).

Before, the "finished before the intent" rule compared the launcher's clock with ql's: with the
reconciler's clock 2 h ahead, a `--timeout 3600` task was TERMed after 1 s and recorded `failed 143`
(`run.cancel_moot`); with the task's clock 10 min behind, a real cancel became `failed 143`. Now,
once ql has signalled an attempt for an intent, the intent decides; and a receipt's times are
clamped to [the attempt's start, the store's now].
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import QL, json_lines, run_ql

BOUND_S = 60
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.fixture
def faketime() -> str:
    path = shutil.which("faketime")
    if path is None or not os.path.exists(LIBFAKETIME):
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is required under CI=true (apt-get install faketime)")
        pytest.skip("faketime is not installed")
    return path


def _status(ql_env: dict[str, str], run_id: str) -> dict:
    return json.loads(run_ql(["--json", "status", run_id], ql_env).stdout.splitlines()[0])


def _wait_terminal(ql_env: dict[str, str], run_id: str) -> dict:
    deadline = time.monotonic() + BOUND_S
    while True:
        run_ql(["reconcile"], ql_env)
        view = _status(ql_env, run_id)
        if view["status"] not in ("queued", "running"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.1)


def test_a_reconciler_two_hours_ahead_never_reports_its_kill_as_the_tasks_failure(
        faketime: str, ql_env: dict[str, str]) -> None:
    rec = json_lines(run_ql(["--json", "run", "--detach", "--timeout", "3600", "--", "sleep", "60"],
                            ql_env).stdout)[0]
    # libfaketime preloaded, not the `faketime` wrapper: the wrapper names a shared-memory segment and a
    # semaphore after its pid and leaves them behind when it is killed; once pids wrap, a new wrapper
    # fails with "sem_open: File exists" (seen under load, with 242 stale segments in /dev/shm).
    ahead = subprocess.run([*QL, "--json", "reconcile"], env=dict(ql_env, LD_PRELOAD=LIBFAKETIME, FAKETIME="+2h"),
                           capture_output=True,
                           text=True, timeout=BOUND_S)
    assert ahead.returncode == 0, ahead.stderr
    # By its clock the deadline passed: it commits the timeout intent and TERMs the task (ql cannot
    # know the true time). What it must never do is call that kill the task's own failure.
    view = _wait_terminal(ql_env, rec["run_id"])
    assert (view["status"], view["reason"]) == ("timed_out", "timeout"), view
    events = [e["type"] for e in json_lines(run_ql(["--json", "events", rec["run_id"]], ql_env).stdout)]
    assert "run.cancel_moot" not in events


def test_a_task_whose_clock_is_ten_minutes_behind_is_still_cancelled(faketime: str, data_dir: Path,
                                                                   open_rt) -> None:
    rt = open_rt()
    env = dict(os.environ, LD_PRELOAD=LIBFAKETIME, FAKETIME="-10m", FAKETIME_DONT_FAKE_MONOTONIC="1")
    sub = rt.submit(["sh", "-c", "echo ready; while :; do sleep 0.05; done"], env=env)
    log = rt.log_path(sub.run_id)
    deadline = time.monotonic() + BOUND_S
    while b"ready" not in log.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert str(rt.cancel(sub.run_id)) == "requested"
    view = rt.wait(sub)
    # The receipt says it finished 10 minutes before the cancel was requested; we TERMed it.
    assert (view.status, view.exit_code, view.reason) == ("cancelled", 143, "user")
    assert "run.cancel_moot" not in [e.type for e in rt.events(sub.run_id)]


def test_receipt_times_far_in_the_future_are_clamped(faketime: str, data_dir: Path, open_rt) -> None:
    rt = open_rt()
    env = dict(os.environ, LD_PRELOAD=LIBFAKETIME, FAKETIME="+1d", FAKETIME_DONT_FAKE_MONOTONIC="1")
    sub = rt.submit(["sh", "-c", "exit 0"], env=env)
    view = rt.wait(sub)
    assert view.status == "succeeded"
    assert view.finished_at_ms is not None and view.finished_at_ms <= int(time.time() * 1000) + 1000
