"""A task cannot escape its stop: each task in its own cgroup v2, stopped with ``cgroup.kill``.

Before, a task that moved itself into its own session (``setsid``) and ignored TERM survived its
timeout while the run said ``timed_out``, and double-forked grandchildren outlived their runs. With
cgroup v2 writable here (root, or a delegated cgroup) every process a task started is in the task's
cgroup, and the KILL of a stop reaches all of them. Both launchers. Processes are found by a unique
marker in their argv (/proc); the task cgroup is looked for by the attempt id. Without containment
(``containment = "process-group"``) the old behaviour stays, and ``ql doctor`` says so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest

from ql_core.testing.executor import wait_until
from ql_executors.local_process.containment import find_containment
from tests.conftest import detach_json, json_lines, published_receipt, run_ql, status_json
from tests.processes import argv_with, pids_with

BOUND_S = 60

#: Leaves the task's process group and session and ignores TERM: only a KILL that finds it by
#: something else than its group (its cgroup) ends it.
ESCAPEE = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.setsid()
while True:
    time.sleep(1)
"""

#: A double fork: the grandchild (setsid, TERM ignored) is reparented away; the task's own
#: process goes on sleeping until it is stopped.
DOUBLE_FORK = """
import os, signal, sys, time
if os.fork() == 0:
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setsid()
        while True:
            time.sleep(1)
    os._exit(0)
os.wait()
time.sleep(600)
"""

_CONTAINMENT = find_containment("auto", create=False)
needs_cgroup = pytest.mark.skipif(_CONTAINMENT.parent is None,
                                  reason=f"cgroup v2 not usable here: {_CONTAINMENT.reason}")


def _config(tmp_path: Path, ql_env: dict[str, str], local: str) -> dict[str, str]:
    config = tmp_path / "ql.toml"
    config.write_text(f"[limits]\ncancel_grace_s = 1\n\n[plugin.local]\n{local}")
    return dict(ql_env, QL_CONFIG=str(config))


