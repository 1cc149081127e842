"""What only a standby launcher (``ql-launcher --standby``) must do; the rest of its contract is the
classic compiled launcher's, which every other file here checks under ``compiled-standby`` too.

A standby is started before its run exists and waits, for hours perhaps, for ONE message that is the
run and the go-ahead at once (format: launcher.c, "Standby mode"), with exactly two descriptors: the
log and the host's working directory. Here: anything but a well-formed message with two descriptors
runs nothing (exit 125, empty log, no receipt); an idle standby holds nothing of its host (no
inherited descriptor, no argument, nothing that could keep another channel open) and leaves when its
host dies; the command gets the message's environment, directory and log and nothing of the
launcher's own; a signal before the message ends the task instead of running it.

These tests play the host themselves: they build the message field by field, send it with
``sendmsg`` and read the processes' /proc entries. Each one starts its own standby.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from ql_core.ids import new_id, shard_of
from ql_executors.local_process.factory import StandbyFactory
from ql_executors.local_process.launch import (
    STANDBY_SPEC_MAX,
    acknowledge,
    encode_task,
    spawn_standby,
    standby_message,
)

from .conftest import (
    DEADLINE_S,
    alive,
    child_running,
    children,
    cmdline,
    kill_groups_and_reap,
    new_token,
    parse_receipt_strict,
    proc_stat,
    require_tool,
    session_members,
    wait_for,
)

MAGIC = b"ql-standby-2"
STARTED_AT_MS = 1_700_000_000_000


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is not on PATH"
    return path


TOUCH, SLEEP = _tool("touch"), _tool("sleep")


@pytest.fixture(scope="module")
def binary() -> str:
    """The compiled launcher, built as conftest builds it (skipped, or failed under CI=true)."""
    from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher

    try:
        return compiled_launcher(os.environ)
    except CompiledLauncherError as exc:
        return require_tool(None, f"the compiled launcher cannot be built here: {exc}")[0]


# ---------------------------------------------------------------- one run, one standby


@dataclass
class Run:
    """The ids, token and files of one attempt; ``marker`` is what its command would create."""

    shard: Path
    run_id: str
    attempt_id: str
    token: str
    log: Path
    marker: Path

    @property
    def receipt_path(self) -> Path:
        return self.shard / f"{self.attempt_id}.json"

    def fields(self, *, magic: bytes = MAGIC, shard: bytes | None = None, run_id: bytes | None = None,
               attempt_id: bytes | None = None, seq: bytes = b"1", started: bytes = str(STARTED_AT_MS).encode(),
               mode: bytes = b"argv+c", limits: bytes = b",,,,", cwd: bytes = b"", words: Sequence[bytes] | None = None,
               argc: bytes | None = None, env: Sequence[bytes] | None = None, envc: bytes | None = None,
               token: bytes | None = None) -> list[bytes]:
        """The message's fields, each NUL-terminated on the wire; every one can be overridden."""
        words = [TOUCH.encode(), bytes(self.marker)] if words is None else list(words)
        env = [b"PATH=" + os.environb[b"PATH"]] if env is None else list(env)
        return [magic, bytes(self.shard) if shard is None else shard,
                self.run_id.encode() if run_id is None else run_id,
                self.attempt_id.encode() if attempt_id is None else attempt_id, seq, started, mode, limits, cwd,
                str(len(words)).encode() if argc is None else argc, *words,
                str(len(env)).encode() if envc is None else envc, *env,
                self.token.encode() if token is None else token]

    def message(self, **overrides: object) -> bytes:
        return join(self.fields(**overrides))  # type: ignore[arg-type]

    def shard_entries(self) -> list[str]:
        return sorted(os.listdir(self.shard))

    def receipt(self) -> dict[str, object]:
        obj = parse_receipt_strict(self.receipt_path.read_bytes())
        assert (obj["runId"], obj["attemptId"], obj["token"]) == (self.run_id, self.attempt_id, self.token)
        assert (obj["callbackSequence"], obj["startedAtMs"]) == (1, STARTED_AT_MS)
        return obj

    def assert_nothing_ran(self) -> None:
        assert not self.marker.exists(), "the command ran"
        assert self.log.read_bytes() == b""
        assert self.shard_entries() == []


def join(fields: Sequence[bytes]) -> bytes:
    return b"\0".join(fields) + b"\0"


def open_dir(path: str | os.PathLike[str]) -> int:
    """What the executor sends as the host's working directory."""
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


