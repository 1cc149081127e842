"""Standby launchers (docs/launcher.md, "Standby launchers") under real faults.

A standby is a compiled launcher started before its run exists; its handle goes into the run's
create commit and one message hands it the run. What must hold whatever happens to it:

- a standby that died or was stopped while idle never costs a run, and never blocks the host;
- one that dies between being taken and the hand-over ends its run ``failed`` (nothing ran, and
  the host knows it: the message was never delivered) — or ``lost`` when the message was queued
  and nobody can tell; never a status nobody saw;
- a cancel that reaches a standby before its run does ends the run cancelled, the command unrun;
- a forked host never touches its parent's standby; threads each get their own; a runtime closed,
  collected or exiting leaves no standby (and no zombie) behind;
- the task sees the host's environment and working directory as of the submit, as with Popen;
- what a standby cannot take (a spec over one message) runs the classic way, unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ql_core.testing.executor import wait_until
from tests import dbview
from tests.as_nobody import AS_NOBODY, nobody_env
from tests.processes import (
    proc_stat,
    standby_launchers,
    standbys_of,
    under_subreaper,
    zombie_children,
)

BOUND_S = 30


def _wait(predicate, what: str, timeout: float = BOUND_S):  # type: ignore[no-untyped-def]
    return wait_until(predicate, what, timeout)


def _events(rt: Any, run_id: str) -> list[str]:
    return [e.type for e in rt.events(run_id)]


@pytest.fixture
def rt(standby_rt: Any) -> Any:
    return standby_rt  # tests/truth/conftest.py: skipped (failed under CI) without the compiled launcher


def _ready_standby(rt: Any) -> int:
    """Run two tasks so the runtime keeps a standby ready (from the second hand-over on); its pid."""
    for _ in range(2):
        assert rt.wait(rt.submit(["true"], awaited=True)).status == "succeeded"
    return int(_wait(lambda: standbys_of(os.getpid()) and standbys_of(os.getpid())[0], "a ready standby"))


def test_a_standby_that_died_idle_is_replaced_and_costs_no_run(rt: Any, tmp_path: Path) -> None:
    ready = _ready_standby(rt)
    os.kill(ready, signal.SIGKILL)
    _wait(lambda: (proc_stat(ready) or ["Z"])[0] == "Z", "the standby to die")
    marker = tmp_path / "ran"
    view = rt.wait(rt.submit(["sh", "-c", f'touch "{marker}"; exit 4']))
    assert (view.status, view.exit_code) == ("failed", 4) and marker.exists()
    assert ready not in zombie_children(os.getpid())  # the dead one was reaped when it was found


def test_a_standby_that_dies_before_the_hand_over_fails_its_run_and_runs_nothing(
        rt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The message cannot be delivered to a dead standby: the host knows nothing ran (failed,
    SPAWN_FAILED, one terminal event), as for any spawn that never happened — and the submit
    stands (a host must never die of a launcher's death): it returns, the run already ended."""
    from ql_executors.local_process import executor as local

    taken: list[tuple[Any, Any]] = []
    real_start, real_hand_over = rt.executor.start, local.hand_over

    def start(task: Any, request: Any, *, log_fd: int) -> None:
        taken.append((task, request))
        real_start(task, request, log_fd=log_fd)

    def die_first(channel: Any, message: bytes, **fds: int) -> None:
        pid = taken[-1][0].live.process.pid  # the standby being handed its run, killed for real
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: (proc_stat(pid) or ["Z"])[0] == "Z", "the standby to die")
        real_hand_over(channel, message, **fds)

    monkeypatch.setattr(rt.executor, "start", start)
    monkeypatch.setattr(local, "hand_over", die_first)
    marker = tmp_path / "ran"
    sub = rt.submit(["sh", "-c", f'touch "{marker}"'])
    monkeypatch.undo()
    view = rt.wait(sub)
    assert view.run_id == taken[0][1].run_id
    assert (view.status, view.reason) == ("failed", "SPAWN_FAILED")
    assert _events(rt, view.run_id) == ["run.created", "attempt.spawned", "attempt.failed", "run.failed"]
    assert not marker.exists()
    assert taken[0][0].live.process.pid not in zombie_children(os.getpid())  # reaped by the abort
    assert rt.wait(rt.submit(["true"])).status == "succeeded"  # the runtime goes on


