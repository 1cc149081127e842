"""Busybox-only systems: no GNU ``env --default-signal``, so launcher.sh runs the command in the
foreground (docs/launcher.md). The command must still get default INT and QUIT, an early signal
must not be lost, and the cost of the mode (a signal to the launcher's pid alone is held) is pinned
down here rather than left to be discovered.

Busybox-only conditions are simulated with a PATH holding busybox applet links and nothing else.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import (
    Launcher,
    alive,
    child_running,
    cmdline,
    is_compiled,
    launcher_mode,
    require_tool,
    wait_for,
)

APPLETS = ("env", "date", "ln", "rm", "sync", "sh", "sleep", "grep", "cat", "touch")


@pytest.fixture(autouse=True)
def _shell_launchers_only(shell: list[str]) -> None:
    if is_compiled(shell):
        pytest.skip("the compiled launcher has no foreground mode and runs no env, date, ln, rm or sync")


@pytest.fixture
def busybox_path(tmp_path: Path) -> str:
    """A PATH of busybox applets only: no GNU env, no GNU date."""
    found = shutil.which("busybox") or ("/bin/busybox" if os.path.exists("/bin/busybox") else None)
    busybox = require_tool([found] if found else None, "busybox is not installed")[0]
    bindir = tmp_path / "busybox-bin"
    bindir.mkdir()
    for tool in APPLETS:
        (bindir / tool).symlink_to(busybox)
    return str(bindir)


@pytest.fixture
def bb_env(busybox_path: str, shell: list[str]) -> dict[str, str]:
    assert launcher_mode(shell, busybox_path) == "foreground"
    return {"PATH": busybox_path}


def _dispositions(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return int(fields["SigIgn"], 16), int(fields["SigBlk"], 16)


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
def test_command_has_default_dispositions_and_group_signals_end_it(
    launcher: Launcher, bb_env: dict[str, str], sig: signal.Signals
) -> None:
    task = launcher.start(["sleep", "30"], env=bb_env)
    child = child_running(task.pid, "sleep")
    # The exec'd command itself (not a shell that may ignore QUIT while it waits): all defaults.
    assert _dispositions(child) == (0, 0)
    os.killpg(task.pid, sig)  # what ql's cancellation does: the whole group
    assert task.wait() == 128 + sig
    assert task.receipt()["exitCode"] == 128 + sig
    assert task.log() == b""


def test_group_int_right_after_spawn_ends_the_task(
    launcher: Launcher, bb_env: dict[str, str]
) -> None:
    # Right after the spawn the launcher has no trap yet: the INT kills it before it forked
    # anything (no receipt: the attempt ends lost, or as its committed cancel). Never a success
    # the command did not earn.
    for _ in range(5):
        started = time.monotonic()
        task = launcher.start(["sleep", "5"], env=bb_env)
        os.killpg(task.pid, signal.SIGINT)
        rc = task.wait()
        if rc == -signal.SIGINT:
            task.assert_no_receipt()
        elif rc == 0:
            # The documented window of foreground mode (docs/launcher.md, "Early signals"): the INT
            # landed while the launcher forked CMD, so the launcher caught it and the child dropped
            # it. CMD then ran to its own end and its 0 is true (ql's cancel escalates to KILL);
            # what must never happen is a 0 before CMD had run its 5 s. Seen under CI's load.
            assert time.monotonic() - started >= 5, "exit 0 before the command could have ended"
            assert task.receipt()["exitCode"] == 0
        else:  # a launcher that was faster than us had its trap: then the child re-delivers it
            assert rc == 130 and task.receipt()["exitCode"] == 130


def _int_bits(pid: int) -> tuple[bool, bool] | None:
    """(caught, ignored) for SIGINT of ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    bit = 1 << (signal.SIGINT - 1)
    return bool(int(fields["SigCgt"], 16) & bit), bool(int(fields["SigIgn"], 16) & bit)


