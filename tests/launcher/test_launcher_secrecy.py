"""The token never shows in argv, environment or log; only fds 0-2 reach the command."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import termios
from pathlib import Path

from ql_executors.local_process.identity import capture_handle, signal_group

from .conftest import (
    Launcher,
    child_running,
    cmdline,
    environ,
    is_bash,
    is_compiled,
    launcher_mode,
    session_members,
    wait_for,
)

def _bytes_in_pipe(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)
    finally:
        os.close(fd)


# Variables a shell may add to the environment of what it runs; nothing else may appear.
SHELL_ADDED = {b"PWD", b"OLDPWD", b"SHLVL", b"_"}


def test_token_absent_from_every_process_and_the_log(
    launcher: Launcher, shell: list[str], tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "QL_T_MARK": "visible",
        # Names the launcher uses internally: inherited ones must not carry its values onward.
        "_ql_tok": "inherited",
        "_ql_status": "inherited",
    }
    script = "ls /proc/self/fd; echo ready; sleep 30 & wait"
    task = launcher.start(["sh", "-c", script], env=env)
    child = child_running(task.pid, "sh")
    wait_for(lambda: task.log().endswith(b"ready\n"), "the command's ready line")
    grandchild = wait_for(
        lambda: [p for p in session_members(task.pid) if cmdline(p)[:1] == [b"sleep"]],
        "the sleep grandchild",
    )[0]  # type: ignore[index]

    members = session_members(task.pid)
    assert {task.pid, child, grandchild} <= set(members)
    token = task.token.encode()
    for pid in members:
        assert token not in b"\0".join(cmdline(pid)), f"token in argv of {pid}"
        assert token not in Path(f"/proc/{pid}/environ").read_bytes(), f"token in env of {pid}"
    for pid in (child, grandchild):
        got = environ(pid)
        assert not [k for k in got if k.startswith(b"_ql")], got
        expected = {k.encode(): v.encode() for k, v in env.items() if not k.startswith("_ql")}
        assert {k: v for k, v in got.items() if k not in SHELL_ADDED} == expected
        # Only 0, 1, 2 reach the command; the launcher's fd 3 was closed before it started.
        assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        assert os.readlink(f"/proc/{pid}/fd/1") == str(task.log_path)
    # The launcher no longer holds the log (in foreground mode it keeps it on fd 3 for the
    # command until the command ends: docs/launcher.md; with a quota it holds a copy to cut it);
    # the only pipes it may hold are bash's private sleep pipe (fd 4, the reopened token pipe) and
    # the compiled launcher's self-pipe (both ends its own), and they are empty: the token was
    # consumed.
    foreground = launcher_mode(shell) == "foreground"

    def launcher_fds() -> dict[str, str]:
        return {fd: os.readlink(f"/proc/{task.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{task.pid}/fd")}

    if not foreground:
        # The compiled launcher lets go of the log when its vfork returns. qemu-user runs vfork as
        # a fork that does not hold the parent back until the exec, so on a loaded machine the
        # command can print its lines (and start its grandchild) before that close.
        wait_for(lambda: str(task.log_path) not in launcher_fds().values(), "the launcher to close the log")
    targets = launcher_fds()
    for fd, target in targets.items():
        if foreground and fd == "3":
            assert target == str(task.log_path)
            continue
        assert target != str(task.log_path), fd
        if target.startswith("pipe:"):
            self_pipe = is_compiled(shell) and list(targets.values()).count(target) == 2
            assert self_pipe or (is_bash(shell) and fd == "4"), (fd, target)
            assert _bytes_in_pipe(f"/proc/{task.pid}/fd/{fd}") == 0

    handle = capture_handle(task.pid)
    assert handle is not None
    assert signal_group(handle, signal.SIGTERM) == "signalled"
    task.expect_signal_death(shell, 143)
    # `ls /proc/self/fd` lists 0-2 plus the one it opened to read the directory.
    assert task.log() == b"0\n1\n2\n3\nready\n"
    assert token not in task.log()
    wait_for(lambda: not session_members(task.pid), "the whole session to be gone")


def test_signal_dispositions_of_the_command_are_defaults(launcher: Launcher, shell: list[str]) -> None:
    task = launcher.start(["sleep", "30"])
    child = child_running(task.pid, "sleep")
    status = Path(f"/proc/{child}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["SigIgn"], 16) == 0, "the command must not inherit ignored signals"
    assert int(fields["SigBlk"], 16) == 0
    if launcher_mode(shell) == "foreground":
        os.killpg(task.pid, signal.SIGTERM)  # a pid-alone signal would be held (docs/launcher.md)
    else:
        os.kill(task.pid, signal.SIGTERM)
    assert task.wait() == 143
