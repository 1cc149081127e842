"""A timeout is a duration: wall-clock steps on any host move no deadline (faketime, for real).

Before, deadlines followed the wall clock: with the waiting host's clock stepped back 1 h a
`--timeout 8` task ran 20 s and was recorded `succeeded 0`; stepped forward 1 h, a `--timeout 60`
task was killed after about 4 s; a submitter 1 h behind had a `--timeout 600` task timed out by the
first `ql reconcile` on a correct clock. Now the deadline is enforced on CLOCK_BOOTTIME (the
launcher's timer, the waiting host's timer, recovery's "deadline passed"), and the verdict
compares the committed start plus durations.

libfaketime fakes only the wall clock here (``FAKETIME_DONT_FAKE_MONOTONIC=1``): a real clock step
never moves the boot clock. The compiled launcher is linked statically where it can be, so it is
not faked at all (it never reads the wall clock for a duration anyway); launcher.sh reads
/proc/uptime. The task itself runs without libfaketime (``env -u LD_PRELOAD``): its sleep is the
real duration the test is about.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ql_core.testing.executor import wait_until
from tests.conftest import QL, json_lines, run_ql
from tests.processes import pids_with

BOUND_S = 90
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


# libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 fails clock_nanosleep (EINVAL), which is
# Python's time.sleep (subprocess's wait with a timeout sleeps too); select's timeout is not
# affected. The faked `ql` processes get a time.sleep made of select (a sitecustomize on their
# PYTHONPATH): nothing of what these tests are about, only what lets Python run under libfaketime.
SITECUSTOMIZE = """
import select, time

def _sleep(seconds):
    if seconds > 0:
        select.select([], [], [], seconds)

time.sleep = _sleep
"""


@pytest.fixture
def faketime() -> str:
    if shutil.which("faketime") is None or not os.path.exists(LIBFAKETIME):
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is required under CI=true (apt-get install faketime)")
        pytest.skip("faketime is not installed")
    return LIBFAKETIME


@pytest.fixture
def sleep_shim(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("faketime-shim")
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return str(directory)


@pytest.fixture(params=["compiled", "shell"])
def env(request: pytest.FixtureRequest, ql_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "ql.toml"
    config.write_text(f'[plugin.local]\nlauncher = "{request.param}"\n')
    env = dict(ql_env, QL_CONFIG=str(config))
    # The launcher is built (compiled) on a correct clock first: a build under libfaketime is not
    # what these tests are about.
    assert run_ql(["run", "--", "true"], env).returncode == 0
    return env


def _faked(env: dict[str, str], lib: str, shim: str, **settings: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (shim, env.get("PYTHONPATH", "")) if p)
    return dict(env, LD_PRELOAD=lib, FAKETIME_DONT_FAKE_MONOTONIC="1", PYTHONPATH=path, **settings)


def _stepping(env: dict[str, str], lib: str, shim: str, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose wall clock follows a file (read at every call): write "-1h" to step."""
    offset = tmp_path / "faketime.offset"
    offset.write_text("+0\n")
    return _faked(env, lib, shim, FAKETIME_TIMESTAMP_FILE=str(offset), FAKETIME_NO_CACHE="1"), offset


def _status(env: dict[str, str], run_id: str) -> dict:
    out = run_ql(["--json", "status", run_id], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def _duration(view: dict) -> int:
    attempt = view["attempts"][-1]
    return int(attempt["finished_at_ms"]) - int(attempt["started_at_ms"])


def _wait(predicate, what: str):  # type: ignore[no-untyped-def]
    return wait_until(predicate, what, BOUND_S, interval=0.05)


def _run_stepped(env: dict[str, str], faketime: str, sleep_shim: str, tmp_path: Path, step: str, *,
                 timeout_s: int, sleep_s: int) -> tuple[int, dict, dict]:
    """`ql --json run --timeout TIMEOUT_S -- sleep SLEEP_S` in the foreground; once its task runs, the
    wall clock (of all but the task, run without LD_PRELOAD) steps by ``step``. Exit code, last line, status."""
    faked, offset = _stepping(env, faketime, sleep_shim, tmp_path)
    marker = f"{sleep_s}.{secrets.randbelow(10**6):06d}"  # a unique argv word, and the seconds to sleep
    proc = subprocess.Popen([*QL, "--json", "run", "--timeout", str(timeout_s), "--", "env", "-u", "LD_PRELOAD",
                             "sleep", marker], env=faked, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: pids_with(marker), "the task to start")
        time.sleep(0.5)
        offset.write_text(f"{step}\n")
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = json_lines(out)
    assert lines, err
    return proc.returncode, lines[-1], _status(env, lines[-1]["run_id"])


def test_the_waiting_hosts_clock_stepped_back_does_not_extend_the_deadline(
        faketime: str, sleep_shim: str, env: dict[str, str], tmp_path: Path) -> None:
    rc, final, view = _run_stepped(env, faketime, sleep_shim, tmp_path, "-1h", timeout_s=3, sleep_s=20)
    assert rc == 124, final
    assert (view["status"], view["reason"]) == ("timed_out", "timeout")
    assert 3000 <= _duration(view) < 20_000  # ended at its deadline, not when sleep would have


def test_the_waiting_hosts_clock_stepped_forward_does_not_cut_the_task_short(
        faketime: str, sleep_shim: str, env: dict[str, str], tmp_path: Path) -> None:
    rc, final, view = _run_stepped(env, faketime, sleep_shim, tmp_path, "+1h", timeout_s=60, sleep_s=3)
    assert rc == 0, final
    assert (view["status"], view["exit_code"]) == ("succeeded", 0)
    assert 3000 <= _duration(view) < 60_000


def test_a_submitter_an_hour_behind_gets_its_timeout_after_the_real_duration(
        faketime: str, sleep_shim: str, env: dict[str, str]) -> None:
    """Submitted with a clock 1 h behind (its deadline looks long past to a correct clock); a
    `ql reconcile` on a correct clock right away leaves it running; it is timed out after its real
    10 s, by its launcher, with nobody looking. (10 s: room for the reconcile and the look at its
    status on a loaded machine, both before the deadline.)"""
    marker = f"30.{secrets.randbelow(10**6):06d}"
    behind = _faked(env, faketime, sleep_shim, FAKETIME="-1h")
    started = time.monotonic()
    out = run_ql(["--json", "run", "--detach", "--timeout", "10", "--", "env", "-u", "LD_PRELOAD", "sleep", marker],
                 behind)
    assert out.returncode == 0, out.stderr
    rec = json_lines(out.stdout)[0]
    _wait(lambda: pids_with(marker), "the task to start")
    counts = json_lines(run_ql(["--json", "reconcile"], env).stdout)[0]
    assert counts["timeouts_requested"] == 0 and counts["timed_out"] == 0, counts
    view = _status(env, rec["run_id"])
    if time.monotonic() - started >= 10:
        pytest.skip("this machine took more than the 10 s timeout to submit, reconcile and look")
    assert view["status"] == "running" and view["cancel_reason"] is None, view
    assert pids_with(marker)
    _wait(lambda: not pids_with(marker), "the task to be timed out by its launcher")
    _wait(lambda: _status(env, rec["run_id"])["status"] != "running", "the run to end")
    view = _status(env, rec["run_id"])
    assert (view["status"], view["reason"]) == ("timed_out", "timeout")
    assert 10_000 <= _duration(view) < 30_000
