"""Protections every launcher enforces itself (LIMITS; docs/launcher.md, "Protections").

No host, supervisor or reader takes part: each test starts a launcher with its LIMITS, lets it go
and then only looks — at the process table, the log's size and the receipt. Run under every
launcher variant of the ``shell`` fixture (compiled, standby and the shells).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ql_core.clock import boot_ms
from ql_executors.local_process.launch import Limits

from .conftest import (
    DEADLINE_S,
    HeldLaunch,
    alive,
    is_compiled,
    launcher_mode,
    parse_receipt_strict,
    wait_for,
)

PY = sys.executable
#: A wall clock far from today's: the receipt's times must come from it plus boot-clock durations.
STARTED_AT_MS = 1_000_000_000

# Ignores TERM (as does a child it forks, which writes its pid first), says "ready", sleeps.
IGNORES_TERM = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
        os._exit(0)
    while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
        time.sleep(0.01)
    os.write(1, b"ready\\n")
    time.sleep(120)
""")

# Writes argv[1] bytes (a repeating pattern) in 64 KiB writes, then sleeps.
WRITER = textwrap.dedent("""
    import os, sys, time
    total = int(sys.argv[1])
    pattern = bytes(range(256)) * 256
    while total > 0:
        total -= os.write(1, pattern[:min(total, len(pattern))])
    time.sleep(120)
""")


class Held(HeldLaunch):
    """One launcher with LIMITS, let go at once; only looked at afterwards."""

    def __init__(self, shell: list[str], data_dir: Path, command: list[str], limits: Limits, *,
                 awaited: bool = False, started_at_ms: int = STARTED_AT_MS) -> None:
        super().__init__(shell, data_dir, command, started_at_ms=started_at_ms, awaited=awaited, limits=limits)
        self.go()

    @property
    def pid(self) -> int:
        return self.proc.pid  # type: ignore[attr-defined,no-any-return]

    def wait(self) -> int:
        return self.proc.wait(DEADLINE_S)  # type: ignore[attr-defined,no-any-return]

    def receipt(self) -> dict[str, object]:
        path = self.shard / f"{self.attempt_id}.json"
        wait_for(path.exists, "the receipt")
        return parse_receipt_strict(path.read_bytes())

    def duration_ms(self) -> int:
        receipt = self.receipt()
        assert receipt["startedAtMs"] == self.started_at_ms
        return int(receipt["finishedAtMs"]) - self.started_at_ms  # type: ignore[call-overload]


@pytest.fixture
def held(shell: list[str], tmp_path: Path):
    started: list[Held] = []

    def start(command: list[str], limits: Limits, **kwargs: object) -> Held:
        task = Held(shell, tmp_path, command, limits, **kwargs)  # type: ignore[arg-type]
        started.append(task)
        return task

    yield start
    for task in started:
        task.cleanup()


def now_boot() -> int:
    value = boot_ms()
    assert value is not None, "CLOCK_BOOTTIME is Linux's; these tests run on Linux"
    return value


def test_the_deadline_terms_the_command_at_its_time_on_the_boot_clock(held) -> None:
    task = held(["sleep", "60"], Limits(start_boot_ms=now_boot(), timeout_ms=1000, grace_ms=10_000))
    assert task.wait() == 128 + signal.SIGTERM
    assert task.receipt()["exitCode"] == 128 + signal.SIGTERM
    # finishedAtMs is STARTED_AT_MS + the boot-clock duration: never before the deadline, and
    # nothing like this machine's wall clock (decades after STARTED_AT_MS).
    assert 1000 <= task.duration_ms() < 1000 + DEADLINE_S * 1000


def test_a_start_long_ago_on_the_boot_clock_is_a_deadline_already_passed(held, shell: list[str]) -> None:
    """The deadline counts from the committed start (START_BOOT_MS), not from the launcher's start."""
    start = now_boot() - 5000
    task = held(["sleep", "60"], Limits(start_boot_ms=start, timeout_ms=3000, grace_ms=3000))
    # A shell launcher may lose a TERM that lands between its child's fork and exec (docs/launcher.md,
    # "Early signals"; it sends it once more 0.2 s later): then the KILL after the grace ends it.
    assert task.wait() in ((128 + signal.SIGTERM,) if is_compiled(shell) else (128 + signal.SIGTERM, 137))
    assert task.duration_ms() >= 5000