def _command_child_with_default_int(launcher_pid: int) -> int | None:
    """The launcher's command child (not its env probe) once its INT is at the default."""
    try:
        kids = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for kid in map(int, kids):
        if cmdline(kid)[:1] == [b"env"]:
            continue
        if _int_bits(kid) == (False, False):
            return kid
    return None


def test_group_int_is_never_lost_once_the_command_child_exists(
    launcher: Launcher, bb_env: dict[str, str]
) -> None:
    # From the moment the child has INT at the default (before or after it exec'd the command),
    # a group INT ends it: 130 and a receipt, every time.
    for _ in range(10):
        task = launcher.start(["sleep", "5"], env=bb_env)
        wait_for(lambda: _command_child_with_default_int(task.pid), "the command child")
        os.killpg(task.pid, signal.SIGINT)
        assert task.wait() == 130
        assert task.receipt()["exitCode"] == 130


def test_signal_to_the_launcher_pid_alone_is_held_until_the_command_ends(
    launcher: Launcher, bb_env: dict[str, str], tmp_path: Path
) -> None:
    """The price of foreground mode, pinned down: a pid-alone TERM is not forwarded."""
    gate = tmp_path / "gate"
    task = launcher.start(
        ["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.02; done; exit 5"], env=bb_env
    )
    child = child_running(task.pid, "sh")
    os.kill(task.pid, signal.SIGTERM)
    time.sleep(0.3)  # a negative claim needs time to be false; nothing to await
    assert task.proc.poll() is None and alive(child)
    gate.touch()
    # The held TERM runs after the command, as a no-op: the command's own status is published.
    assert task.wait() == 5
    assert task.receipt()["exitCode"] == 5


# ---------------------------------------------------------------- a signal before the fork

FAKE_ENV = """#!/bin/sh
# The launcher's probe (`env -i --default-signal=...`, two arguments) blocks until released, then
# answers PROBE_RC; any other call is the real env.
if [ "$#" -eq 2 ]; then
    : > '{probing}'
    while [ ! -e '{release}' ]; do sleep 0.01; done
    exit {probe_rc}
fi
exec {real_env} "$@"
"""


@pytest.mark.parametrize("mode", ["foreground", "async"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGQUIT, signal.SIGTERM], ids=lambda s: s.name)
def test_signal_caught_before_the_fork_kills_the_child_instead_of_running_the_command(
    launcher: Launcher, shell: list[str], tmp_path: Path, mode: str, sig: signal.Signals
) -> None:
    """Deterministic: the launcher is held in its env probe (traps already set) when the signal
    comes. Async mode used to forward an INT or QUIT to a child that still ignored it."""
    real_env = shutil.which("env")
    assert real_env is not None
    if mode == "async" and launcher_mode([*shell], os.environ["PATH"]) != "async":
        pytest.skip("no GNU env with --default-signal on this PATH")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    probing, release, ran = tmp_path / "probing", tmp_path / "release", tmp_path / "ran"
    fake = bindir / "env"
    fake.write_text(
        FAKE_ENV.format(
            probing=probing,
            release=release,
            probe_rc=0 if mode == "async" else 1,
            real_env=real_env,
        )
    )
    fake.chmod(0o755)
    which = subprocess.run(
        [*shell, "-c", "command -v env"],
        env={"PATH": f"{bindir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    if which.stdout.strip() != str(fake):
        pytest.skip("this shell runs its own env applet, not the one on PATH")
    task = launcher.start(
        ["touch", str(ran)], env={"PATH": f"{bindir}:{os.environ['PATH']}"}
    )
    wait_for(probing.exists, "the launcher to be in its env probe")
    os.kill(task.pid, sig)  # caught and remembered: the probe is a foreground child
    release.touch()
    assert task.wait() == 128 + sig
    assert task.receipt()["exitCode"] == 128 + sig
    assert not ran.exists()  # the command never ran