def test_a_stopped_standby_is_never_handed_a_run_and_never_blocks_the_host(rt: Any) -> None:
    """SIGSTOP the ready standby: the next submit sees it stopped, kills and reaps it (it held
    nothing) and starts its task on a fresh one at once; closing a runtime whose ready standby is
    stopped returns at once too."""
    ready = _ready_standby(rt)
    os.kill(ready, signal.SIGSTOP)
    _wait(lambda: (proc_stat(ready) or ["Z"])[0] == "T", "the standby to stop")
    view = rt.wait(rt.submit(["sh", "-c", "exit 3"], awaited=True))
    assert (view.status, view.exit_code) == ("failed", 3)
    assert proc_stat(ready) is None, "the stopped standby is gone (killed and reaped)"
    again = int(_wait(lambda: standbys_of(os.getpid()) and standbys_of(os.getpid())[0], "a new standby"))
    os.kill(again, signal.SIGSTOP)
    closer = threading.Thread(target=rt.close)
    closer.start()
    closer.join(BOUND_S)
    assert not closer.is_alive(), "close blocked on a stopped standby"
    assert standbys_of(os.getpid()) == [] and again not in zombie_children(os.getpid())


def test_a_stray_signal_to_an_idle_standby_costs_no_run(rt: Any, tmp_path: Path) -> None:
    """TERM to the idle standby ends it (nothing of a run is in it); the next run is not charged
    with it: it starts on a fresh standby and ends with its own status."""
    ready = _ready_standby(rt)
    os.kill(ready, signal.SIGTERM)
    _wait(lambda: (proc_stat(ready) or ["Z"])[0] == "Z", "the standby to exit")
    marker = tmp_path / "ran"
    view = rt.wait(rt.submit(["sh", "-c", f'touch "{marker}"; exit 6'], awaited=True))
    assert (view.status, view.exit_code) == ("failed", 6) and marker.exists()