def test_after_the_deadline_the_grace_ends_in_kill_for_the_whole_group(held, shell: list[str],
                                                                      tmp_path: Path) -> None:
    """The deadline helper's KILL reaches the grandchild too. A foreground-mode launcher.sh (busybox
    without GNU env) used to KILL CMD in the same breath as the rest: seeing CMD end, the launcher
    could stop the helper between two of those KILLs and leave the grandchild stopped for good —
    under qemu-user with two burners, 4 runs in 11; CMD is now killed after the others."""
    pid_file = tmp_path / "grandchild.pid"
    task = held([PY, "-c", IGNORES_TERM, str(pid_file)],
                Limits(start_boot_ms=now_boot(), timeout_ms=500, grace_ms=1000))
    assert task.wait() == 128 + signal.SIGKILL
    assert task.receipt()["exitCode"] == 128 + signal.SIGKILL
    assert task.duration_ms() >= 1500  # TERM at the deadline, KILL a grace later
    grandchild = int(pid_file.read_text())
    wait_for(lambda: not alive(grandchild), "the TERM-ignoring grandchild to be killed")


def test_a_forwarded_term_is_followed_by_kill_after_the_grace(held, shell: list[str], tmp_path: Path) -> None:
    """What `ql cancel` sends (TERM to the group) ends a command that ignores it, with nobody else
    around: the launcher KILLs the group GRACE_MS later and still publishes the receipt."""
    if launcher_mode(shell) == "foreground":
        pytest.skip("in foreground mode (no GNU env) the shell runs no trap while the command runs: the KILL "
                    "after a cancel's grace is ql's there (docs/launcher.md, Protections)")
    pid_file = tmp_path / "grandchild.pid"
    task = held([PY, "-c", IGNORES_TERM, str(pid_file)], Limits(grace_ms=1000))
    wait_for(lambda: b"ready" in task.log.read_bytes(), "the command to ignore TERM")
    os.killpg(task.pid, signal.SIGTERM)
    assert task.wait() == 128 + signal.SIGKILL
    assert task.receipt()["exitCode"] == 128 + signal.SIGKILL
    wait_for(lambda: not alive(int(pid_file.read_text())), "the TERM-ignoring grandchild to be killed")


def test_no_grace_means_no_kill_from_the_launcher(held, tmp_path: Path) -> None:
    """Without GRACE_MS a TERM is forwarded and nothing more: the command that ignores it lives on."""
    pid_file = tmp_path / "grandchild.pid"
    task = held([PY, "-c", IGNORES_TERM, str(pid_file)], Limits())
    wait_for(lambda: b"ready" in task.log.read_bytes(), "the command to ignore TERM")
    os.killpg(task.pid, signal.SIGTERM)
    time.sleep(1.5)  # what a GRACE_MS of 1000 would have allowed
    assert task.proc.poll() is None and alive(int(pid_file.read_text()))


def test_the_log_is_cut_back_to_quota_plus_one_while_the_command_runs(held) -> None:
    quota, written = 64 * 1024, 4 * 1024 * 1024
    task = held([PY, "-c", WRITER, str(written)], Limits(quota_bytes=quota))
    # Nobody reads the log: the launcher alone brings it back to QUOTA + 1 bytes (the extra byte
    # tells the host's finalizer it was cut) while the command still runs.
    wait_for(lambda: task.log.stat().st_size == quota + 1, "the log cut back to the quota", timeout=DEADLINE_S)
    assert task.proc.poll() is None
    pattern = bytes(range(256)) * ((quota + 1) // 256 + 1)
    assert task.log.read_bytes() == pattern[:quota + 1]  # the first bytes, as written


def test_a_burst_before_the_quota_watch_is_cut_while_the_command_runs(held) -> None:
    """The compiled launcher sets up its watch of the log only once the command has run
    QUOTA_WATCH_AFTER_MS (100 ms): what the command wrote before that, all at once and then nothing
    (no write for the watch to see), is still cut a second after the start — while the command
    runs, not only when it ends."""
    quota = 4096
    task = held(["sh", "-c", "head -c 300000 /dev/zero; exec sleep 60"], Limits(quota_bytes=quota))
    wait_for(lambda: task.log.stat().st_size == quota + 1, "the log cut back to the quota", timeout=DEADLINE_S)
    assert task.proc.poll() is None


def test_a_log_under_its_quota_is_left_alone(held) -> None:
    task = held([PY, "-c", WRITER, "1000"], Limits(quota_bytes=1000))
    wait_for(lambda: task.log.stat().st_size == 1000, "the command's output")
    time.sleep(1.5)  # a check a second: one would have run
    assert task.log.stat().st_size == 1000


def test_the_publisher_stops_waiting_for_ok_after_ack_wait(held) -> None:
    """A host that reaped the launcher but never answers (frozen) does not keep the receipt back:
    after ACK_WAIT_MS the publisher publishes it, the channel still open."""
    task = held(["sh", "-c", "exit 3"], Limits(ack_wait_ms=500), awaited=True)
    assert task.wait() == 3
    assert task.channel.recv(1) == b"s"  # the launcher's exit status is the command's
    assert task.receipt()["exitCode"] == 3  # published with no "ok", no EOF


def test_the_command_gets_default_dispositions_and_no_blocked_signal(held, shell: list[str]) -> None:
    """A host that ignores HUP, INT and ALRM (nohup, `setsid ... &`) and blocks them: the command
    starts with every signal at its default; the compiled launcher also clears the mask."""
    if launcher_mode(shell) == "foreground":
        pytest.skip("in foreground mode (no GNU env) a signal ignored on entry stays ignored (POSIX shells)")
    # HUP and INT (forwarded ones), ALRM (one the launcher never touches otherwise).
    dropped = {signal.SIGHUP, signal.SIGINT, signal.SIGALRM}
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in dropped}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, dropped | {signal.SIGUSR1})
    try:
        task = held(["grep", "^Sig", "/proc/self/status"], Limits())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert task.wait() == 0
    fields = dict(re.findall(r"^(Sig\w+):\s*([0-9a-f]+)$", task.log.read_text(), re.M))
    assert int(fields["SigIgn"], 16) == 0  # (SigCgt is the command's own: grep catches SEGV)
    if is_compiled(shell):
        assert int(fields["SigBlk"], 16) == 0
    # The shell launcher cannot unblock (no shell or portable tool does): docs/launcher.md.


