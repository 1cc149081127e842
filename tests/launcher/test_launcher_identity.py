"""Durable process identity (identity.py) against real launchers and real processes.

Every behaviour test runs under both identity sources: ``proc`` (the Linux default) and ``psutil``
(the default elsewhere, forced here with QL_IDENTITY_SOURCE so that path stays proven on Linux).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql_executors.local_process import identity
from ql_executors.local_process.identity import (
    IdentityState,
    ProcessHandle,
    SignalOutcome,
    capture_handle,
    handle_from_dict,
    handle_to_dict,
    inspect,
    read_boot_id,
    signal_group,
)

from ql_executors.local_process.identity_psutil import BOOT_SLACK_S, START_SLACK_MS

from .conftest import Launcher, alive, child_running, proc_stat, session_members, wait_for


@pytest.fixture(params=identity.SOURCES)
def source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The identity source under test, made the active one the way an operator would."""
    if request.param == "psutil":
        pytest.importorskip("psutil", reason="psutil is not installed (pip install -e '.[dev]')")
    monkeypatch.setenv(identity.SOURCE_ENV, request.param)
    return request.param


def expected_start(source: str, pid: int) -> int:
    """What each source must record as the start time, read independently."""
    if source == "proc":
        return int(proc_stat(pid)[19])  # type: ignore[index]
    import psutil

    return int(round(psutil.Process(pid).create_time() * 1000))


def other_start(source: str, handle: ProcessHandle) -> ProcessHandle:
    """The same pid with a start time no slack can excuse: a reused pid."""
    delta = 1 if source == "proc" else START_SLACK_MS + 1
    return dataclasses.replace(handle, start_time=handle.start_time + delta)


def other_boot(source: str, handle: ProcessHandle) -> ProcessHandle:
    if source == "proc":
        return dataclasses.replace(handle, boot_id="00000000-0000-4000-8000-000000000000")
    return dataclasses.replace(handle, boot_id=str(int(handle.boot_id) - BOOT_SLACK_S - 1))


def test_boot_id_is_readable() -> None:
    boot_id = read_boot_id()
    assert boot_id is not None and len(boot_id) == 36
    assert read_boot_id() == boot_id


def test_live_launcher_is_running_then_exited(
    launcher: Launcher, tmp_path: Path, source: str
) -> None:
    gate = tmp_path / "gate"
    task = launcher.start(["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.02; done; exit 4"])
    handle = capture_handle(task.pid)
    assert handle is not None
    assert handle.source == source
    assert handle.pid == task.pid
    assert handle.pgid == task.pid == os.getpgid(task.pid)  # session and group leader
    if source == "proc":
        assert handle.boot_id == read_boot_id()
    assert handle.start_time == expected_start(source, task.pid)
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


def test_mismatched_handles_are_exited_and_never_signalled(launcher: Launcher, source: str) -> None:
    task = launcher.start(["sleep", "30"])
    child = child_running(task.pid, "sleep")
    handle = capture_handle(task.pid)
    assert handle is not None
    for stale in (other_start(source, handle), other_boot(source, handle)):
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


def test_signal_group_reaches_the_whole_group(
    launcher: Launcher, shell: list[str], source: str
) -> None:
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


def test_comm_with_spaces_and_parentheses(tmp_path: Path, source: str) -> None:
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