class Standby:
    """One standby launcher and our end of its channel."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: socket.socket, run: Run) -> None:
        self.proc, self.channel, self.run = proc, channel, run

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fds(self) -> dict[int, str]:
        """The launcher's descriptors and what they point at."""
        out = {}
        for name in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                out[int(name)] = os.readlink(f"/proc/{self.pid}/fd/{name}")
            except FileNotFoundError:
                pass  # closed while we looked
        return out

    def idle(self) -> bool:
        """Blocked in recvmsg: its set-up (descriptors, handlers) is done."""
        return (proc_stat(self.pid) or ["?"])[0] == "S"

    def send(self, message: bytes, fds: Sequence[int]) -> int:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        return self.channel.sendmsg([message], ancillary, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)

    def hand_over(self, message: bytes, *, cwd: str | os.PathLike[str], keep_channel: bool = False) -> None:
        """Send ``message`` with the run's log and ``cwd`` (as the executor does), then let go of
        both descriptors and, unless ``keep_channel`` (awaited), of the channel."""
        log_fd = os.open(self.run.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        cwd_fd = open_dir(cwd)
        try:
            assert self.send(message, [log_fd, cwd_fd]) == len(message)
        finally:
            os.close(log_fd)
            os.close(cwd_fd)
            if not keep_channel:
                self.channel.close()

    def wait(self) -> int:
        return self.proc.wait(DEADLINE_S)


class Host:
    """Plays the host: new runs, and standbys started by spawn_standby or by hand."""

    def __init__(self, binary: str, tmp_path: Path) -> None:
        self.binary, self.tmp = binary, tmp_path
        self.started: list[Standby] = []

    def new_run(self) -> Run:
        run_id, attempt_id = new_id(), new_id()
        shard = self.tmp / "receipts" / shard_of(attempt_id)
        shard.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = self.tmp / f"{attempt_id}.log"
        log.touch(mode=0o600)
        return Run(shard, run_id, attempt_id, new_token(), log, self.tmp / f"{attempt_id}.ran")

    def standby(self) -> Standby:
        proc, channel, _capacity = spawn_standby(self.binary)
        return self._keep(proc, channel)

    def standby_by_hand(self, prefix: Sequence[str] = (), pass_fds: Sequence[int] = (),
                        env: dict[str, str] | None = None) -> Standby:
        """``[*prefix, binary, --standby]`` with the channel on stdin, and whatever ``pass_fds``
        keeps open: a host that does not close its descriptors, as the launcher must assume."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen([*prefix, self.binary, "--standby"], stdin=theirs.fileno(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=tuple(pass_fds),
                                    start_new_session=True, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return self._keep(proc, ours)

    def _keep(self, proc: subprocess.Popen[bytes], channel: socket.socket) -> Standby:
        one = Standby(proc, channel, self.new_run())
        self.started.append(one)
        return one

    def cleanup(self) -> None:
        kill_groups_and_reap([one.proc for one in self.started])
        for one in self.started:
            one.channel.close()


@pytest.fixture
def host(binary: str, tmp_path: Path) -> Iterator[Host]:
    h = Host(binary, tmp_path)
    try:
        yield h
    finally:
        h.cleanup()


def refused(one: Standby) -> None:
    """Exit 125 and nothing else: no command, no log line, no receipt."""
    assert one.wait() == 125
    one.run.assert_nothing_ran()


# ---------------------------------------------------------------- the message


def test_the_message_of_these_tests_is_the_executors(host: Host) -> None:
    """The positive control of every refusal below: the fields built here are byte for byte what
    standby_message sends, and that message runs its command and publishes its receipt."""
    one = host.standby()
    run = one.run
    task = encode_task([TOUCH, str(run.marker)], shell=False, cwd=None, env={"PATH": os.environ["PATH"]})
    expected = standby_message(shard_dir=run.shard, run_id=run.run_id, attempt_id=run.attempt_id,
                               callback_sequence=1, started_at_ms=STARTED_AT_MS, task=task, token=run.token,
                               awaited=False)
    assert run.message() == expected
    one.hand_over(expected, cwd=host.tmp)
    assert one.wait() == 0
    assert run.marker.exists()
    assert run.receipt()["exitCode"] == 0
    assert run.shard_entries() == [f"{run.attempt_id}.json"]
    assert run.log.read_bytes() == b""


# Each case: the message a broken (or hostile) host might send, from the valid one of the run.
MALFORMED: dict[str, Callable[[Run], bytes]] = {
    "empty datagram": lambda r: b"",
    "wrong magic": lambda r: r.message(magic=b"ql-standby-1"),
    "magic with a suffix": lambda r: r.message(magic=b"ql-standby-2x"),
    "limits with four fields": lambda r: r.message(limits=b",,,"),
    "limits with six fields": lambda r: r.message(limits=b",,,,,"),
    "limits not a number": lambda r: r.message(limits=b",1x,,,"),
    "limits with a leading zero": lambda r: r.message(limits=b",01,,,"),
    "limits negative": lambda r: r.message(limits=b",-1,,,"),
    "no limits field": lambda r: join([f for i, f in enumerate(r.fields()) if i != 7]),
    "no magic": lambda r: join(r.fields()[1:]),
    "bytes after the token": lambda r: join([*r.fields(), b"x"]),
    "an empty field after the token": lambda r: r.message() + b"\0",
    "no final NUL": lambda r: r.message()[:-1],
    "argc 0": lambda r: r.message(words=[]),
    "argc larger than the words present": lambda r: r.message(argc=b"3"),
    "argc far larger than the message": lambda r: r.message(argc=b"196608"),
    "argc above SPEC_MAX": lambda r: r.message(argc=b"9007199254740991"),
    "argc with a leading zero": lambda r: r.message(argc=b"02"),
    "argc not a number": lambda r: r.message(argc=b"2x"),
    "argc empty": lambda r: r.message(argc=b""),
    "argc smaller than the words": lambda r: r.message(argc=b"1"),
    "envc larger than present": lambda r: r.message(envc=b"2"),
    "envc far larger than present": lambda r: r.message(envc=b"3"),
    "envc smaller than present": lambda r: r.message(env=[b"A=1", b"B=2"], envc=b"1"),
    "envc negative": lambda r: r.message(envc=b"-1"),
    "an env entry without '='": lambda r: r.message(env=[b"PATH=/bin", b"NOEQUALS"]),
    "an env entry starting with '='": lambda r: r.message(env=[b"PATH=/bin", b"=value"]),
    "an env entry that is just '='": lambda r: r.message(env=[b"="]),
    "an empty env entry": lambda r: r.message(env=[b""]),
    "relative shard": lambda r: r.message(shard=b"receipts/" + r.shard.name.encode()),
    "empty shard": lambda r: r.message(shard=b""),
    "run id a uuid4": lambda r: r.message(run_id=b"1b4e28ba-2fa1-41d2-883f-0016d3cca427"),
    "attempt id upper-case": lambda r: r.message(attempt_id=r.attempt_id.upper().encode()),
    "attempt id without dashes": lambda r: r.message(attempt_id=r.attempt_id.replace("-", "").encode()),
    "seq 0": lambda r: r.message(seq=b"0"),
    "seq with a leading zero": lambda r: r.message(seq=b"01"),
    "seq above 2^53-1": lambda r: r.message(seq=b"9007199254740992"),
    "seq negative": lambda r: r.message(seq=b"-1"),
    "started empty": lambda r: r.message(started=b""),
    "started with a sign": lambda r: r.message(started=b"+1"),
    "mode with an unknown flag": lambda r: r.message(mode=b"argv+z"),
    "unknown mode": lambda r: r.message(mode=b"exec+c"),
    "empty mode": lambda r: r.message(mode=b""),
    "shell mode with 2 words": lambda r: r.message(mode=b"shell+c", words=[b"touch " + bytes(r.marker), b"x"]),
    "token too short": lambda r: r.message(token=b"A" * 31),
    "token too long": lambda r: r.message(token=b"A" * 129),
    "empty token": lambda r: r.message(token=b""),
    "token with '!'": lambda r: r.message(token=b"A" * 40 + b"!"),
    "token with '='": lambda r: r.message(token=b"A" * 40 + b"="),
    "token with a space": lambda r: r.message(token=b"A" * 20 + b" " + b"A" * 20),
    "token with a newline": lambda r: r.message(token=b"A" * 40 + b"\n"),
    "token not ascii": lambda r: r.message(token=b"A" * 40 + "é".encode()),
}
# A message cut after any of its fields: a field is missing, and the rest no longer adds up.
for _n in range(1, 14):
    MALFORMED[f"cut after {_n} fields"] = lambda r, n=_n: join(r.fields()[:n])  # type: ignore[misc]


@pytest.mark.parametrize("build", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_runs_nothing(host: Host, build: Callable[[Run], bytes]) -> None:
    """Whatever breaks the format is no go-ahead: the launcher exits 125 before forking, so the
    command (which would create the marker) never runs, the log stays empty and no receipt is
    published - the attempt is lost, never run on a guess."""
    one = host.standby()
    message = build(one.run)
    assert message != one.run.message()
    one.hand_over(message, cwd=host.tmp)
    refused(one)


VALID_EDGES: dict[str, Callable[[Run], bytes]] = {
    "token of 32 characters": lambda r: r.message(token=b"_-" * 16),
    "token of 128 characters": lambda r: r.message(token=b"aZ9-" * 32),
    "no environment at all": lambda r: r.message(env=[]),
    "an empty value": lambda r: r.message(env=[b"EMPTY=", b"PATH=/nonexistent"]),
    "a value holding '=' and a newline": lambda r: r.message(env=[b"A==b=\nc"]),
    "seq 2^53-1 and started 0": lambda r: r.message(seq=b"9007199254740991", started=b"0"),
    "the bare mode word": lambda r: r.message(mode=b"argv"),
    "every flag": lambda r: r.message(mode=b"argv+cep"),
    "shell mode": lambda r: r.message(mode=b"shell", words=[b"exec touch " + bytes(r.marker)]),
}


@pytest.mark.parametrize("build", VALID_EDGES.values(), ids=VALID_EDGES.keys())
def test_messages_at_the_edges_of_the_format_run(host: Host, build: Callable[[Run], bytes]) -> None:
    """The other side of the refusals: what the format allows is run, so that a refusal above is
    about the one thing its case breaks."""
    one = host.standby()
    run = one.run
    one.hand_over(build(run), cwd=host.tmp)
    assert one.wait() == 0
    assert run.marker.exists()
    assert parse_receipt_strict(run.receipt_path.read_bytes())["exitCode"] == 0


@pytest.mark.parametrize("count", [0, 1, 3, 5], ids=lambda n: f"{n} fds")
def test_anything_but_two_descriptors_runs_nothing(host: Host, count: int) -> None:
    """Exactly the log and the directory: with fewer the command would write to /dev/null or run
    in the launcher's own directory, with more something unknown would be held. (5 is more than
    the launcher has room for: the kernel cuts the control data, MSG_CTRUNC.)"""
    one = host.standby()
    fds = [os.open(one.run.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)] + \
          [open_dir(host.tmp) for _ in range(count - 1)] if count else []
    try:
        message = one.run.message()
        assert one.send(message, fds) == len(message)
    finally:
        for fd in fds:
            os.close(fd)
    one.channel.close()
    refused(one)


def test_the_descriptors_of_a_refused_message_are_closed_not_left(host: Host) -> None:
    """An extra descriptor (here the write end of a pipe) is closed as soon as the message is
    refused, each one the launcher was given - not left to its exit. Seen through strace: every
    number recvmsg installed is closed before exit_group."""
    strace = require_tool([shutil.which("strace")] if shutil.which("strace") else None,  # type: ignore[list-item]
                          "strace is not installed")[0]
    trace = host.tmp / "strace.out"
    for count in (3, 5):
        one = host.standby_by_hand(prefix=[strace, "-f", "-qq", "-o", str(trace),
                                           "-e", "trace=recvmsg,close,exit_group"])
        r, w = os.pipe()
        fds = [os.open(one.run.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC), open_dir(host.tmp)]
        fds += [w] * (count - 2)
        try:
            one.send(one.run.message(), fds)
        finally:
            for fd in {*fds}:
                os.close(fd)
        one.channel.close()
        try:
            refused(one)
            readable, _, _ = select.select([r], [], [], DEADLINE_S)
            assert readable and os.read(r, 1) == b"", "a copy of the write end is still open"
        finally:
            os.close(r)
        lines = trace.read_text().splitlines()
        received = next(line for line in lines if "recvmsg(" in line)
        assert "SCM_RIGHTS" in received, received
        got = [int(n) for n in received.split("cmsg_data=[", 1)[1].split("]", 1)[0].split(",")]
        assert len(got) == min(count, 4), received  # room for 4: a fifth is never installed
        assert ("MSG_CTRUNC" in received) == (count > 4), received
        after = lines[lines.index(received) + 1:]
        closed = {int(line.split("close(", 1)[1].split(")", 1)[0]) for line in after if " close(" in line}
        assert set(got) <= closed, (got, after)
        assert "exit_group(125)" in after[-1], after


def _padded(run: Run, size: int) -> bytes:
    """A valid message of exactly ``size`` bytes: environment entries of 1 KiB (each well under
    execve's per-string limit) and one more to make up the rest."""
    env = [b"PAD%d=" % i + b"x" * 1000 for i in range((size - 2048) // 1010)]
    rest = size - len(run.message(env=[*env, b"Z="]))
    assert rest >= 0
    message = run.message(env=[*env, b"Z=" + b"z" * rest])
    assert len(message) == size
    return message


@pytest.mark.parametrize("size, runs", [(STANDBY_SPEC_MAX, True), (STANDBY_SPEC_MAX + 1, False),
                                        (STANDBY_SPEC_MAX + 2, False), (320 * 1024, False)],
                         ids=["SPEC_MAX", "SPEC_MAX+1", "SPEC_MAX+2", "320KiB"])
def test_a_message_larger_than_spec_max_runs_nothing(host: Host, size: int, runs: bool) -> None:
    """SPEC_MAX (launch.py STANDBY_SPEC_MAX) is the largest message; one byte more is refused, so
    the host's bound and the launcher's are the same number. A message above the buffer arrives
    cut (MSG_TRUNC): its end is lost and it is never run. The socket's default send buffer may
    refuse a message that large; ours is enlarged so that the launcher has to see it."""
    one = host.standby()
    message = _padded(one.run, size)
    one.channel.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * size)
    one.hand_over(message, cwd=host.tmp)
    if runs:
        assert one.wait() == 0
        assert one.run.marker.exists()
        assert one.run.receipt()["exitCode"] == 0
    else:
        refused(one)


def test_eof_without_a_message_runs_nothing(host: Host) -> None:
    """The host went away (or closed the channel) before it sent the run: 125, nothing at all."""
    one = host.standby()
    wait_for(one.idle, "the standby to wait")
    one.channel.close()
    refused(one)


# ---------------------------------------------------------------- an idle standby


def test_an_idle_standby_holds_nothing_of_its_host(host: Host) -> None:
    """Started while its host holds an inheritable descriptor: the standby has stdin (now
    /dev/null), stdout and stderr (/dev/null) and its channel, nothing else; its argv is its path
    and --standby, and it leads its own session and group."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        one = host.standby()
        wait_for(one.idle, "the standby to wait")
        fds = one.fds()
    finally:
        os.close(r)
        os.close(w)
    assert sorted(fds) == [0, 1, 2, 3], fds
    assert fds[0] == fds[1] == fds[2] == "/dev/null"
    assert fds[3].startswith("socket:")
    assert cmdline(one.pid) == [host.binary.encode(), b"--standby"]
    # It may wait long and its command may run for days: it never pins the host's directory.
    assert os.readlink(f"/proc/{one.pid}/cwd") == "/"
    st = proc_stat(one.pid)
    assert st is not None and int(st[2]) == int(st[3]) == one.pid  # pgrp, session
    assert one.proc.poll() is None


@pytest.mark.parametrize("close_range", [True, False], ids=["close_range", "proc-walk"])
def test_the_standby_closes_what_a_careless_host_left_open(host: Host, close_range: bool) -> None:
    """A host that does not close its descriptors (not ql's: it uses close_fds) leaves them to the
    standby, maybe for hours: the launcher closes - not just marks close-on-exec - every one above
    2 but its channel, below and above the channel's number. Without close_range (ENOSYS, injected
    with strace) it walks /proc/self/fd, 256 at a time: 300 leaked descriptors take two walks."""
    r, pipe_w = os.pipe()
    # fds 3 and 5 open, 4 free: the channel (moved from stdin to the lowest free number >= 3) lands
    # between two leaked descriptors; ``w`` and the copies keep their numbers, all above 9.
    prefix = ["/bin/sh", "-c", 'exec 3</dev/null 5</dev/null; exec "$@"', "sh"]
    w = fcntl.fcntl(pipe_w, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(pipe_w)
    extra = [fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10) for _ in range(0 if close_range else 300)]
    if not close_range:
        strace = require_tool([shutil.which("strace")] if shutil.which("strace") else None,  # type: ignore[list-item]
                              "strace is not installed")[0]
        prefix = [strace, "-f", "-qq", "-o", "/dev/null", "-e", "trace=close_range",
                  "-e", "inject=close_range:error=ENOSYS", *prefix]
    try:
        one = host.standby_by_hand(prefix=prefix, pass_fds=(w, *extra))
        for fd in (w, *extra):
            os.close(fd)

        def launcher_pid() -> int | None:
            if close_range:
                return one.pid
            # strace's child, once it exec'd the launcher: its whole argv, not just "--standby" at the
            # end - strace's own children have that too (its start-up probes fork short-lived copies
            # of strace, and the tracee is strace, then sh, before it is the launcher).
            launcher = [host.binary.encode(), b"--standby"]
            return next((kid for kid in children(one.pid) if cmdline(kid) == launcher), None)

        pid = wait_for(launcher_pid, "the launcher to start")
        assert isinstance(pid, int)

        def fds() -> dict[int, str]:
            out = {}
            for name in os.listdir(f"/proc/{pid}/fd"):
                try:
                    out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
                except FileNotFoundError:
                    pass
            return out

        wait_for(lambda: (proc_stat(pid) or ["?"])[0] == "S" and sorted(fds()) == [0, 1, 2, 4],
                 "the standby to hold only 0-2 and its channel",
                 diagnose=lambda: f"it is {proc_stat(pid)} and holds {sorted(fds()) if alive(pid) else '-'}")
        assert fds()[4].startswith("socket:")
        if close_range:  # strace holds its own copies; the launcher is the only holder otherwise
            readable, _, _ = select.select([r], [], [], DEADLINE_S)
            assert readable and os.read(r, 1) == b"", "a copy of the write end is still open"
        # And it still works: the run it is handed goes ahead.
        one.hand_over(one.run.message(), cwd=host.tmp)
        assert one.wait() == 0
        assert one.run.marker.exists()
    finally:
        os.close(r)


def test_a_careless_host_cannot_keep_another_standbys_channel_open(host: Host) -> None:
    """Why closing matters: a standby started by a host that leaks descriptors would otherwise
    hold the host's end of every other standby's channel, and those would never see EOF when the
    host dies - they would wait forever. Here B is given A's host end; closing ours ends A."""
    a = host.standby()
    b = host.standby_by_hand(pass_fds=(a.channel.fileno(),))
    wait_for(lambda: b.idle() and len(b.fds()) == 4, "B to close what it inherited")  # 0-2, its channel
    a.channel.close()
    refused(a)
    assert b.proc.poll() is None  # B is not disturbed: it still waits for its own run


HOST_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from ql_executors.local_process.launch import spawn_standby

    proc, channel, _capacity = spawn_standby(sys.argv[1])
    print(proc.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_standby_leaves_when_its_host_dies(binary: str, tmp_path: Path) -> None:
    """The host is SIGKILLed while its standby is idle: the channel's other end is gone with it,
    the standby reads EOF and exits (125, seen by nobody: it is init's child now), and nothing of
    its group stays behind - an idle standby never outlives its host."""
    _kill_the_host_and_see_its_launchers_leave(HOST_SCRIPT, binary, tmp_path)


def _kill_the_host_and_see_its_launchers_leave(host_script: str, binary: str, tmp_path: Path) -> None:
    """Run ``host_script`` (it prints the pids of its idle launchers on one line), check each is the
    host's child and waiting, SIGKILL the host, and see every launcher exit with nothing of its
    group left behind."""
    script = tmp_path / "host.py"
    script.write_text(host_script)
    parent = subprocess.Popen([sys.executable, str(script), binary], stdout=subprocess.PIPE)
    pids: list[int] = []
    try:
        assert parent.stdout is not None
        pids = [int(word) for word in parent.stdout.readline().split()]
        assert pids, "the host printed no pid"
        for pid in pids:
            wait_for(lambda: (proc_stat(pid) or ["?"])[0] == "S", "the launcher to wait")
            assert int(proc_stat(pid)[1]) == parent.pid  # type: ignore[index]
        parent.kill()
        assert parent.wait(DEADLINE_S) == -signal.SIGKILL
        for pid in pids:
            wait_for(lambda: not alive(pid), "the launcher to exit", timeout=5)
            wait_for(lambda: not session_members(pid), "its group to be gone", timeout=5)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
        for pid in pids:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


# ---------------------------------------------------------------- the factory (--factory)


@pytest.fixture
def factory(binary: str) -> Iterator[StandbyFactory]:
    made = StandbyFactory(binary)
    try:
        yield made
    finally:
        made.close()


def _factory_pid(made: StandbyFactory) -> int:
    return made._child.pid  # noqa: SLF001 - the test looks at the process itself


def test_a_factory_forks_standbys_that_are_the_hosts_own(host: Host, factory: StandbyFactory) -> None:
    """Each standby the factory forks is this host's child (it reaps it), leads its own session,
    shows --standby, holds stdin/stdout/stderr (/dev/null) and its channel only — nothing of the
    factory's — waits in /, and runs the run it is handed like any standby."""
    made = []
    for _ in range(2):
        proc, channel, capacity = factory.standby()
        one = host._keep(proc, channel)  # noqa: SLF001 - cleaned up with the others
        made.append(one)
        assert capacity > 0
        wait_for(one.idle, "the standby to wait")
        st = proc_stat(one.pid)
        assert st is not None and int(st[1]) == os.getpid()  # ours, not the factory's
        assert int(st[2]) == int(st[3]) == one.pid  # its own group and session
        assert cmdline(one.pid) == [host.binary.encode(), b"--standby"]
        assert os.readlink(f"/proc/{one.pid}/cwd") == "/"
        fds = one.fds()
        assert sorted(fds)[:3] == [0, 1, 2] and len(fds) == 4, fds
        assert fds[0] == fds[1] == fds[2] == "/dev/null"
        assert [v for k, v in fds.items() if k > 2][0].startswith("socket:")
    assert made[0].pid != made[1].pid
    assert cmdline(_factory_pid(factory)) == [host.binary.encode(), b"--factory"]
    for one in made:
        one.hand_over(one.run.message(), cwd=host.tmp)
        assert one.wait() == 0
        assert one.run.marker.exists()
        assert one.run.receipt()["exitCode"] == 0


def test_a_factory_ends_on_eof_and_on_a_broken_request(binary: str) -> None:
    """Its host let go of it (EOF), or asked for anything but one "n": it exits 125, forking nothing."""
    for request in (None, b"x", b"nn"):
        made = StandbyFactory(binary)
        try:
            pid = _factory_pid(made)
            wait_for(lambda: (proc_stat(pid) or ["?"])[0] == "S", "the factory to wait")
            if request is None:
                made._channel.close()  # noqa: SLF001
            else:
                made._channel.send(request)  # noqa: SLF001
            assert made._child.process.wait(DEADLINE_S) == 125  # noqa: SLF001
            assert children(os.getpid()).count(pid) == 0
        finally:
            made.close()


FACTORY_HOST_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from ql_executors.local_process.factory import StandbyFactory

    factory = StandbyFactory(sys.argv[1])
    proc, channel, _capacity = factory.standby()
    print(factory._child.pid, proc.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_factory_and_its_standby_leave_when_their_host_dies(binary: str, tmp_path: Path) -> None:
    """The host is SIGKILLed with its factory and a standby it forked idle: both exit, and nothing
    of their groups stays behind — neither ever outlives its host."""
    _kill_the_host_and_see_its_launchers_leave(FACTORY_HOST_SCRIPT, binary, tmp_path)


def test_a_factory_started_through_an_intermediary_forks_nothing(binary: str) -> None:
    """Its forks must be its owner's children: under a tracer (its parent is not the owner) it
    refuses to serve (125), and the host gets no standby — it then starts them the classic way."""
    strace = require_tool([shutil.which("strace")] if shutil.which("strace") else None,  # type: ignore[list-item]
                          "strace is not installed")[0]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([strace, "-f", "-qq", "-o", "/dev/null", binary, "--factory"], stdin=theirs.fileno(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    theirs.close()
    try:
        try:
            ours.send(b"n")
        except BrokenPipeError:  # it refused and exited before the request (a loaded machine): same answer
            pass
        readable, _, _ = select.select([ours], [], [], DEADLINE_S)
        assert readable
        try:
            answer = ours.recv(64)
        except ConnectionResetError:  # it exited before it read the request
            answer = b""
        assert answer == b""  # EOF: no standby, no answer
        assert proc.wait(DEADLINE_S) == 125
    finally:
        ours.close()
        kill_groups_and_reap([proc])


# ---------------------------------------------------------------- after the hand-over


def test_neither_argv_nor_environ_carries_the_run(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The message is the only way in: the launcher's argv stays [path, --standby] and its
    environment stays empty - a task can read its parent's (/proc/$PPID/environ), so nothing of the
    host's is there; the command's argv is the message's words and its environment exactly the
    message's entries, in order, minus the launcher's own `_ql_` names. No token anywhere."""
    monkeypatch.setenv("QL_T_LAUNCHER_ONLY", "from the host at spawn time")
    monkeypatch.setenv("_ql_tok", "inherited by the launcher")
    one = host.standby()
    monkeypatch.undo()
    run = one.run
    wait_for(one.idle, "the standby to wait")
    idle_environ = Path(f"/proc/{one.pid}/environ").read_bytes()
    assert idle_environ == b""  # spawned with an empty environment: the host's is not exposed
    entries = [b"QL_T_ONE=1", b"_ql_status=forged", b"QL_T_EMPTY=", b"QL_T_ODD=a=b\nc d", b"_ql_tok=forged",
               b"QL_T_LAST=z"]
    one.hand_over(run.message(words=[SLEEP.encode(), b"30"], env=entries), cwd=host.tmp)
    child = child_running(one.pid, "sleep")
    token = run.token.encode()

    assert cmdline(one.pid) == [host.binary.encode(), b"--standby"]
    assert Path(f"/proc/{one.pid}/environ").read_bytes() == idle_environ
    assert cmdline(child) == [SLEEP.encode(), b"30"]
    kept = [e for e in entries if not e.startswith(b"_ql_")]
    assert Path(f"/proc/{child}/environ").read_bytes() == join(kept)
    for pid in (one.pid, child):
        assert token not in b"\0".join(cmdline(pid))
        assert token not in Path(f"/proc/{pid}/environ").read_bytes()
    assert b"QL_T_LAUNCHER_ONLY" not in Path(f"/proc/{child}/environ").read_bytes()

    os.kill(one.pid, signal.SIGTERM)
    assert one.wait() == 143
    assert run.receipt()["exitCode"] == 143
    assert token not in run.log.read_bytes()


@pytest.mark.parametrize("where", ["message", "launcher"])
def test_the_command_is_found_on_the_messages_path(host: Host, monkeypatch: pytest.MonkeyPatch,
                                                   where: str) -> None:
    """A bare command name is looked up in the message's PATH, as Popen(env=...) looks it up in
    env's: the PATH the standby was started with plays no part (127 when only it has the name)."""
    bin_dir = host.tmp / "bin"
    bin_dir.mkdir()
    prog = bin_dir / "ql-t-standby-probe"
    prog.write_text("#!/bin/sh\necho found\n")
    prog.chmod(0o755)
    if where == "launcher":
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    one = host.standby()
    monkeypatch.undo()
    path = f"{bin_dir}:{os.environ['PATH']}" if where == "message" else os.environ["PATH"]
    one.hand_over(one.run.message(words=[b"ql-t-standby-probe"], env=[b"PATH=" + path.encode()]), cwd=host.tmp)
    if where == "message":
        assert one.wait() == 0
        assert one.run.log.read_bytes() == b"found\n"
    else:
        assert one.wait() == 127
        assert one.run.receipt()["exitCode"] == 127


@pytest.mark.parametrize("cwd", ["", "sub", "absolute"])
def test_the_command_runs_in_the_directory_of_the_message(host: Host, cwd: str) -> None:
    """The host's directory comes as a descriptor; CWD is relative to it ("" is the directory
    itself) or absolute, as Popen's cwd= is relative to the host's directory."""
    host_dir = host.tmp / "host-cwd"
    (host_dir / "sub").mkdir(parents=True)
    elsewhere = host.tmp / "elsewhere"
    elsewhere.mkdir()
    field = {"": b"", "sub": b"sub", "absolute": bytes(elsewhere)}[cwd]
    expected = {"": host_dir, "sub": host_dir / "sub", "absolute": elsewhere}[cwd]
    one = host.standby()
    one.hand_over(one.run.message(mode=b"shell+c", words=[b"pwd -P"], cwd=field), cwd=host_dir)
    assert one.wait() == 0
    assert one.run.log.read_bytes() == os.fsencode(expected.resolve()) + b"\n"


def test_a_deleted_host_directory_still_works(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host runs in a directory that was removed: Popen would start the command there, and so
    does the standby - "." still opens, and the descriptor names that directory."""
    gone = host.tmp / "gone"
    gone.mkdir()
    inode = gone.stat().st_ino
    one = host.standby()
    monkeypatch.chdir(gone)
    gone.rmdir()
    # Not through a shell: dash warns on stderr when getcwd fails (as it would under Popen).
    one.hand_over(one.run.message(words=[_tool("stat").encode(), b"-c", b"%i", b"."]), cwd=".")
    monkeypatch.undo()
    assert one.wait() == 0
    assert one.run.log.read_bytes() == f"{inode}\n".encode()
    assert one.run.receipt()["exitCode"] == 0


@pytest.mark.parametrize("case", ["removed", "a file", "fd of a file"])
def test_a_directory_that_cannot_be_entered(host: Host, case: str) -> None:
    """CWD went away after the message was built (or is not a directory, or the descriptor is not
    one): the command does not run somewhere else. The log gets one line that names the reason,
    never the path; the status is 126 ("cannot execute"), and the receipt says so."""
    one = host.standby()
    host_dir = host.tmp / "secret-host-dir"
    (host_dir / "secret-sub").mkdir(parents=True)
    (host_dir / "secret-file").write_text("")
    field = b"secret-file" if case == "a file" else b"secret-sub"
    message = one.run.message(cwd=field)
    reason = os.strerror(errno.ENOENT if case == "removed" else errno.ENOTDIR)
    if case == "removed":
        (host_dir / "secret-sub").rmdir()
    log_fd = os.open(one.run.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    cwd_fd = os.open(host_dir / "secret-file", os.O_PATH | os.O_CLOEXEC) if case == "fd of a file" \
        else open_dir(host_dir)
    try:
        one.send(message, [log_fd, cwd_fd])
    finally:
        os.close(log_fd)
        os.close(cwd_fd)
    one.channel.close()
    assert one.wait() == 126
    log = one.run.log.read_bytes()
    assert log == f"ql launcher: cannot enter the working directory: {reason}\n".encode()
    assert b"secret" not in log
    assert not one.run.marker.exists()
    assert one.run.receipt()["exitCode"] == 126


@pytest.mark.parametrize("awaited", [False, True], ids=["plain", "awaited"])
def test_the_launcher_lets_go_of_the_log_and_the_directory(host: Host, awaited: bool) -> None:
    """Once CMD's process exists the launcher holds neither the log (only the command writes to
    it: a log closed by every writer is a finished log) nor the host's directory; plain, not even
    its channel; awaited, the channel and nothing else. The command holds 0-2 only: /dev/null and
    the log twice."""
    one = host.standby()
    run = one.run
    one.hand_over(run.message(words=[SLEEP.encode(), b"30"], mode=b"argv+ca" if awaited else b"argv+c"),
                  cwd=host.tmp, keep_channel=awaited)
    child = child_running(one.pid, "sleep")
    expected = [0, 1, 2, 3] if awaited else [0, 1, 2]

    def snapshot() -> tuple[dict[int, str], dict[int, os.stat_result]]:
        fds = one.fds()
        # Its self-pipe (both ends its own: the wait's wake-up on SIGCHLD and signals) aside.
        fds = {n: t for n, t in fds.items() if not (t.startswith("pipe:") and list(fds.values()).count(t) == 2)}
        theirs = {int(n): os.stat(f"/proc/{child}/fd/{n}") for n in os.listdir(f"/proc/{child}/fd")}
        return fds, theirs

    # The launcher closes what it no longer needs right after the exec: poll (bounded) until its
    # and CMD's fd sets are what they stay, then check them.
    settled: list[tuple[dict[int, str], dict[int, os.stat_result]]] = []

    def settles() -> bool:
        settled[:] = [snapshot()]
        return (sorted(settled[0][0]) == expected and sorted(settled[0][1]) == [0, 1, 2]
                and os.readlink(f"/proc/{one.pid}/cwd") == "/")

    try:
        wait_for(settles, "the launcher and CMD to hold only their own descriptors")
    except AssertionError:
        pass  # the assertions below say what is held
    fds, theirs = settled[0]
    assert sorted(fds) == expected, fds
    assert fds[0] == fds[1] == fds[2] == "/dev/null"
    if awaited:
        assert fds[3].startswith("socket:")
    assert sorted(theirs) == [0, 1, 2]
    log = run.log.stat()
    assert os.readlink(f"/proc/{child}/fd/0") == "/dev/null"
    for n in (1, 2):
        assert (theirs[n].st_dev, theirs[n].st_ino) == (log.st_dev, log.st_ino)
    assert os.readlink(f"/proc/{child}/cwd") == os.path.realpath(host.tmp)
    assert os.readlink(f"/proc/{one.pid}/cwd") == "/"  # never pins the host's directory

    os.kill(one.pid, signal.SIGTERM)
    assert one.wait() == 143
    if awaited:  # acknowledged completion, as under the classic launcher (test_launcher_acknowledged)
        assert one.channel.recv(1, socket.MSG_DONTWAIT) == b"s"
        acknowledge(one.channel, committed=True)
        wait_for(lambda: not session_members(one.pid), "the publisher to leave")
        assert run.shard_entries() == []
    else:
        assert run.receipt()["exitCode"] == 143


# ---------------------------------------------------------------- signals while idle


def _delivered(pid: int) -> bool:
    """No signal is pending for the process: the one just sent has reached its handler."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return int(fields["ShdPnd"], 16) == 0 and int(fields["SigPnd"], 16) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1],
                         ids=lambda s: s.name)
def test_a_signal_to_an_idle_standby_ends_it_and_no_later_run(host: Host, sig: signal.Signals) -> None:
    """A forwarded signal reaches a standby that has no run: it exits 125 at once, having run
    nothing and published nothing - a stray TERM must never become the next run's 143 - and the
    host learns it when it tries to hand a run over (the send fails: nothing ran)."""
    one = host.standby()
    wait_for(one.idle, "the standby to wait")
    os.kill(one.pid, sig)
    assert one.wait() == 125
    with pytest.raises(OSError) as raised:
        one.hand_over(one.run.message(), cwd=host.tmp)
    assert raised.value.errno in (errno.EPIPE, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENOTCONN)
    one.run.assert_nothing_ran()


def test_a_signal_inherited_as_ignored_does_not_end_an_idle_standby(host: Host) -> None:
    """A signal its host ignored (``nohup``) stays ignored, as for any launcher: it ends nothing."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        one = host.standby()
    finally:
        signal.signal(signal.SIGHUP, previous)
    wait_for(one.idle, "the standby to wait")
    os.kill(one.pid, signal.SIGHUP)
    time.sleep(0.2)  # a negative: it must still be there, waiting
    assert one.proc.poll() is None and one.idle()
    run = one.run
    one.hand_over(run.message(), cwd=host.tmp)
    assert one.wait() == 0 and run.marker.exists()


def test_a_signal_after_the_run_arrived_is_the_runs(host: Host, tmp_path: Path) -> None:
    """Once it holds a run the standby is a launcher like any other: a signal is forwarded to the
    command (or, before the fork, re-delivered in its place) - never the 125 of an idle one."""
    one = host.standby()
    run = one.run
    one.hand_over(run.message(words=[SLEEP.encode(), b"30"]), cwd=host.tmp)
    child_running(one.pid, "sleep")
    os.kill(one.pid, signal.SIGTERM)
    assert one.wait() == 128 + signal.SIGTERM
    assert run.receipt()["exitCode"] == 143


def test_sigkill_to_an_idle_standby(host: Host) -> None:
    """KILL cannot be caught: the standby dies, and the host learns it when it tries to hand over
    the run - the send fails (EPIPE: nobody holds the other end), so the host knows nothing ran."""
    one = host.standby()
    wait_for(one.idle, "the standby to wait")
    os.kill(one.pid, signal.SIGKILL)
    assert one.wait() == -signal.SIGKILL
    with pytest.raises(OSError) as raised:
        one.hand_over(one.run.message(), cwd=host.tmp)
    assert raised.value.errno in (errno.EPIPE, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENOTCONN)
    one.run.assert_nothing_ran()
