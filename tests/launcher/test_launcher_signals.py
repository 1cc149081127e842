"""Signal forwarding and the final status of launcher.sh."""

from __future__ import annotations

import os
import signal
import time

import pytest

from .conftest import (
    Launcher,
    alive,
    child_running,
    is_bash,
    requires_pid_forwarding,
    session_members,
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
