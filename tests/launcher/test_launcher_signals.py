"""Signal forwarding and the final status of launcher.sh."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ql_core.ids import new_id, shard_of

from .conftest import (
    DEADLINE_S,
    Launcher,
    alive,
    child_running,
    is_bash,
    is_compiled,
    is_standby,
    new_token,
    parse_receipt_strict,
    proc_stat,
    requires_pid_forwarding,
    session_members,
    spawn_held,
    wait_for,
)


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1], ids=lambda s: s.name
)
def test_signal_to_launcher_is_forwarded(
    launcher: Launcher, shell: list[str], sig: signal.Signals
) -> None:
    requires_pid_forwarding(shell)
    task = launcher.start(["sleep", "30"])
    child = child_running(task.pid, "sleep")
    os.kill(task.pid, sig)
    assert task.wait() == 128 + sig
    assert task.receipt()["exitCode"] == 128 + sig
    assert not alive(child)
    assert task.log() == b""  # no "Terminated" or other shell notices in the user's log


def test_forwarded_signal_reaches_a_shell_mode_command(launcher: Launcher, shell: list[str]) -> None:
    requires_pid_forwarding(shell)
    task = launcher.start(["exec sleep 30"], mode="shell")
    child_running(task.pid, "sleep")
    os.kill(task.pid, signal.SIGINT)
    assert task.wait() == 130
    assert task.receipt()["exitCode"] == 130


def test_child_that_handles_the_signal_reports_its_own_status(
    launcher: Launcher, shell: list[str]
) -> None:
    requires_pid_forwarding(shell)
    task = launcher.start(["sh", "-c", 'trap "exit 3" TERM; echo armed; while :; do sleep 0.05; done'])
    wait_for(lambda: task.log() == b"armed\n", "the trap to be armed")
    os.kill(task.pid, signal.SIGTERM)
    assert task.wait() == 3
    assert task.receipt()["exitCode"] == 3


def test_real_status_survives_a_signal_storm(launcher: Launcher, shell: list[str]) -> None:
    # The command ignores what we throw at the launcher and exits on its own: every wait the
    # storm interrupts must be retried, and the status must be the command's, never 128+N.
    # bash can lose a status when a signal lands while it reaps the child (see launcher.sh); the
    # launcher must then publish nothing and exit 125 - never a wrong code.
    for _ in range(5):
        task = launcher.start(["sh", "-c", 'trap "" TERM USR1 USR2; echo armed; sleep 0.2; exit 42'])
        wait_for(lambda: task.log() == b"armed\n", "the traps to be armed")
        sigs = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
        n = 0
        while task.proc.poll() is None:
            try:
                os.kill(task.pid, sigs[n % 3])
            except ProcessLookupError:
                break
            n += 1
            time.sleep(0.0005)
        rc = task.wait()
        assert task.log() == b"armed\n"
        if rc == 125 and is_bash(shell):
            task.assert_no_receipt()
            continue
        assert rc == 42, f"after {n} signals"
        assert task.receipt()["exitCode"] == 42


def test_child_exit_status_above_128_is_not_mistaken_for_a_signal(launcher: Launcher) -> None:
    task = launcher.start(["sh", "-c", "exit 143"])
    assert task.wait() == 143
    assert task.receipt()["exitCode"] == 143


def test_command_killed_by_an_outside_signal(launcher: Launcher) -> None:
    task = launcher.start(["sleep", "30"])
    child = child_running(task.pid, "sleep")
    os.kill(child, signal.SIGKILL)
    assert task.wait() == 137
    assert task.receipt()["exitCode"] == 137


def test_sigkill_to_the_group_leaves_no_receipt_and_no_temp(launcher: Launcher) -> None:
    task = launcher.start(["sh", "-c", 'trap "" TERM; exec sleep 30'])
    child = child_running(task.pid, "sleep")
    os.kill(task.pid, signal.SIGTERM)  # forwarded, and ignored by the command
    time.sleep(0.3)
    # The launcher keeps waiting for a command that is still there.
    assert task.proc.poll() is None and alive(child)
    os.killpg(task.pid, signal.SIGKILL)
    assert task.wait() == -signal.SIGKILL
    wait_for(lambda: not session_members(task.pid), "the group to be gone")
    task.assert_no_receipt()


def test_group_signal_gives_the_real_status(launcher: Launcher, shell: list[str]) -> None:
    # The cancellation path: TERM to the whole group reaches launcher and command at once.
    # dash and busybox ash must report 143 every time; bash may fail closed (see conftest).
    for _ in range(10):
        task = launcher.start(["sleep", "30"])
        child_running(task.pid, "sleep")
        os.killpg(task.pid, signal.SIGTERM)
        task.expect_signal_death(shell, 143)
        assert task.log() == b""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_before_the_go_ahead_ends_the_task_instead_of_running_it(
    shell: list[str], data_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """A held launcher (its handle not yet committed) is signalled while it waits for its token:
    the command never runs. The compiled launcher finishes reading the token, then its child
    re-delivers the signal in place of the command (128+N, with a receipt). A shell does the
    same, or - depending on the shell and the signal - has its `read` cut short by the trap,
    which counts as no go-ahead: 125 and no receipt (the attempt is lost, never a made-up
    status)."""
    ran = tmp_path / "ran"
    run_id, attempt_id, token = new_id(), new_id(), new_token()
    shard = data_dir / "receipts" / shard_of(attempt_id)
    shard.mkdir(mode=0o700, parents=True)
    fd = os.open(data_dir / "task.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        proc, go = spawn_held(shell, shard_dir=shard, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                              started_at_ms=1_700_000_000_000, mode="argv", command=["touch", str(ran)],
                              token=token, log_fd=fd)
    finally:
        os.close(fd)
    try:
        # Its handlers are in place once it blocks on the channel (state S, reading).
        wait_for(lambda: (proc_stat(proc.pid) or ["?"])[0] == "S", "the launcher to wait for its token")
        time.sleep(0.2)  # a slow shell (emulated busybox) may still be setting its traps
        os.kill(proc.pid, sig)
        if is_standby(shell):
            # A standby has no run before its message: the signal ends it (125, nothing run,
            # no receipt), so it can never be charged to a later run; the hand-over then fails.
            assert proc.wait(DEADLINE_S) == 125
        elif is_compiled(shell):
            time.sleep(0.1)
            assert proc.poll() is None  # caught, not fatal: it still waits for its token
        try:
            go()
        except (BrokenPipeError, ConnectionResetError):
            assert not is_compiled(shell) or is_standby(shell)  # the launcher had already given up
        rc = proc.wait(DEADLINE_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(DEADLINE_S)
    assert not ran.exists()
    if rc == 125 and (not is_compiled(shell) or is_standby(shell)):
        assert os.listdir(shard) == []
        return
    assert rc == 128 + sig
    receipt = parse_receipt_strict((shard / f"{attempt_id}.json").read_bytes())
    assert receipt["exitCode"] == 128 + sig
