"""A waiting host that reaps its task late never turns a result that existed in time into an intent's.

Found by the kill loop (seed 3: a host SIGSTOPped while its task ``exit 0``-ed 0.2 s into a 3 s
deadline, continued just after the deadline: ``timed_out 0``; seed 4: the same for a task that
ended before the freeze even began, while its host still waited for an earlier run). An awaited
task's publisher holds the receipt, with the launcher's finish time, while the host has not reaped
it; the host that reaps it late only knows "it ended before now" — an upper bound that may lie
past the deadline, or past a cancel committed meanwhile. That bound must not decide: the held
receipt (the result, which existed before the intent) does.

Produced for real: a host that waits for another run first (the plain API, no fault at all), and a
`ql run` SIGSTOPped across its task's end and deadline, then continued (the publisher's bounded
wait for the host's "ok" is still running then).

And the host must not reap an awaited task's launcher before it acknowledged it (seed 4: hosts
frozen between the reap and the commit). Recovery recognises a publisher holding a result only
beside its zombie launcher; a reaped one leaves the publisher looking like an orphaned process of
the task, so a reconciler's timeout TERMed it ("signalled": the intent decides, ``timed_out 3`` for
a task that exited 3 in time) and its KILL after the grace destroyed the result. Produced with the
host's own reaper (each new launcher reaps exited, unwaited ones) and a real `ql reconcile`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import QL, json_lines, release_host, run_ql
from tests.processes import proc_stat

BOUND_S = 90


def test_a_host_busy_with_another_run_past_the_deadline_keeps_the_tasks_own_outcome(open_rt) -> None:
    rt = open_rt()
    first = rt.submit(["sh", "-c", "sleep 3"], awaited=True)
    quick = rt.submit(["sh", "-c", "exit 3"], timeout_s=1.5, awaited=True)  # ends at once, unreaped
    assert rt.wait(first).status == "succeeded"  # meanwhile `quick`'s deadline passed
    view = rt.wait(quick)
    assert (view.status, view.exit_code) == ("failed", 3), view
    assert "run.timed_out" not in [e.type for e in rt.events(quick.run_id)]


def test_a_cancel_after_the_end_but_before_the_late_reap_is_moot(open_rt) -> None:
    rt = open_rt()
    first = rt.submit(["sh", "-c", "sleep 2"], awaited=True)
    quick = rt.submit(["sh", "-c", "exit 4"], awaited=True)
    time.sleep(0.5)  # `quick` has ended; its launcher waits, unreaped, with its result
    rt.cancel(quick.run_id)
    assert rt.wait(first).status == "succeeded"
    view = rt.wait(quick)
    assert (view.status, view.exit_code) == ("failed", 4), view
    assert "run.cancel_moot" in [e.type for e in rt.events(quick.run_id)]


def test_an_awaited_launcher_is_not_reaped_before_its_host_acknowledged_it(open_rt, ql_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    rt = open_rt()
    quick = rt.submit(["sh", "-c", "exit 3"], timeout_s=2, awaited=True)
    time.sleep(0.5)  # `quick` ended: its launcher exited, its publisher holds the result
    other = rt.submit(["sh", "-c", "sleep 4"], awaited=True)  # a new launcher reaps exited ones
    time.sleep(2.0)  # past `quick`'s deadline
    config = tmp_path / "grace.toml"
    config.write_text("[limits]\ncancel_grace_s = 0.2\n")
    env = dict(ql_env, QL_CONFIG=str(config))
    for _ in range(3):  # the timeout's intent, its TERM, and its KILL after the grace, if any were sent
        out = run_ql(["--json", "reconcile"], env, timeout=BOUND_S)
        assert out.returncode == 0, out.stderr
        time.sleep(0.3)
    assert rt.wait(other).status == "succeeded"
    view = rt.wait(quick)
    assert (view.status, view.exit_code) == ("failed", 3), view


def test_a_ql_run_continued_after_its_tasks_deadline_exits_with_the_tasks_code(ql_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    go = tmp_path / "go"
    host = subprocess.Popen(QL + ["--json", "run", "--timeout", "8", "--", "sh", "-c",
                                  f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 3'],
                            env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        run_id = json.loads(host.stdout.readline())["run_id"]
        started = time.monotonic()
        os.kill(host.pid, signal.SIGSTOP)
        end = time.monotonic() + BOUND_S
        while (proc_stat(host.pid) or ["?"])[0] not in ("T", "t"):
            assert time.monotonic() < end
            time.sleep(0.01)
        go.touch()  # the task ends now, long before its deadline; its host is frozen
        time.sleep(max(0.0, started + 9 - time.monotonic()))  # past the deadline, within the publisher's wait
        os.kill(host.pid, signal.SIGCONT)
        stdout, stderr = host.communicate(timeout=BOUND_S)
    finally:
        if host.poll() is None:
            os.kill(host.pid, signal.SIGCONT)
        release_host(host, go)  # type: ignore[arg-type]
    final = json_lines(stdout)[-1]
    assert (final["run_id"], final["status"], final["exit_code"]) == (run_id, "failed", 3), (final, stderr)
    assert host.returncode == 3, stderr
