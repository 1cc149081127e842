"""Acknowledged completion at the launcher level, under every shell.

The host passes the channel on stdin (flag ``c``) as a socket that stays open (flag ``a``). When the
command ends the launcher sends one byte, leaves a publisher behind and exits with the command's
status; the publisher publishes the receipt unless the host says ``ok``. These tests play the host
in-process: they reap, read the byte, and acknowledge or close, as the executor does.
"""

from __future__ import annotations

import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ql_core.ids import new_id
from ql_executors.local_process.launch import acknowledge, launcher_args

from .conftest import (
    DEADLINE_S,
    HeldLaunch,
    is_bash,
    launcher_mode,
    new_token,
    parse_receipt_strict,
    wait_for,
)


class Awaited(HeldLaunch):
    """One launcher started with an acknowledged channel; ``release`` lets its command start."""

    def __init__(self, shell: list[str], data_dir: Path, command: list[str], *, hints: str = "") -> None:
        super().__init__(shell, data_dir, command, started_at_ms=1_700_000_000_000, awaited=True, hints=hints)
        assert isinstance(self.channel, socket.socket)
        self.go()

    @property
    def receipt_path(self) -> Path:
        return self.shard / f"{self.attempt_id}.json"

    def reap(self) -> tuple[int, bytes]:
        """The launcher's exit status (the kernel's word) and the byte it sent before exiting."""
        rc = self.proc.wait(DEADLINE_S)
        try:
            marker = self.channel.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            marker = b""
        return rc, marker

    def group_gone(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        return False


@pytest.fixture
def awaited(shell: list[str], data_dir: Path):  # type: ignore[no-untyped-def]
    started: list[Awaited] = []

    def start(command: list[str], **kwargs: str) -> Awaited:
        one = Awaited(shell, data_dir, command, **kwargs)
        started.append(one)
        return one

    yield start
    for one in started:
        one.cleanup()


def test_an_acknowledged_status_publishes_nothing(awaited) -> None:  # type: ignore[no-untyped-def]
    one = awaited(["sh", "-c", "echo hi; exit 7"])
    assert one.reap() == (7, b"s")
    assert os.listdir(one.shard) == []
    acknowledge(one.channel, committed=True)
    wait_for(one.group_gone, "the publisher to leave")
    assert os.listdir(one.shard) == []
    assert one.log.read_bytes() == b"hi\n"


def test_without_the_acknowledgement_the_receipt_is_published(awaited) -> None:  # type: ignore[no-untyped-def]
    one = awaited(["sh", "-c", "exit 7"])
    assert one.reap() == (7, b"s")
    assert not one.receipt_path.exists()  # held back while the host may still commit
    acknowledge(one.channel, committed=False)  # the host's commit failed, or it died: EOF
    wait_for(one.receipt_path.exists, "the receipt")
    receipt = parse_receipt_strict(one.receipt_path.read_bytes())
    assert (receipt["exitCode"], receipt["token"], receipt["attemptId"]) == (7, one.token, one.attempt_id)
    wait_for(one.group_gone, "the publisher to leave")
    assert os.listdir(one.shard) == [f"{one.attempt_id}.json"]


def test_a_command_exiting_125_is_told_from_a_lost_status(awaited) -> None:  # type: ignore[no-untyped-def]
    one = awaited(["sh", "-c", "exit 125"])
    assert one.reap() == (125, b"s")  # the byte says: this 125 is the command's own


def test_a_host_gone_while_the_command_runs_gets_the_receipt(  # type: ignore[no-untyped-def]
        awaited, shell: list[str], tmp_path: Path) -> None:
    go = tmp_path / "go"
    one = awaited(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; exit 9'])
    time.sleep(0.05)  # let bash settle into its sleep on the channel (the point of this case)
    one.channel.close()  # the host dies: EOF while the command runs
    go.touch()
    rc = one.proc.wait(DEADLINE_S)
    if rc == 125 and is_bash(shell):
        # bash's fallback `wait` may lose a status (launcher.sh): then no receipt, never a wrong one.
        wait_for(one.group_gone, "the launcher group to leave")
        assert os.listdir(one.shard) == []
        return
    assert rc == 9
    wait_for(one.receipt_path.exists, "the receipt")
    assert parse_receipt_strict(one.receipt_path.read_bytes())["exitCode"] == 9


def test_a_signal_status_is_acknowledged_like_any_other(awaited, shell: list[str]) -> None:  # type: ignore[no-untyped-def]
    one = awaited(["sh", "-c", "echo ready; while :; do sleep 0.02; done"])
    wait_for(lambda: b"ready" in one.log.read_bytes(), "the command to start")
    os.killpg(one.proc.pid, 15)
    rc, marker = one.reap()
    if rc == 125 and is_bash(shell):
        assert marker == b""  # a lost status is never marked as the command's
        return
    assert (rc, marker) == (143, b"s")
    acknowledge(one.channel, committed=True)
    wait_for(one.group_gone, "the publisher to leave")
    assert os.listdir(one.shard) == []


def test_hints_change_nothing_but_the_probes(awaited, shell: list[str]) -> None:  # type: ignore[no-untyped-def]
    hints = ("e" if launcher_mode(shell) == "async" else "") + "p"
    one = awaited(["sh", "-c", "exit 3"], hints=hints)
    assert one.reap() == (3, b"s")
    acknowledge(one.channel, committed=False)
    wait_for(one.receipt_path.exists, "the receipt")
    assert parse_receipt_strict(one.receipt_path.read_bytes())["exitCode"] == 3


PROBE = textwrap.dedent(
    """
    import errno, os, sys
    host = int(sys.argv[1])
    mine = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    reached = []
    for pid in (os.getppid(), host):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            path = f"/proc/{pid}/fd/{name}"
            try:
                if not os.readlink(path).startswith("socket:"):
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                print("refused", pid == host and "host" or "parent", errno.errorcode.get(exc.errno))
                continue
            os.write(fd, b"0\\nok\\n")
            reached.append(path)
    print("own fds", mine)
    print("reached", reached)
    sys.exit(7)
    """
)


def test_a_task_cannot_reach_either_end_of_the_channel(awaited, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A same-user task looks for the channel in its launcher's and its host's fd tables: a
    socket cannot be opened through /proc (ENXIO), and none was left open in the task itself."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    one = awaited([sys.executable, str(probe), str(os.getpid())])
    rc, marker = one.reap()
    out = one.log.read_text()
    assert "reached []" in out, out
    assert "refused host ENXIO" in out, out  # the host's end was there to try, and was refused
    own = eval(out.split("own fds ", 1)[1].splitlines()[0])
    assert own[:3] == [0, 1, 2] and len(own) <= 4, own  # 0-2 and the listing's own descriptor
    assert (rc, marker) == (7, b"s")


def test_flags_are_validated(tmp_path: Path) -> None:
    base = dict(shard_dir=tmp_path, run_id=new_id(), attempt_id=new_id(), callback_sequence=1,
                started_at_ms=1, mode="argv", command=["true"])
    assert launcher_args(**base, flags="ca")[5] == "argv+ca"  # type: ignore[arg-type]
    for bad in ("x", "aa", "c+", " "):
        with pytest.raises(ValueError):
            launcher_args(**base, flags=bad)  # type: ignore[arg-type]


def test_an_unknown_flag_makes_the_launcher_refuse(shell: list[str], data_dir: Path) -> None:
    from .conftest import Launcher

    launcher = Launcher(shell, data_dir)
    try:
        task = launcher.start_raw(fd3=(new_token() + "\n").encode(),
                                  args=lambda shard, run, attempt: [str(shard), run, attempt, "1", "1",
                                                                    "argv+z", "--", "true"])
        assert task.wait() == 125
        assert task.shard_entries() == []
    finally:
        launcher.cleanup()