# ---------------------------------------------------------------- sources and the stored form


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_a_handle_is_only_judged_by_the_source_that_made_it(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("psutil")
    by_proc = capture_handle(sleeper.pid, source="proc")
    by_psutil = capture_handle(sleeper.pid, source="psutil")
    assert by_proc is not None and by_proc.source == "proc"
    assert by_psutil is not None and by_psutil.source == "psutil"
    assert by_proc.pgid == by_psutil.pgid == sleeper.pid
    for active, foreign in (("proc", by_psutil), ("psutil", by_proc)):
        monkeypatch.setenv(identity.SOURCE_ENV, active)
        assert inspect(foreign) is IdentityState.UNVERIFIABLE
        assert signal_group(foreign, signal.SIGKILL) is SignalOutcome.BLOCKED
        assert inspect(foreign, source=foreign.source) is IdentityState.RUNNING
    monkeypatch.setenv(identity.SOURCE_ENV, "no-such-source")
    assert capture_handle(sleeper.pid) is None
    assert inspect(by_proc) is IdentityState.UNVERIFIABLE
    assert signal_group(by_proc, signal.SIGKILL) is SignalOutcome.BLOCKED
    assert sleeper.poll() is None  # never signalled


def test_default_source_is_proc_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(identity.SOURCE_ENV, raising=False)
    assert identity.default_source() == "proc"
    monkeypatch.setattr(identity.sys, "platform", "darwin")
    assert identity.default_source() == "psutil"


def test_missing_psutil_is_unverifiable_with_an_install_hint(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("psutil")
    from loguru import logger

    from ql_executors.local_process import identity_psutil

    handle = capture_handle(sleeper.pid, source="psutil")
    assert handle is not None
    # A system without psutil: the lazy import fails (None in sys.modules makes import raise).
    fresh = identity_psutil.PsutilSource()
    monkeypatch.setattr(identity_psutil, "PSUTIL_SOURCE", fresh)
    monkeypatch.setitem(sys.modules, "psutil", None)
    lines: list[str] = []
    logger.enable("ql_executors")
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        assert inspect(handle, source="psutil") is IdentityState.UNVERIFIABLE
        assert signal_group(handle, signal.SIGKILL, source="psutil") is SignalOutcome.BLOCKED
        assert capture_handle(sleeper.pid, source="psutil") is None
    finally:
        logger.remove(sink)
        logger.disable("ql_executors")
    assert len(lines) == 1 and "pip install 'psutil>=5.9'" in lines[0]
    assert sleeper.poll() is None


def test_zombie_counts_as_exited_for_both_sources(source: str) -> None:
    proc = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)
    try:
        wait_for(lambda: (proc_stat(proc.pid) or ["Z"])[0] == "Z", "a zombie")
        handle = capture_handle(proc.pid)
        assert handle is not None  # a zombie keeps its identity until reaped
        assert inspect(handle) is IdentityState.EXITED
        assert signal_group(handle, signal.SIGTERM) is SignalOutcome.ALREADY_EXITED
    finally:
        proc.wait()
    assert inspect(handle) is IdentityState.EXITED


def test_group_is_verified_before_signalling(source: str) -> None:
    # A process that left the group its handle names: nothing is sent to either group.
    script = "import os, sys, time; sys.stdin.read(1); os.setpgid(0, 0); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        # Started in pytest's own group: its handle is not a group leader's -> blocked outright.
        handle = capture_handle(proc.pid)
        assert handle is not None and handle.pgid == os.getpgrp()
        assert signal_group(handle, signal.SIGTERM) is SignalOutcome.BLOCKED
        # A leader's handle whose process now sits in another group.
        forged = dataclasses.replace(handle, pgid=proc.pid)
        assert signal_group(forged, signal.SIGTERM) is SignalOutcome.BLOCKED
        assert proc.stdin is not None
        proc.stdin.write(b"x")
        proc.stdin.flush()
        wait_for(lambda: os.getpgid(proc.pid) == proc.pid, "the process to lead its own group")
        # Now it leads a group, but the handle's start time still has to match: it does.
        leader = capture_handle(proc.pid)
        assert leader is not None and leader.pgid == proc.pid
        stale = other_start(source, leader)
        assert signal_group(stale, signal.SIGTERM) is SignalOutcome.ALREADY_EXITED
        assert proc.poll() is None
        assert signal_group(leader, signal.SIGTERM) is SignalOutcome.SIGNALLED
        assert proc.wait(20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


def test_handle_dict_round_trip_and_legacy_format(sleeper: subprocess.Popen[bytes]) -> None:
    pytest.importorskip("psutil")
    for name in identity.SOURCES:
        handle = capture_handle(sleeper.pid, source=name)
        assert handle is not None
        data = handle_to_dict(handle)
        assert len(json.dumps(data)) <= 512
        assert handle_from_dict(json.loads(json.dumps(data))) == handle
        assert data["source"] == name
    # The format core stored before sources existed: no "source" key means /proc.
    proc_handle = capture_handle(sleeper.pid, source="proc")
    assert proc_handle is not None
    legacy = {k: v for k, v in handle_to_dict(proc_handle).items() if k != "source"}
    assert handle_from_dict(legacy) == proc_handle
    # A psutil handle is not readable as the legacy format (other key names): fails closed there.
    psutil_handle = capture_handle(sleeper.pid, source="psutil")
    assert psutil_handle is not None
    assert not {"boot_id", "start_time"} <= set(handle_to_dict(psutil_handle))
    # The largest values still fit 512 bytes.
    big = ProcessHandle(boot_id=str(2**62), pid=2**62, pgid=2**62, start_time=2**62, source="psutil")
    assert len(json.dumps(handle_to_dict(big))) <= 512


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {},
        {"boot_id": "x", "pid": 1, "pgid": 1, "start_time": 1},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": True, "pgid": 1, "start_time": 1},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": 0, "pgid": 1, "start_time": 1},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1, "start_time": -1},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1, "start_time": 1.0},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1, "start_time": "1"},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1},
        {"boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1, "start_time": 1,
         "extra": 1},
        {"source": "pidfd", "boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1,
         "start_time": 1},
        {"source": "psutil", "boot_id": "00000000-0000-4000-8000-000000000000", "pid": 1, "pgid": 1,
         "start_time": 1},
        {"source": "psutil", "boot_time": 1, "pid": 1, "pgid": 1, "create_time_ms": 2**64},
        {"source": "psutil", "boot_time": -5, "pid": 1, "pgid": 1, "create_time_ms": 1},
    ],
    ids=lambda d: "bad",
)
def test_handle_from_dict_rejects_anything_else(data: object) -> None:
    assert handle_from_dict(data) is None
