"""A frozen waiting host never turns a task that finished in time into ``timed_out``.

The review's reproduction: the `ql run` host SIGSTOPped, its task exited 3 well before its deadline;
at the deadline recovery sent TERM and KILL to the launcher's group — which then held nothing but
the publisher with the task's result — and recorded ``timed_out`` without an exit code; resumed,
`ql run` exited 124. Now recovery signals and decides nothing while an exited launcher's publisher
may still publish (its wait for the host's "ok" is bounded), and the result decides: ``failed 3``.
`ql reconcile` during the freeze returns (nothing it does waits on the stopped host).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import QL, json_lines, run_ql
from tests.processes import proc_stat

BOUND_S = 90
#: Long enough for a loaded machine to start `ql run`; the task ends ENDS_BEFORE_S before it, so
#: its publisher (bounded wait for the frozen host's "ok", 10 s) is still waiting at the deadline.
DEADLINE_S = 25
ENDS_BEFORE_S = 5


def _status(env: dict[str, str], run_id: str) -> dict:
    out = run_ql(["--json", "status", run_id], env, timeout=BOUND_S)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def _reconcile(env: dict[str, str]) -> dict:
    out = run_ql(["--json", "reconcile"], env, timeout=BOUND_S)  # bounded: raises if it hangs
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)[0]


def test_a_task_done_before_its_deadline_under_a_frozen_host_keeps_its_status(ql_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    config = tmp_path / "ql.toml"
    config.write_text("[limits]\ncancel_grace_s = 1.0\n")  # a KILL, were one sent, would come at once
    env = dict(ql_env, QL_CONFIG=str(config))
    go = tmp_path / "go"
    started = time.monotonic()
    host = subprocess.Popen(QL + ["--json", "run", "--timeout", str(DEADLINE_S), "--", "sh", "-c",
                                  f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 3'],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = json.loads(host.stdout.readline())["run_id"]  # type: ignore[union-attr]
        os.kill(host.pid, signal.SIGSTOP)
        assert (proc_stat(host.pid) or ["?"])[0] in ("T", "t") or _stopped_soon(host.pid)
        time.sleep(max(0.0, started + DEADLINE_S - ENDS_BEFORE_S - time.monotonic()))
        assert time.monotonic() - started < DEADLINE_S - 1, "too slow to end the task before its deadline"
        go.touch()  # the task ends now, before its deadline
        counts = _reconcile(env)  # during the freeze: returns, and decides nothing false
        assert counts["timed_out"] == 0 and counts["lost"] == 0, counts
        time.sleep(max(0.0, started + DEADLINE_S + 0.5 - time.monotonic()))
        view = _status(env, run_id)
        signalled = 0
        end = time.monotonic() + BOUND_S
        while view["status"] == "running":  # at and after the deadline, rounds as a supervisor does
            assert time.monotonic() < end, view
            counts = _reconcile(env)
            signalled += counts.get("other", {}).get("dispatch_signalled", 0)
            signalled += counts.get("other", {}).get("dispatch_killed", 0)
            view = _status(env, run_id)
            time.sleep(0.5)
        assert (view["status"], view["exit_code"]) == ("failed", 3), view
        assert signalled == 0  # nothing was sent to a launcher that had already exited
    finally:
        os.kill(host.pid, signal.SIGCONT)
        go.touch()
    stdout, stderr = host.communicate(timeout=BOUND_S)
    assert host.returncode == 3, stderr
    final = json_lines(stdout)[-1]
    assert (final["status"], final["exit_code"]) == ("failed", 3)


def _stopped_soon(pid: int) -> bool:
    end = time.monotonic() + BOUND_S
    while (proc_stat(pid) or ["?"])[0] not in ("T", "t"):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


FIRST_USE_HOLDER = r"""
import os, signal, sys
from pathlib import Path
from ql_core.paths import first_use_lock

with first_use_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen in the middle of a data dir's first use
"""


def test_reconcile_does_not_wait_for_ever_on_a_host_frozen_in_its_first_use(ql_env: dict[str, str],
                                                                             data_dir: Path) -> None:
    """The review's hanging `ql reconcile`: the frozen `ql run` held the data dir's first-use lock."""
    import sys

    from ql_core.paths import LOCK_WAIT_S

    holder = subprocess.Popen([sys.executable, "-c", FIRST_USE_HOLDER, str(data_dir)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert _stopped_soon(holder.pid)
        out = run_ql(["reconcile"], ql_env, timeout=LOCK_WAIT_S + BOUND_S)  # raises if it hangs
        assert out.returncode == 1, (out.returncode, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "first use" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    finally:
        holder.kill()
        holder.communicate()
    # Once the holder is gone, the same data dir works.
    assert run_ql(["run", "--", "true"], ql_env, timeout=BOUND_S).returncode == 0