def test_a_command_from_a_nohup_host_dies_of_the_cancels_signals(held, shell: list[str]) -> None:
    if launcher_mode(shell) == "foreground":
        pytest.skip("in foreground mode (no GNU env) a signal ignored on entry stays ignored (POSIX shells)")
    dropped = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in dropped}
    blocked = {signal.SIGHUP, signal.SIGINT} if is_compiled(shell) else set()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        task = held(["sleep", "60"], Limits(grace_ms=10_000))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    wait_for(lambda: any(_program(p) == b"sleep" for p in _group(task.pid)), "the command to run")
    os.killpg(task.pid, signal.SIGINT)
    assert task.wait() == 128 + signal.SIGINT
    assert task.receipt()["exitCode"] == 128 + signal.SIGINT


def _program(pid: int) -> bytes:
    try:
        return os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0])
    except OSError:
        return b""  # gone meanwhile


def _group(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                tail = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(tail[2]) == pgid and tail[0] not in ("Z", "X"):
                out.append(int(entry))
    return out


def _voluntary_switches(pid: int) -> int:
    match = re.search(r"^voluntary_ctxt_switches:\s*(\d+)$", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert match is not None
    return int(match.group(1))


def test_an_idle_compiled_launcher_does_not_wake_up(held, shell: list[str]) -> None:
    """A silent command with a deadline and a quota: the compiled launcher sleeps in poll() until
    something happens — no wake-up at all (a context switch is counted at each)."""
    if not is_compiled(shell):
        pytest.skip("the shell launcher checks the quota with a helper that wakes once a second")
    task = held(["sleep", "60"], Limits(start_boot_ms=now_boot(), timeout_ms=60_000, grace_ms=10_000,
                                        quota_bytes=1 << 20))
    wait_for(lambda: len(_group(task.pid)) >= 2, "the command to run")
    time.sleep(0.5)
    before = _voluntary_switches(task.pid)
    time.sleep(2)
    assert _voluntary_switches(task.pid) == before


def test_a_writing_command_costs_at_most_two_wakeups_a_second(held, shell: list[str]) -> None:
    if not is_compiled(shell):
        pytest.skip("the shell launcher checks the quota with a helper that wakes once a second")
    ticker = "import os, time\nwhile True:\n    os.write(1, b'x' * 100)\n    time.sleep(0.02)\n"
    task = held([PY, "-c", ticker], Limits(quota_bytes=1 << 20))
    wait_for(lambda: task.log.stat().st_size > 0, "the command's output")
    before = _voluntary_switches(task.pid)
    time.sleep(3)
    # The first write after a check wakes it, the size check a second later wakes it again: two a
    # second, for 50 writes a second (+2 for a window that starts or ends between the two).
    assert _voluntary_switches(task.pid) - before <= 3 * 2 + 2