@pytest.fixture(params=["compiled", "compiled-classic", "shell"])
def env(request: pytest.FixtureRequest, ql_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    launcher = {"compiled": 'launcher = "compiled"\n',
                "compiled-classic": 'launcher = "compiled"\nstandby = false\n',
                "shell": 'launcher = "shell"\n'}[request.param]
    return _config(tmp_path, ql_env, launcher)


@pytest.fixture
def marker() -> object:
    word = f"esc{secrets.token_hex(6)}"
    yield word
    for entry in os.listdir("/proc"):  # a failed test leaves nothing behind (its shell included)
        try:
            if entry.isdigit() and word.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass


def _outside_launchers(marker: str) -> list[int]:
    """Live processes of the task: those holding ``marker`` but a launcher (whose argv holds the
    command too, and which lives on for a moment after it published the receipt). Each argv is the
    one read that found the marker: this runs the moment the receipt appears, when the launcher is
    exiting, and a second read of its cmdline would come back empty (not a launcher, then)."""
    return [pid for pid, argv in argv_with(marker).items()
            if not any(b"launcher" in os.path.basename(word) for word in argv[:2])]


def _launchers_gone(marker: str) -> None:
    wait_until(lambda: not pids_with(marker), "the launcher to exit after its receipt", BOUND_S, interval=0.05)


def _task_pids(marker: str) -> set[int]:
    """The task's python processes (not a launcher, whose argv holds the command too)."""
    return {pid for pid, argv in argv_with(marker).items() if argv[0] == os.fsencode(sys.executable)}



def _escaping(marker: str) -> list[str]:
    """A shell task that starts the escapee in the background and waits: TERM ends the shell, the
    escapee stays (without containment)."""
    return ["sh", "-c", f'{sys.executable} -c "$1" {marker} & wait', "sh", ESCAPEE]


@needs_cgroup
def test_a_setsid_task_ignoring_term_does_not_survive_its_timeout(
        env: dict[str, str], data_dir: Path, marker: str) -> None:
    out = run_ql(["--json", "run", "--timeout", "2", "--", *_escaping(marker)], env)
    assert out.returncode == 124, (out.returncode, out.stderr)
    rec = json_lines(out.stdout)[-1]
    view = status_json(env, rec["run_id"])
    assert (view["status"], view["reason"]) == ("timed_out", "timeout")
    assert pids_with(marker) == [], "a process of the task outlived its timed_out run"
    assert not (Path(_CONTAINMENT.parent) / rec["attempt_id"]).exists(), "the task's cgroup was left behind"


@needs_cgroup
def test_a_detached_setsid_task_is_stopped_at_its_deadline_with_nobody_looking(
        env: dict[str, str], data_dir: Path, marker: str) -> None:
    rec = detach_json(env, "--timeout", "2", "--", *_escaping(marker))
    wait_until(lambda: pids_with(marker), "the escapee to start", BOUND_S, interval=0.05)
    receipt = published_receipt(data_dir, rec["attempt_id"])  # the launcher publishes after it stopped all
    assert receipt["exitCode"] == 143
    assert _outside_launchers(marker) == [], "the escapee outlived the receipt of its stopped run"
    _launchers_gone(marker)
    assert not (Path(_CONTAINMENT.parent) / rec["attempt_id"]).exists()
    view = status_json(env, rec["run_id"])
    assert (view["status"], view["reason"]) == ("timed_out", "timeout")


@needs_cgroup
def test_a_double_forked_grandchild_dies_on_cancel(env: dict[str, str], data_dir: Path, marker: str) -> None:
    rec = detach_json(env, "--", sys.executable, "-c", DOUBLE_FORK, marker)
    wait_until(lambda: len(_task_pids(marker)) == 2, "the task and its grandchild", BOUND_S, interval=0.05)
    cgroup = Path(_CONTAINMENT.parent) / rec["attempt_id"]
    procs = {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
    assert _task_pids(marker) <= procs, "the task's processes are in its cgroup"
    assert run_ql(["cancel", rec["run_id"]], env).returncode == 0
    assert published_receipt(data_dir, rec["attempt_id"])["exitCode"] == 143  # the task itself dies of TERM
    assert _outside_launchers(marker) == [], "the double-forked grandchild outlived the cancel"
    _launchers_gone(marker)
    assert not cgroup.exists()
    assert status_json(env, rec["run_id"])["status"] == "cancelled"


@needs_cgroup
def test_a_shell_launcher_whose_cgroup_another_process_removed_publishes_at_once(
        ql_env: dict[str, str], tmp_path: Path, data_dir: Path, marker: str) -> None:
    """A cancel's cgroup.kill empties the task's cgroup, and another ql process's sweep may remove
    it before the launcher's own rmdir. launcher.sh looped on its failing rmdir then (500 looks,
    each a fork of rmdir and of sleep: 5 s at best, 22 s under load) before it published; it now
    waits only while the cgroup is populated, as launcher.c does."""
    env = _config(tmp_path, ql_env, 'launcher = "shell"\n')
    rec = detach_json(env, "--", sys.executable, "-c", "import time; time.sleep(600)", marker)
    wait_until(lambda: _task_pids(marker), "the task to start", BOUND_S, interval=0.05)
    cgroup = Path(_CONTAINMENT.parent) / rec["attempt_id"]
    # Not a task cgroup's name: no sweep touches it.
    aside = Path(_CONTAINMENT.parent) / f"test-aside-{secrets.token_hex(4)}"
    aside.mkdir()
    try:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            (aside / "cgroup.procs").write_text(pid)  # its cgroup emptied...
        cgroup.rmdir()  # ...and removed by someone else
        task = _task_pids(marker)
        assert run_ql(["cancel", rec["run_id"]], env).returncode == 0
        wait_until(lambda: not (_task_pids(marker) & task), "the task to die of the TERM", BOUND_S, interval=0.02)
        ended = time.monotonic()  # the launcher's clean-up starts here, whatever `ql cancel` cost
        assert published_receipt(data_dir, rec["attempt_id"])["exitCode"] == 143
        took = time.monotonic() - ended
        # The spin's floor is 500 sleeps of 10 ms and 1000 forks; without it this takes a fraction
        # of a second (up to ~1 s on a loaded machine: the publication's own forks).
        assert took < 4.5, f"the launcher took {took:.1f}s to publish after its task ended"
        _launchers_gone(marker)
    finally:
        for pid in _task_pids(marker):  # left by a failed assertion: the side cgroup goes only empty
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _task_pids(marker), "the task to end", BOUND_S, interval=0.05)
        with contextlib.suppress(OSError):
            aside.rmdir()
    assert status_json(env, rec["run_id"])["status"] == "cancelled"


def test_without_cgroups_the_process_group_is_the_old_limit(
        ql_env: dict[str, str], tmp_path: Path, data_dir: Path, marker: str) -> None:
    """``containment = "process-group"``: the run still ends ``timed_out``, but the escapee that left
    the group survives it (the documented limit), and doctor names the containment and why."""
    env = _config(tmp_path, ql_env, 'containment = "process-group"\n')
    doctor = run_ql(["doctor"], env)
    line = next(ln for ln in doctor.stdout.splitlines() if " containment " in ln)
    assert line.split(None, 2)[2] == 'process group ([plugin.local] containment = "process-group")', line
    out = run_ql(["--json", "run", "--timeout", "2", "--", *_escaping(marker)], env)
    assert out.returncode == 124, (out.returncode, out.stderr)
    assert status_json(env, json_lines(out.stdout)[-1]["run_id"])["status"] == "timed_out"
    survivors = pids_with(marker)
    assert survivors, "without a cgroup the escapee is out of reach of the group KILL"
    cgroup = Path(f"/proc/{survivors[0]}/cgroup").read_text()
    assert "ql-" not in cgroup, cgroup


@needs_cgroup
def test_doctor_names_the_cgroup_parent(ql_env: dict[str, str], tmp_path: Path) -> None:
    doctor = run_ql(["doctor"], _config(tmp_path, ql_env, ""))
    line = next(ln for ln in doctor.stdout.splitlines() if " containment " in ln)
    assert line.split(None, 2)[2] == f"cgroup v2 ({_CONTAINMENT.parent})", line


@needs_cgroup
def test_the_host_kill_reaches_the_cgroup_of_a_task_whose_launcher_was_killed(
        env: dict[str, str], data_dir: Path, marker: str) -> None:
    """``kill -9`` of the launcher alone: its command runs on in the launcher's group and ql's own
    KILL after a cancel's grace (here: the next ``ql reconcile``) goes to the group — and, found
    through a member of that group, to the task's cgroup, where the escapee is."""
    if "shell" in Path(env["QL_CONFIG"]).read_text():
        # Not containment's: a launcher.sh killed on its own leaves its helper (a quota watcher, of
        # the launcher's name, in its group), and recovery then never sends the KILL at all.
        pytest.skip("a launcher.sh killed alone leaves its quota helper; ql's KILL is then never sent")
    script = f"trap '' TERM; {sys.executable} -c \"$1\" {marker} & while :; do sleep 1; done"
    rec = detach_json(env, "--", "sh", "-c", script, "sh", ESCAPEE)
    wait_until(lambda: _task_pids(marker), "the escapee to start", BOUND_S, interval=0.05)
    escapee = next(iter(_task_pids(marker)))
    shell = int(Path(f"/proc/{escapee}/stat").read_text().rsplit(")", 1)[1].split()[1])
    launcher = os.getpgid(shell)
    assert launcher not in (shell, os.getpgid(0))
    os.kill(launcher, signal.SIGKILL)
    assert run_ql(["cancel", rec["run_id"]], env).returncode == 0

    def stopped() -> bool:
        assert run_ql(["reconcile"], env).returncode == 0
        return not _task_pids(marker)

    wait_until(stopped, "ql's KILL after the grace to reach the escapee", BOUND_S, interval=0.5)
    wait_until(lambda: status_json(env, rec["run_id"])["status"] in ("cancelled", "lost"), "the run to end", BOUND_S,
               interval=0.5)


@needs_cgroup
def test_the_task_sees_only_its_attempt_id_in_its_cgroup_and_no_launcher_variable(
        env: dict[str, str]) -> None:
    out = run_ql(["--json", "run", "--", "sh", "-c", "env; cat /proc/self/cgroup"], env)
    assert out.returncode == 0, out.stderr
    rec = json_lines(out.stdout)[-1]
    logs = run_ql(["logs", rec["run_id"]], env)
    assert logs.returncode == 0, logs.stderr
    assert "_ql_" not in logs.stdout
    line = next(ln for ln in logs.stdout.splitlines() if ln.startswith("0::"))
    assert line.endswith("/ql-%d/%s" % (os.geteuid(), rec["attempt_id"])), line
    assert not (Path(_CONTAINMENT.parent) / rec["attempt_id"]).exists()


@needs_cgroup
def test_a_sweep_removes_empty_task_cgroups_left_by_a_crash_and_spares_one_in_use(
        ql_env: dict[str, str], tmp_path: Path) -> None:
    import subprocess
    import uuid

    parent = Path(_CONTAINMENT.parent)
    parent.mkdir(exist_ok=True)
    left = parent / str(uuid.uuid4())  # what a launcher SIGKILLed before its removal leaves
    left.mkdir()
    busy = parent / str(uuid.uuid4())
    busy.mkdir()
    holder = subprocess.Popen(["sh", "-c", 'echo 0 > "$1/cgroup.procs" && exec sleep 600', "sh", str(busy)])
    try:
        wait_until(lambda: (busy / "cgroup.procs").read_text().split(), "a process in the busy cgroup", BOUND_S)
        out = run_ql(["run", "--", "true"], _config(tmp_path, ql_env, ""))  # an executor starts: a sweep
        assert out.returncode == 0, out.stderr
        assert not left.exists(), "an empty task cgroup was left behind"
        assert busy.exists(), "a cgroup with a process in it was removed"
    finally:
        holder.kill()
        holder.wait()
        # Another test's executor may sweep the cgroup away the moment it empties: gone is empty too.
        wait_until(lambda: not _procs_in(busy), "the busy cgroup to empty", BOUND_S)
        with contextlib.suppress(FileNotFoundError):
            busy.rmdir()


def _procs_in(cgroup: Path) -> list[str]:
    """The pids in ``cgroup`` (none when a sweep has removed it)."""
    try:
        return (cgroup / "cgroup.procs").read_text().split()
    except FileNotFoundError:
        return []


def test_doctor_names_why_a_configured_parent_is_not_used(ql_env: dict[str, str], tmp_path: Path) -> None:
    plain = tmp_path / "not-a-cgroup"
    plain.mkdir()
    env = _config(tmp_path, ql_env, f'cgroup_parent = "{plain}"\n')
    doctor = run_ql(["doctor"], env)
    line = next(ln for ln in doctor.stdout.splitlines() if " containment " in ln)
    assert line.split(None, 2)[2] == f"process group (not a cgroup v2 directory: {plain})", line
    bad = run_ql(["doctor"], _config(tmp_path, ql_env, 'cgroup_parent = "relative"\n'))
    assert bad.returncode == 2 and "cgroup_parent must be an absolute path" in bad.stderr, bad.stderr