def test_a_task_cannot_read_its_hosts_environment_from_the_standby(rt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task can read its parent's environment (``/proc/$PPID/environ``): a standby has none, so a
    host secret set at runtime stays the host's when the task is given its own ``env``."""
    monkeypatch.setenv("QLTEST_HOST_SECRET", "s3cr3t")
    _ready_standby(rt)
    out = Path(rt.config.data_dir) / "seen"
    script = f'cat "/proc/$PPID/environ" > "{out}"; printf "%s" "$ONLY" >> "{out}"'
    view = rt.wait(rt.submit(["sh", "-c", script], env={"PATH": os.environ["PATH"], "ONLY": "mine"}))
    assert view.status == "succeeded"
    assert out.read_bytes() == b"mine"  # the launcher's environment is empty; the task got its own


def test_a_cancel_that_reaches_the_standby_first_ends_the_run_cancelled_unrun(
        rt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel intent is committed and TERM sent to the standby's group after the create commit,
    before the hand-over (another client, a moment earlier): the standby remembers the signal and
    its child re-delivers it instead of running the command; the run ends cancelled."""
    marker = tmp_path / "ran"
    real_start = rt.executor.start

    def cancel_then_start(task: Any, request: Any, *, log_fd: int) -> None:
        assert str(rt.cancel(request.run_id)) == "requested"  # TERM is sent before this returns
        real_start(task, request, log_fd=log_fd)

    monkeypatch.setattr(rt.executor, "start", cancel_then_start)
    sub = rt.submit(["sh", "-c", f'touch "{marker}"; exit 0'])
    monkeypatch.undo()
    view = rt.wait(sub)
    assert view.status == "cancelled" and not marker.exists()
    assert _events(rt, view.run_id).count("run.cancelled") == 1


def test_a_forked_host_never_uses_or_reaps_its_parents_standby(rt: Any) -> None:
    from ql_core.ports.journal import TaskSpec

    ready = _ready_standby(rt)
    pid = os.fork()
    if pid == 0:  # the child: the executor object is shared memory, the standby is not its own
        code = 1
        try:
            task = rt.executor.standby(TaskSpec(command=("true",)), awaited=False)
            theirs = task.live.process.pid if task is not None else None
            if task is not None:
                rt.executor.abort(task)
            code = 0 if theirs is not None and theirs != ready else 2
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert standbys_of(os.getpid()) == [ready]  # untouched, still ours, still idle
    view = rt.wait(rt.submit(["sh", "-c", "exit 5"]))
    assert (view.status, view.exit_code) == ("failed", 5)
    handle = dbview.row(rt, "ql_run_attempt", view.attempts[0].attempt_id)["handle"]
    assert json.loads(handle)["pid"] == ready  # the parent used its own standby


def test_threads_submitting_at_once_all_end_true(rt: Any) -> None:
    results: list[tuple[int, str, int | None]] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(5):
            code = (n * 5 + i) % 7
            view = rt.wait(rt.submit(["sh", "-c", f"exit {code}"], awaited=i % 2 == 0))
            with lock:
                results.append((code, view.status, view.exit_code))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 30
    assert all((status, code) == ("succeeded" if want == 0 else "failed", want) for want, status, code in results)


def _factories_of(parent: int) -> list[int]:
    """Standby factories (``launcher --factory``) whose parent is ``parent``, zombies included."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (st := proc_stat(int(pid))) is not None and int(st[1]) == parent:
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"--factory"]:
                    found.append(int(pid))
            except OSError:
                continue
    return found


def test_close_discards_the_ready_standby_and_leaves_no_zombie(rt: Any) -> None:
    others = set(_factories_of(os.getpid()))  # another test's in this worker process (tests/launcher)
    ready = _ready_standby(rt)
    for _ in range(2):  # from the second hand-over on, the standbys come from the factory
        assert rt.wait(rt.submit(["true"], awaited=True)).status == "succeeded"
    (factory,) = set(_factories_of(os.getpid())) - others
    forked = int(_wait(lambda: standbys_of(os.getpid()) and standbys_of(os.getpid())[0], "a ready standby"))
    rt.close()
    assert standbys_of(os.getpid()) == []
    assert ready not in zombie_children(os.getpid()) and forked not in zombie_children(os.getpid())
    assert factory not in _factories_of(os.getpid())  # the factory is gone too, reaped
    rt.close()  # idempotent


def test_a_failed_factory_costs_no_run_and_standbys_come_the_classic_way(rt: Any) -> None:
    """The factory killed (or stopped answering): the next refill finds it gone, discards it and
    starts its standby the classic way — or a new factory — and every run still ends true."""
    others = set(_factories_of(os.getpid()))  # another test's in this worker process (tests/launcher)
    _ready_standby(rt)
    assert rt.wait(rt.submit(["true"], awaited=True)).status == "succeeded"
    (factory,) = set(_factories_of(os.getpid())) - others
    os.kill(factory, signal.SIGKILL)
    for code in (3, 0, 4):
        view = rt.wait(rt.submit(["sh", "-c", f"exit {code}"], awaited=True))
        assert (view.status, view.exit_code) == ("succeeded" if code == 0 else "failed", code)
    assert factory not in zombie_children(os.getpid())  # reaped when it was discarded
    assert len(set(_factories_of(os.getpid())) - others) <= 1


HOST = r"""
import gc, os, sys, warnings
warnings.simplefilter("error")
from ql_core.config import load_config
from ql_core.runtime import Runtime
rt = Runtime.open(load_config(data_dir=sys.argv[1], environ={}, cwd=sys.argv[1]))
for _ in range(3):
    assert rt.wait(rt.submit(["true"], awaited=True)).status == "succeeded"
if sys.argv[2] == "drop":
    del rt
    gc.collect()
    print("dropped", os.getpid(), flush=True)
    sys.stdin.readline()  # the test looks for standbys now, then lets us exit
else:
    print("exiting", os.getpid(), flush=True)
"""


def _standbys_under(reaper: int) -> list[int]:
    """Live standbys in the subtree of ``reaper`` (a :func:`tests.processes.under_subreaper` wrapper):
    its host's, and, once the host died, the host's orphans (reparented to the wrapper) — this
    test's own, whatever other tests or hosts run on the machine at the same time."""
    live = standby_launchers()
    return [pid for pid, parent in live.items() if parent == reaper
            or (st := proc_stat(parent)) is not None and int(st[1]) == reaper]


@pytest.mark.parametrize("how", ["drop", "exit"])
def test_a_runtime_collected_or_exiting_without_close_leaves_no_standby(data_dir: Path, how: str) -> None:
    host = subprocess.Popen(under_subreaper([sys.executable, "-c", HOST, str(data_dir), how], bound_s=BOUND_S),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with host:
        try:
            line = host.stdout.readline()  # type: ignore[union-attr]
            word, _, pid = line.strip().partition(" ")
            assert word in ("dropped", "exiting"), line
            if how == "drop":  # collected: its standby is discarded and reaped while the host lives
                _wait(lambda: standbys_of(int(pid)) == [] and zombie_children(int(pid)) == [],
                      "the collected runtime's standby to be discarded")
            _out, err = host.communicate("\n", timeout=BOUND_S * 2)
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()
    # The wrapper exits with the host's code once no descendant of the host is left, or with
    # OUTLIVED_EXIT_CODE naming the standby that outlived its host by BOUND_S.
    assert host.returncode == 0 and "Warning" not in err, (host.returncode, err)


FORKING_HOST = r"""
import os, sys, time
from ql_core.config import load_config
from ql_core.runtime import Runtime
rt = Runtime.open(load_config(data_dir=sys.argv[1], environ={}, cwd=sys.argv[1]))
for _ in range(3):
    assert rt.wait(rt.submit(["true"], awaited=True)).status == "succeeded"
child = os.fork()
if child == 0:  # a pre-fork worker, say: it lives on, never touching ql
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # our pipes are the test's: let them close
    time.sleep(30)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # the host dies (no close, no atexit): its standby must see EOF despite the fork
"""


def test_a_forked_child_does_not_keep_its_dead_hosts_standby_alive(data_dir: Path) -> None:
    """A fork without exec inherits the host's copy of the standby's channel; the child drops it
    (os.register_at_fork), so when the host dies the standby reads EOF and exits although the
    child lives on — it neither lingers nor keeps a dead host's run looking alive."""
    reaper = subprocess.Popen(under_subreaper([sys.executable, "-c", FORKING_HOST, str(data_dir)],
                                              bound_s=BOUND_S),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = 0
    try:
        line = reaper.stdout.readline()  # type: ignore[union-attr]
        assert line.strip().isdigit(), reaper.stderr.read()  # type: ignore[union-attr]
        child = int(line)
        _wait(lambda: _standbys_under(reaper.pid) == [], "the standby of the dead host to exit", timeout=10)
        assert proc_stat(child) is not None, "the forked child still lives (the standby left despite it)"
    finally:
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            reaper.communicate(timeout=BOUND_S * 2)
        finally:
            if reaper.poll() is None:
                reaper.kill()
                reaper.wait()


def test_the_task_sees_the_hosts_environment_and_directory_as_of_submit(rt: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _ready_standby(rt)  # started before the changes below
    monkeypatch.setenv("QLTEST_LATE", "set after the standby started")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    out = tmp_path / "out"
    view = rt.wait(rt.submit(["sh", "-c", f'echo "$QLTEST_LATE" > "{out}"; pwd >> "{out}"'], cwd="sub"))
    assert view.status == "succeeded"
    assert out.read_text().splitlines() == ["set after the standby started", str(work / "sub")]


def test_a_missing_working_directory_fails_before_anything_runs(rt: Any, tmp_path: Path) -> None:
    from ql_core.errors import QlError

    _ready_standby(rt)
    with pytest.raises(QlError, match=r"working directory \(cwd\) .* does not exist; give an existing directory"):
        rt.submit(["true"], cwd=str(tmp_path / "nowhere"))
    view = rt.list_runs(limit=1)[0]
    assert (view.status, view.reason) == ("failed", "SPAWN_FAILED")
    assert rt.wait(rt.submit(["true"])).status == "succeeded"


def test_a_spec_too_large_for_one_message_runs_the_classic_way(rt: Any) -> None:
    from tests.dbview import CommitLog

    env = {"PATH": os.environ["PATH"], **{f"BIG{i}": "x" * 61440 for i in range(4)}}  # 240 KiB > one message
    log = CommitLog(rt)
    try:
        view = rt.wait(rt.submit(["sh", "-c", 'test "${#BIG0}${#BIG3}" = 6144061440'], env=env))
    finally:
        log.close()
    assert (view.status, view.exit_code) == ("succeeded", 0)
    assert len(log.durable_writes) == 3, log.writes  # create, spawned, terminal: the classic path


UNSEARCHABLE_HOST = r"""
import json, os, sys
from ql_core.config import load_config
from ql_core.runtime import Runtime
data, cwd = sys.argv[1], sys.argv[2]
rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=data))
os.chdir(cwd)
os.chmod(cwd, 0o600)  # the host stays in a directory it can no longer search ("." cannot be opened)
out = []
for _ in range(3):  # on demand, then from the standby kept ready
    view = rt.wait(rt.submit(["sh", "-c", "readlink /proc/self/cwd"]))
    out.append([view.status, open(rt.log_path(view.run_id)).read().strip()])
rt.close()
print(json.dumps(out))
"""


@pytest.mark.root
def test_a_host_in_a_directory_it_cannot_search_still_starts_its_tasks_there() -> None:
    """A Popen child inherits its host's directory without looking it up; a launcher could not enter
    it (fchdir needs search permission), so such a task takes the classic path and runs there."""
    import pwd
    import shutil
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true runs as root with setpriv (util-linux)")
        pytest.skip("needs root (to be another user) and setpriv")
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="ql-standby-cwd-"))  # not under pytest's 0700 tmp tree
    try:
        base.chmod(0o755)
        for name in ("data", "home", "cwd"):
            (base / name).mkdir()
            os.chown(base / name, nobody.pw_uid, nobody.pw_gid)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("QL_", "XDG_"))}
        env["HOME"] = str(base / "home")  # nobody builds (and trusts) its own compiled launcher
        done = subprocess.run([*AS_NOBODY, sys.executable, "-c", UNSEARCHABLE_HOST, str(base / "data"),
                               str(base / "cwd")], env=nobody_env(env), capture_output=True, text=True, timeout=120, cwd="/", check=False)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [["succeeded", str(base / "cwd")]] * 3
    finally:
        (base / "cwd").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_a_send_buffer_too_small_for_the_message_gives_the_classic_path(rt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose socket buffers are small (net.core.wmem_max lowered) takes its standby's real
    capacity into account: a message that would not fit runs the classic way, never fails."""
    import socket

    from ql_executors.local_process import executor as local
    from tests.dbview import CommitLog

    real = local.spawn_standby

    def small(compiled: str) -> Any:
        process, channel, _capacity = real(compiled)
        channel.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)  # a real, small buffer
        return process, channel, channel.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 1024

    monkeypatch.setattr(local, "spawn_standby", small)
    env = {"PATH": os.environ["PATH"], "MID": "m" * 40_000}
    log = CommitLog(rt)
    try:
        big = rt.wait(rt.submit(["sh", "-c", 'test ${#MID} -eq 40000'], env=env))
        small_task = rt.wait(rt.submit(["true"]))
    finally:
        log.close()
    assert big.status == small_task.status == "succeeded"
    assert len(log.durable_writes) == 5, log.writes  # 3 (classic) + 2 (standby)


@pytest.mark.parametrize("standby", [True, False], ids=["standby", "classic"])
def test_launchers_beyond_the_pidfd_cap_still_end_true(open_rt: Any, monkeypatch: pytest.MonkeyPatch,
                                                       standby: bool) -> None:
    """A host holds at most MAX_PIDFDS pidfds (an embedded library must not eat its host's
    descriptors); launchers beyond it are waited for by pid with their start time checked, and end
    with their own status all the same."""
    import dataclasses

    from ql_executors.local_process import child

    monkeypatch.setattr(child, "MAX_PIDFDS", 2)
    rt = open_rt()
    if not standby:
        rt.close()
        from ql_core.config import load_config
        from ql_core.runtime import Runtime

        config = load_config(data_dir=rt.config.data_dir, environ={}, cwd=rt.config.data_dir)
        rt = Runtime.open(dataclasses.replace(config, plugin_settings={"local": {"standby": False}}))
    try:
        go = Path(rt.config.data_dir) / "go"
        subs = [rt.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; exit {n}'])
                for n in range(5)]
        fds = [s.task.live.child._fd for s in subs]
        assert sum(fd >= 0 for fd in fds) <= 2 and fds[-1] == -1, fds
        go.touch()
        for n, sub in enumerate(subs):
            view = rt.wait(sub)
            assert (view.status, view.exit_code) == ("succeeded" if n == 0 else "failed", n)
    finally:
        if not standby:
            rt.close()


def test_a_cancel_before_a_failed_preparation_ends_the_run_cancelled(rt: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing ran is one rule wherever the start fails: a cancel whose TERM reached the standby
    after the create commit, then a log file that cannot be created (a directory planted where it
    belongs): the run ends cancelled — the intent is why — and the error says so, never "failed"."""
    from ql_core import paths
    from ql_core.errors import QlError

    marker = tmp_path / "ran"
    real_prepare = rt.receipts.prepare

    def cancel_and_plant(attempt_id: str) -> str:
        attempt = rt.journal.attempt(attempt_id)
        assert str(rt.cancel(attempt.run_id)) == "requested"  # TERM reaches the standby now
        log = paths.log_path(rt.config.data_dir, attempt.log_artifact_id)
        log.mkdir(parents=True)  # a real fault: open(O_WRONLY|O_CREAT) of a directory fails
        return real_prepare(attempt_id)

    monkeypatch.setattr(rt.receipts, "prepare", cancel_and_plant)
    with pytest.raises(QlError, match="is marked cancelled"):
        rt.submit(["sh", "-c", f'touch "{marker}"'])
    monkeypatch.undo()
    view = rt.list_runs(limit=1)[0]
    assert (view.status, view.reason) == ("cancelled", "user") and not marker.exists()
    assert _events(rt, view.run_id).count("run.cancelled") == 1
