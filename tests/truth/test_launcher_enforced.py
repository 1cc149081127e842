"""The deadline, the KILL after a cancel's grace and the log quota hold with nobody looking.

Before, each needed a `ql` process to look: `ql run --detach --timeout 2 -- sleep 25` still ran
10 s later, a TERM-ignoring task outlived `ql cancel`'s grace, and a detached `yes` grew its log to
hundreds of MB — until the next `ql status`, follower or reconcile. Now the launcher (the one
process always there while the task runs) enforces them. These tests start a run, then only read
the process table and file sizes until the end; a `ql status` afterwards shows the outcome. Both
launchers: compiled and launcher.sh.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest

from ql_core.testing.executor import wait_until
from tests.conftest import detach_json, json_lines, published_receipt, run_ql, status_json
from tests.processes import pids_with

BOUND_S = 60


@pytest.fixture(params=["compiled", "shell"])
def env(request: pytest.FixtureRequest, ql_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "ql.toml"
    config.write_text(f'[limits]\ncancel_grace_s = 1\nlog_max_bytes = {QUOTA}\n\n'
                      f'[plugin.local]\nlauncher = "{request.param}"\n')
    return dict(ql_env, QL_CONFIG=str(config))


QUOTA = 1024 * 1024


def _wait(predicate, what: str):  # type: ignore[no-untyped-def]
    return wait_until(predicate, what, BOUND_S, interval=0.05)



def test_the_deadline_of_a_detached_run_holds_with_nobody_looking(env: dict[str, str], data_dir: Path) -> None:
    marker = f"25.{secrets.randbelow(10**6):06d}"
    rec = detach_json(env, "--timeout", "2", "--", "sleep", marker)
    _wait(lambda: pids_with(marker), "the task to start")
    _wait(lambda: not pids_with(marker), "the task to be stopped at its deadline")
    receipt = published_receipt(data_dir, rec["attempt_id"])
    assert receipt["exitCode"] == 143
    assert receipt["finishedAtMs"] - receipt["startedAtMs"] >= 2000  # not before its deadline
    view = status_json(env, rec["run_id"])
    assert (view["status"], view["exit_code"], view["reason"]) == ("timed_out", 143, "timeout")


def test_a_cancel_kills_a_term_ignoring_task_after_the_grace_with_nobody_running_ql(
        env: dict[str, str], data_dir: Path) -> None:
    marker = f"26.{secrets.randbelow(10**6):06d}"
    rec = detach_json(env, "--", "sh", "-c", f"trap '' TERM; sleep {marker}; exit 0")
    _wait(lambda: pids_with(marker), "the task to start")
    out = run_ql(["cancel", rec["run_id"]], env)  # sends TERM and returns: no ql runs after this
    assert out.returncode == 0, out.stderr
    assert pids_with(marker), "TERM is ignored: the task is still there after the cancel's TERM"
    _wait(lambda: not pids_with(marker), "the launcher's KILL after cancel_grace_s")
    assert published_receipt(data_dir, rec["attempt_id"])["exitCode"] == 137
    view = status_json(env, rec["run_id"])
    assert (view["status"], view["exit_code"], view["reason"]) == ("cancelled", 137, "user")


WRITER = """
import os, sys, time
chunk = b"q" * 65536
for _ in range(int(sys.argv[1]) // len(chunk)):
    os.write(1, chunk)
time.sleep(120)
"""


def test_the_log_quota_holds_with_no_follower(env: dict[str, str], data_dir: Path) -> None:
    """A task writes 32 times its quota and waits: with no follower and no ql process, its log is
    brought back to the quota (+1 byte, so the end of the run records the cut) while it runs."""
    import sys

    marker = f"q{secrets.token_hex(4)}"
    rec = detach_json(env, "--name", marker, "--", sys.executable, "-c", WRITER, str(32 * QUOTA))
    log = data_dir / "logs"
    _wait(lambda: list(log.rglob("*")) and any(p.is_file() for p in log.rglob("*")), "the log")
    path = next(p for p in log.rglob("*") if p.is_file())
    _wait(lambda: path.stat().st_size == QUOTA + 1, "the log cut back to its quota")
    assert path.read_bytes() == b"q" * (QUOTA + 1)
    out = run_ql(["cancel", rec["run_id"]], env)
    assert out.returncode == 0, out.stderr
    _wait(lambda: status_json(env, rec["run_id"])["status"] == "cancelled", "the cancel")
    # The end of the run is finalized by the next round (or a waiting host, or a follower at the
    # end): QUOTA + 1 bytes tell it the log was cut, and it records the cut.
    assert run_ql(["reconcile"], env).returncode == 0
    logs = run_ql(["logs", rec["run_id"]], env)
    assert logs.returncode == 0, logs.stderr
    assert len(logs.stdout) == QUOTA and "log_max_bytes" in logs.stderr  # recorded as truncated
    assert path.stat().st_size == QUOTA


def test_a_flood_with_no_follower_is_cut_while_it_runs(env: dict[str, str], data_dir: Path) -> None:
    """`yes` with a 1 MiB quota: the log is cut again and again while it runs (it never grows for
    long: about a second of output past the quota at most), with nobody reading it."""
    rec = detach_json(env, "--", "yes")
    log = data_dir / "logs"
    _wait(lambda: any(p.is_file() for p in log.rglob("*")), "the log")
    path = next(p for p in log.rglob("*") if p.is_file())
    sizes, cuts, last = [], 0, 0
    deadline = time.monotonic() + BOUND_S
    while cuts < 3:  # three cuts seen: the launcher keeps cutting, not just once
        assert time.monotonic() < deadline, f"no cuts seen in {sizes[-20:]}"
        size = path.stat().st_size
        cuts += size < last
        sizes.append(size)
        last = size
        time.sleep(0.02)
    assert run_ql(["cancel", rec["run_id"]], env).returncode == 0
    _wait(lambda: status_json(env, rec["run_id"])["status"] == "cancelled", "the cancel")


def _ignoring_and_blocking() -> None:
    """What a `nohup` / `setsid ... &` host passes on, and more: HUP and INT ignored and blocked."""
    import signal

    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, signal.SIGINT, signal.SIGALRM})


@pytest.mark.parametrize("how", ["cancel", "group INT"])
def test_a_task_of_a_host_that_ignores_and_blocks_signals_dies_of_them(
        env: dict[str, str], data_dir: Path, how: str) -> None:
    import signal
    import subprocess

    from tests.conftest import QL

    if how == "group INT" and "shell" in Path(env["QL_CONFIG"]).read_text():
        pytest.skip("launcher.sh cannot unblock a signal its host blocked (docs/launcher.md); a cancel still works")
    marker = f"27.{secrets.randbelow(10**6):06d}"
    out = subprocess.run([*QL, "--json", "run", "--detach", "--", "sleep", marker], env=env, capture_output=True,
                         text=True, timeout=BOUND_S, preexec_fn=_ignoring_and_blocking)
    assert out.returncode == 0, out.stderr
    rec = json_lines(out.stdout)[0]
    _wait(lambda: pids_with(marker), "the task to start")
    if how == "cancel":
        assert run_ql(["cancel", rec["run_id"]], env).returncode == 0
        expected = ("cancelled", 143)
    else:
        status = Path(f"/proc/{pids_with(marker)[0]}/status").read_text()
        assert "SigIgn:\t0000000000000000" in status and "SigBlk:\t0000000000000000" in status, status
        os.killpg(os.getpgid(pids_with(marker)[0]), signal.SIGINT)
        expected = ("failed", 130)
    _wait(lambda: not pids_with(marker), "the task to die of the signal")
    assert published_receipt(data_dir, rec["attempt_id"])["exitCode"] == expected[1]
    view = status_json(env, rec["run_id"])
    assert (view["status"], view["exit_code"]) == expected
