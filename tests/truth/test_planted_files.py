"""Nothing ql opens can block it: a FIFO planted at a log path is reported, never waited on.

A task may replace its own log file with a FIFO (``mkfifo``); before, `ql run`, `ql reconcile`,
`ql supervise` and `ql logs` blocked in ``open()`` until someone removed it, and an unrelated run
stayed ``running``. Every test here plants the FIFO for real and bounds the wait with a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import QL, json_lines, run_ql

#: Failure detection only: a blocked open() would hang until the test's timeout.
BOUND_S = 30


def _plant_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _finished_unrelated(ql_env: dict[str, str]) -> dict:
    out = run_ql(["--json", "run", "--detach", "--", "sh", "-c", "exit 4"], ql_env)
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)[0]


def _wait_receipt(data_dir: Path, attempt_id: str) -> None:
    path = data_dir / "receipts" / attempt_id[-2:] / f"{attempt_id}.json"
    deadline = time.monotonic() + BOUND_S
    while not path.exists():
        assert time.monotonic() < deadline, "no receipt"
        time.sleep(0.02)


def test_ql_run_whose_task_turns_its_log_into_a_fifo_still_exits_with_its_code(ql_env: dict[str, str]) -> None:
    script = 'p=$(readlink /proc/$$/fd/1); echo before; rm "$p"; mkfifo "$p"; sleep 0.3; exit 3'
    out = run_ql(["run", "--", "sh", "-c", script], ql_env, timeout=BOUND_S)
    assert out.returncode == 3, out.stderr
    assert "not a regular file" in out.stderr and "Traceback" not in out.stderr


def test_reconcile_supervise_and_logs_never_block_on_a_planted_fifo(ql_env: dict[str, str], data_dir: Path,
                                                                   tmp_path: Path) -> None:
    go = tmp_path / "go"
    victim = json_lines(run_ql(["--json", "run", "--detach", "--", "sh", "-c",
                                f'while [ ! -e "{go}" ]; do sleep 0.02; done'], ql_env).stdout)[0]
    unrelated = _finished_unrelated(ql_env)
    _wait_receipt(data_dir, unrelated["attempt_id"])
    status = json.loads(run_ql(["--json", "status", victim["run_id"]], ql_env).stdout.splitlines()[0])
    log_id = status["attempts"][0]["log_artifact_id"]
    from ql_core.paths import log_path

    _plant_fifo(log_path(data_dir, log_id))
    try:
        # reconcile: finishes its pass, settles the unrelated run, counts the bad log.
        out = run_ql(["--json", "reconcile"], ql_env, timeout=BOUND_S)
        assert out.returncode == 0, out.stderr
        counts = json_lines(out.stdout)[0]
        assert counts["applied"] == 1 and counts.get("log_errors", 0) >= 1
        view = json.loads(run_ql(["--json", "status", unrelated["run_id"]], ql_env).stdout.splitlines()[0])
        assert (view["status"], view["exit_code"]) == ("failed", 4)

        # logs: one line naming the problem, no hang.
        out = run_ql(["logs", victim["run_id"]], ql_env, timeout=BOUND_S)
        assert out.returncode == 1 and "not a regular file" in out.stderr and "Traceback" not in out.stderr

        # supervise: rounds keep running (a second unrelated run is settled by it).
        second = _finished_unrelated(ql_env)
        _wait_receipt(data_dir, second["attempt_id"])
        env = dict(ql_env, QL_LOG_LEVEL="WARNING")
        sup = subprocess.Popen(QL + ["--profile", "standalone", "supervise"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + BOUND_S
            while True:
                view = json.loads(run_ql(["--json", "status", second["run_id"]], ql_env).stdout.splitlines()[0])
                if view["status"] == "failed":
                    break
                assert time.monotonic() < deadline, "the supervisor never settled the unrelated run"
                time.sleep(0.1)
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.communicate(timeout=BOUND_S)
        assert sup.returncode == 0
    finally:
        go.touch()
        deadline = time.monotonic() + BOUND_S
        while json.loads(run_ql(["--json", "status", victim["run_id"]], ql_env).stdout.splitlines()[0])[
                "status"] not in ("succeeded", "failed", "lost"):
            assert time.monotonic() < deadline
            run_ql(["reconcile"], ql_env, timeout=BOUND_S)
            time.sleep(0.05)
