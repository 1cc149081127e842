"""A standby launcher killed (SIGKILL) or stopped (SIGSTOP) at every step of its hand-over: the host
never dies of it, and the run ends in one true terminal state (docs/launcher.md, "What if the
standby is hurt").

The signal is real, sent to the standby's process group by a wrapper around the step it must hit
(no crash point is needed: the host is this process and must survive). The steps, in order:

- ``taken``: the executor handed the runtime an idle standby (before the create commit);
- ``committed``: the create commit recorded its handle (before the log and the message);
- ``before_message``: the receipt shard and the log exist, the message is about to be sent;
- ``after_message``: the message (the run and its go-ahead) was sent;
- ``after_start``: the executor's start returned.

What is true: a standby dead before its message was sent ran nothing, and the host knows it —
``failed``/``SPAWN_FAILED``, submit returns, the command never ran. One killed after the message
was queued may have run the command or not: ``lost`` (no receipt) — or, if it ran to its end
before the kill, the command's own status. A stopped one is only slow: once continued, the run
ends with the command's status. The submitting host goes on in every case — also on the classic
path, whose launcher dead before its go-ahead must not kill, by SIGPIPE, a host that gave SIGPIPE
back its default action.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from ql_core.testing.executor import wait_until
from tests.processes import pids, proc_stat, zombie_children

STEPS = ("taken", "committed", "before_message", "after_message", "after_start")
DELIVERED = ("after_message", "after_start")


@pytest.fixture
def rt(standby_rt: Any) -> Any:
    return standby_rt  # tests/truth/conftest.py: skipped (failed under CI) without the compiled launcher


def _state(pid: int) -> str:
    fields = proc_stat(pid)
    return "X" if fields is None else fields[0]


def _group_stopped(pgid: int) -> bool:
    """Some member of the group is stopped. After ``after_start`` the standby may be inside its
    vfork, waiting (state D) for a child that the same SIGSTOP stopped before its exec: the
    standby itself then never shows T, yet the stop took — the whole group waits for SIGCONT."""
    for pid in pids():
        fields = proc_stat(pid)
        if fields is not None and int(fields[2]) == pgid and fields[0] in ("T", "t"):
            return True
    return False


def _hurt(pid: int, signum: int) -> None:
    """Signal the standby's group and wait until the signal took (dead, or stopped). A group gone
    already took nothing: after ``after_start`` a quick command may have run, published and ended
    before the signal (ESRCH then reached the submit as the executor's error, and the submit raised)."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        return
    if signum == signal.SIGKILL:
        took = lambda: _state(pid) in ("Z", "X")  # noqa: E731
    else:
        took = lambda: _state(pid) in ("T", "t", "Z", "X") or _group_stopped(pid)  # noqa: E731
    wait_until(took, f"the standby to take signal {signum}", 120, interval=0.05)  # loaded: slow


def _hook(rt: Any, monkeypatch: pytest.MonkeyPatch, step: str, hurt: Callable[[int], None]) -> list[int]:
    """Wrap the step so ``hurt(standby pid)`` runs exactly there; returns the standby pids seen."""
    from ql_executors.local_process import executor as local

    pids: list[int] = []
    real_standby, real_start, real_hand_over = rt.executor.standby, rt.executor.start, local.hand_over
    real_create_running = rt.journal.create_running

    def standby(*args: Any, **kwargs: Any) -> Any:
        task = real_standby(*args, **kwargs)
        if task is not None:
            pids.append(task.live.process.pid)
            if step == "taken":
                hurt(pids[-1])
        return task

    def create_running(*args: Any, **kwargs: Any) -> Any:
        events = real_create_running(*args, **kwargs)
        if step == "committed":
            hurt(pids[-1])
        return events

    def hand_over(*args: Any, **kwargs: Any) -> None:
        if step == "before_message":
            hurt(pids[-1])
        real_hand_over(*args, **kwargs)
        if step == "after_message":
            hurt(pids[-1])

    def start(*args: Any, **kwargs: Any) -> None:
        real_start(*args, **kwargs)
        if step == "after_start":
            hurt(pids[-1])

    monkeypatch.setattr(rt.executor, "standby", standby)
    monkeypatch.setattr(rt.journal, "create_running", create_running)
    monkeypatch.setattr(local, "hand_over", hand_over)
    monkeypatch.setattr(rt.executor, "start", start)
    return pids


def _submit_hurt(rt: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: str, signum: int,
                 awaited: bool) -> tuple[Path, list[int], Any]:
    """Submit ``touch MARKER; exit 3`` with ``signum`` sent to its standby at ``step`` (submit never
    raises for it); the marker, the standby pids seen, and the submission."""
    marker = tmp_path / "ran"
    pids = _hook(rt, monkeypatch, step, lambda pid: _hurt(pid, signum))
    sub = rt.submit(["sh", "-c", f'touch "{marker}"; exit 3'], awaited=awaited, timeout_s=120)
    monkeypatch.undo()
    assert pids, "the task was not given a standby"
    return marker, pids, sub


def _terminal_events(rt: Any, run_id: str) -> list[str]:
    return [e.type for e in rt.events(run_id)
            if e.type.startswith("run.") and e.type[4:] in ("succeeded", "failed", "cancelled", "timed_out", "lost")]


@pytest.mark.parametrize("awaited", [False, True], ids=["unwaited", "awaited"])
@pytest.mark.parametrize("step", STEPS)
def test_a_standby_killed_at_any_step_never_kills_the_host(rt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           step: str, awaited: bool) -> None:
    marker, pids, sub = _submit_hurt(rt, monkeypatch, tmp_path, step, signal.SIGKILL, awaited)
    view = rt.wait(sub)
    outcome = (view.status, view.reason, view.exit_code)
    if step in DELIVERED:
        # The message was queued: whether it ran is unknown unless its status was published.
        assert outcome in (("lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT", None), ("failed", None, 3)), outcome
        assert view.status == "lost" or marker.exists()
    else:
        assert outcome == ("failed", "SPAWN_FAILED", None), outcome
        assert not marker.exists(), "a standby that never got its run ran the command"
    assert len(_terminal_events(rt, view.run_id)) == 1
    assert pids[0] not in zombie_children(os.getpid())
    assert rt.wait(rt.submit(["true"], awaited=awaited)).status == "succeeded"  # the host goes on


@pytest.mark.parametrize("awaited", [False, True], ids=["unwaited", "awaited"])
@pytest.mark.parametrize("step", STEPS)
def test_a_standby_stopped_at_any_step_only_delays_its_run(rt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          step: str, awaited: bool) -> None:
    marker, pids, sub = _submit_hurt(rt, monkeypatch, tmp_path, step, signal.SIGSTOP, awaited)
    time.sleep(0.2)  # slow, not dead: the host has gone on meanwhile
    assert rt.wait(rt.submit(["true"])).status == "succeeded"
    with contextlib.suppress(ProcessLookupError):  # ended before the stop could take (_hurt)
        os.killpg(pids[0], signal.SIGCONT)
    view = rt.wait(sub)
    assert (view.status, view.reason, view.exit_code) == ("failed", None, 3) and marker.exists()
    assert len(_terminal_events(rt, view.run_id)) == 1
    assert pids[0] not in zombie_children(os.getpid())


@pytest.mark.parametrize("awaited", [False, True], ids=["pipe", "socket"])
def test_a_classic_launcher_dead_before_its_go_ahead_never_kills_a_host_without_sigpipe_ignored(
        data_dir: Path, tmp_path: Path, awaited: bool) -> None:
    """The classic path's go-ahead (the token, on a pipe or, awaited, a socket) to a launcher that
    died after its handle commit: EPIPE, never a SIGPIPE that kills a host whose SIGPIPE has its
    default action; the run ends failed/SPAWN_FAILED, the command never ran, the host goes on."""
    import json
    import subprocess
    import sys

    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("sigpipe_host.py")), str(data_dir),
                           str(marker), "1" if awaited else "0"], capture_output=True, timeout=300, cwd=data_dir)
    assert done.returncode == 0, (done.returncode, done.stderr.decode(errors="replace")[-2000:])
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report == {"status": "failed", "reason": "SPAWN_FAILED", "exit_code": None, "after": "succeeded",
                      "terminal": 1}, report
    assert not marker.exists()
