"""Durable process identity (identity.py) against real launchers and real processes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from ql_executors.local_process import identity
from ql_executors.local_process.identity import (
    IdentityState,
    ProcessHandle,
    SignalOutcome,
    capture_handle,
    inspect,
    read_boot_id,
    signal_group,
)

from .conftest import Launcher, alive, child_running, proc_stat, session_members, wait_for


def test_boot_id_is_readable() -> None:
    boot_id = read_boot_id()
    assert boot_id is not None and len(boot_id) == 36
    assert read_boot_id() == boot_id


def test_live_launcher_is_running_then_exited(launcher: Launcher, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    task = launcher.start(["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.02; done; exit 4"])
    handle = capture_handle(task.pid)
    assert handle is not None
    assert handle.pid == task.pid
    assert handle.pgid == task.pid == os.getpgid(task.pid)  # session and group leader
    assert handle.boot_id == read_boot_id()
    assert handle.start_time == int(proc_stat(task.pid)[19])  # type: ignore[index]
    assert inspect(handle) is IdentityState.RUNNING

    gate.touch()
    # Exited but not reaped yet: a zombie counts as exited.
    wait_for(lambda: (proc_stat(task.pid) or ["Z"])[0] == "Z", "the launcher to become a zombie")
    assert inspect(handle) is IdentityState.EXITED
    assert capture_handle(task.pid) == handle  # a zombie still has its identity
    assert task.wait() == 4
    assert inspect(handle) is IdentityState.EXITED
    assert capture_handle(task.pid) is None
    assert signal_group(handle, signal.SIGTERM) is SignalOutcome.ALREADY_EXITED


def test_mismatched_handles_are_exited_and_never_signalled(launcher: Launcher) -> None:
    task = launcher.start(["sleep", "30"])
    child = child_running(task.pid, "sleep")
    handle = capture_handle(task.pid)
    assert handle is not None
    other_time = dataclasses.replace(handle, start_time=handle.start_time + 1)
    other_boot = dataclasses.replace(handle, boot_id="00000000-0000-4000-8000-000000000000")
    for stale in (other_time, other_boot):
        assert inspect(stale) is IdentityState.EXITED
        assert signal_group(stale, signal.SIGKILL) is SignalOutcome.ALREADY_EXITED
    # Not a group leader's handle (and never a bare pid): blocked, nothing sent.
    not_leader = dataclasses.replace(handle, pgid=handle.pgid + 1)
    assert signal_group(not_leader, signal.SIGKILL) is SignalOutcome.BLOCKED
    child_handle = capture_handle(child)
    assert child_handle is not None and child_handle.pgid == task.pid
    assert signal_group(child_handle, signal.SIGKILL) is SignalOutcome.BLOCKED
    # Everything still lives.
    assert alive(task.pid) and alive(child)
    assert task.proc.poll() is None
    assert inspect(handle) is IdentityState.RUNNING


def test_signal_group_reaches_the_whole_group(launcher: Launcher, shell: list[str]) -> None:
    task = launcher.start(["sh", "-c", "sleep 30 & sleep 31 & wait"])
    wait_for(lambda: len(session_members(task.pid)) >= 4, "launcher, sh and two sleeps")
    handle = capture_handle(task.pid)
    assert handle is not None
    assert signal_group(handle, signal.SIGTERM) is SignalOutcome.SIGNALLED
    task.expect_signal_death(shell, 143)
    wait_for(lambda: not session_members(task.pid), "every member of the group to be gone")


def test_invalid_or_unreadable_identity_is_unverifiable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        handle = capture_handle(proc.pid)
        assert handle is not None
        assert inspect(dataclasses.replace(handle, pid=0)) is IdentityState.UNVERIFIABLE
        assert signal_group(dataclasses.replace(handle, pid=0, pgid=0), signal.SIGKILL) is SignalOutcome.BLOCKED
        # A system whose /proc cannot be read: point the module at an empty directory.
        monkeypatch.setattr(identity, "_PROC", str(tmp_path))
        assert inspect(handle) is IdentityState.UNVERIFIABLE
        assert signal_group(handle, signal.SIGKILL) is SignalOutcome.BLOCKED
        assert capture_handle(proc.pid) is None
        monkeypatch.setattr(identity, "_BOOT_ID_PATH", str(tmp_path / "no-boot-id"))
        assert read_boot_id() is None
        assert inspect(handle) is IdentityState.UNVERIFIABLE
        monkeypatch.undo()
        assert proc.poll() is None  # never signalled
        assert inspect(handle) is IdentityState.RUNNING
    finally:
        proc.kill()
        proc.wait()


def test_comm_with_spaces_and_parentheses(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    odd = tmp_path / "a) b (c) d"
    shutil.copy(sleep, odd)
    proc = subprocess.Popen([str(odd), "30"], start_new_session=True)
    try:
        wait_for(lambda: b") b (c" in Path(f"/proc/{proc.pid}/stat").read_bytes(), "the exec")
        handle = capture_handle(proc.pid)
        assert handle is not None
        assert handle.pgid == proc.pid == os.getpgid(proc.pid)
        assert inspect(handle) is IdentityState.RUNNING
        assert signal_group(handle, signal.SIGTERM) is SignalOutcome.SIGNALLED
        assert proc.wait(20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_parse_stat_takes_fields_after_the_last_parenthesis() -> None:
    rest = " ".join(str(n) for n in range(4, 53))  # fields 4..52
    raw = f"123 (x) S (y)) R {rest}\n".encode()
    stat = identity._parse_stat(raw)
    assert stat.state == "R"
    assert stat.pgrp == 5
    assert stat.start_time == 22


def test_handle_is_frozen() -> None:
    handle = ProcessHandle(boot_id="b", pid=1, pgid=1, start_time=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.pid = 2  # type: ignore[misc]
