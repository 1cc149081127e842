"""A host that forks through libc (``fork()`` from C: no ``os.register_at_fork`` hook runs) and dies.

Its child inherits copies of every launcher channel, so "the host's end closed" never happens while
the child lives. Before: the host's idle standby outlived it, and its finished awaited task stayed
``running`` until the child exited. Now the idle standby follows its owner's pidfd (it exits when
its host dies, whoever holds the channel), and the awaited task's publisher waits for the host's
"ok" a bounded time, then publishes: the run ends with the task's true status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ql_core.testing.executor import wait_until
from tests.conftest import run_ql
from tests.processes import proc_stat, standbys_of

BOUND_S = 90

HOST = r"""
import ctypes, json, os, sys, time
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime

data_dir, go = Path(sys.argv[1]), sys.argv[2]
rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
rt.wait(rt.submit(["true"], awaited=True))  # from the second hand-over on a standby is kept ready
sub = rt.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 5'], awaited=True)
child = ctypes.CDLL(None).fork()
if child == 0:
    time.sleep(300)  # holds a copy of every channel; runs nothing of ql's
    os._exit(0)
print(json.dumps({"run_id": sub.run_id, "launcher": sub.task.live.child.pid, "forked": child}), flush=True)
time.sleep(300)
"""


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped (a reparented one, under some inits)."""
    stat = proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def _wait(predicate, what: str):  # type: ignore[no-untyped-def]
    return wait_until(predicate, what, BOUND_S, interval=0.05)


def test_a_host_that_forked_through_libc_and_died_leaves_no_standby_and_no_stuck_run(
        ql_env: dict[str, str], data_dir: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    host = subprocess.Popen([sys.executable, "-c", HOST, str(data_dir), str(go)], env=ql_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    forked = None
    try:
        line = host.stdout.readline()  # type: ignore[union-attr]
        assert line, host.stderr.read()  # type: ignore[union-attr]
        info = json.loads(line)
        forked = info["forked"]
        idle = _wait(lambda: [pid for pid in standbys_of(host.pid) if pid != info["launcher"]],
                     "the host's idle standby")
        host.kill()  # SIGKILL: no clean-up of any kind; its forked child lives on with the channels
        host.wait(timeout=BOUND_S)  # (not communicate: the forked child holds the pipes too)
        assert not _gone(forked)
        _wait(lambda: all(_gone(pid) for pid in idle), "the dead host's idle standby to exit")
        assert proc_stat(info["launcher"]) is not None  # (the task's own launcher still runs its task)

        go.touch()  # the awaited task ends now; its host is dead, its channel still held open

        def ended() -> dict | None:
            out = run_ql(["--json", "reconcile"], ql_env, timeout=BOUND_S)
            assert out.returncode == 0, out.stderr
            view = json.loads(run_ql(["--json", "status", info["run_id"]], ql_env).stdout.splitlines()[0])
            return view if view["status"] != "running" else None

        view = _wait(ended, "the run to end while the forked child lives")
        assert (view["status"], view["exit_code"]) == ("failed", 5), view
        assert not _gone(forked)  # it ended with the child still holding the channel
    finally:
        go.touch()
        if forked is not None:
            try:
                os.kill(forked, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if host.poll() is None:
            host.kill()
            host.wait(timeout=BOUND_S)
        for pipe in (host.stdout, host.stderr):
            if pipe is not None:
                pipe.close()
