"""Fixtures and helpers for the launcher tests: real shells, real processes, real files."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ql_core.testing.executor import wait_until
from ql_core.ids import new_id, shard_of
from ql_executors.local_process.launch import (
    Limits,
    _spawn_with_fd3,
    encode_task,
    hand_over,
    launcher_args,
    launcher_path,
    release,
    spawn_launcher,
    spawn_standby,
    standby_message,
)
from tests.processes import proc_stat

# bash-posix is bash as /bin/sh (RHEL, Fedora, macOS ...): POSIX mode changes how `wait` behaves.
# busybox-aarch64 is an AArch64 busybox ash run by qemu-user (no binfmt_misc needed): the launcher
# and the applets it runs in-process (ln, rm, sync, date) are AArch64 code; commands it starts by
# path or PATH (sleep, python, the host's sh) are the host's.
# compiled is launcher.c, built with this machine's C compiler (the `auto` default where one exists):
# the same contract, no shell at all. compiled-standby is the same binary started as a standby
# (`--standby`) before its run exists and handed the run in one message (the executor's default).
# compiled-aarch64 is the launcher shipped in the AArch64 wheel (tools/build_wheels.sh, Debian's
# cross compiler), run by qemu-user like busybox-aarch64.
# compiled-factory is a standby forked by a `--factory` launcher (what a host that keeps standbys
# ready uses from its second task on: ql_executors/local_process/factory.py).
SHELLS = ("dash", "bash", "bash-posix", "busybox", "busybox-aarch64", "compiled", "compiled-standby",
          "compiled-factory", "compiled-aarch64")
DEADLINE_S = 60.0  # failure detection only (a loaded machine can take 20 s); timing claims live in bench/
AARCH64_BUSYBOX_ENV = "QL_TEST_AARCH64_BUSYBOX"  # path of an AArch64 busybox binary (see .ci/run)
_EM_AARCH64 = 183  # ELF e_machine of AArch64


def _is_aarch64_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == _EM_AARCH64


def _aarch64_busybox() -> tuple[list[str] | None, str]:
    """argv of the emulated busybox ash, or None and why not."""
    busybox = os.environ.get(AARCH64_BUSYBOX_ENV, "")
    if not busybox:
        return None, f"{AARCH64_BUSYBOX_ENV} is not set (.ci/run fetches busybox-static:arm64)"
    if not _is_aarch64_elf(busybox):
        return None, f"{AARCH64_BUSYBOX_ENV}={busybox} is not an AArch64 ELF binary"
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        return None, "qemu-user (qemu-aarch64-static) is not installed"
    return [qemu, busybox, "sh"], ""


class CompiledLauncher(list):  # type: ignore[type-arg]
    """The ``shell`` fixture's value for the compiled launcher: ``[path of the built binary]``."""


class StandbyLauncher(CompiledLauncher):
    """The compiled launcher started as a standby and handed its run afterwards."""


class FactoryLauncher(StandbyLauncher):
    """A standby forked by the compiled launcher's factory (``--factory``) instead of exec'd."""


#: One factory per binary in this test process, started at the first use (as a host keeps one).
_FACTORIES: dict[str, Any] = {}


def new_standby(shell: list[str]) -> tuple[Any, socket.socket, int]:
    """A new idle standby for ``shell`` (a StandbyLauncher): exec'd (``spawn_standby``) or, for
    compiled-factory, forked by this process's factory; its process, our channel end, capacity."""
    if isinstance(shell, FactoryLauncher):
        from ql_executors.local_process.factory import StandbyFactory

        factory = _FACTORIES.get(shell[0])
        if factory is None or not factory.owned():
            factory = _FACTORIES[shell[0]] = StandbyFactory(shell[0])
        return factory.standby()
    return spawn_standby(shell[0])


def is_compiled(shell: list[str]) -> bool:
    return isinstance(shell, CompiledLauncher)


def is_standby(shell: list[str]) -> bool:
    return isinstance(shell, StandbyLauncher)


class GoAhead:
    """What lets a held launcher's command start: the token line (classic) or the run's message
    (standby). ``channel`` is the socket of an awaited launcher afterwards (``None`` otherwise)."""

    def __init__(self, channel: object, token: str, message: bytes | None = None, log_fd: int = -1,
                 cwd: str | os.PathLike[str] | None = None, awaited: bool = False) -> None:
        self.channel = channel
        self._token, self._message, self._log_fd, self._awaited = token, message, log_fd, awaited
        self._cwd_fd = os.open(cwd if cwd is not None else ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) \
            if message is not None else -1

    def __call__(self) -> None:
        if self._message is None:
            release(self.channel, self._token)  # type: ignore[arg-type]
        else:
            try:
                hand_over(self.channel, self._message, log_fd=self._log_fd, cwd_fd=self._cwd_fd)  # type: ignore[arg-type]
            finally:
                self.close_fds()
                if not self._awaited:  # as release() closes a token pipe: only an awaited channel stays
                    self.channel.close()  # type: ignore[attr-defined]

    def close_fds(self) -> None:
        for fd in (self._log_fd, self._cwd_fd):
            if fd >= 0:
                os.close(fd)
        self._log_fd = self._cwd_fd = -1


def spawn_held(shell: list[str], *, shard_dir: Path, run_id: str, attempt_id: str, callback_sequence: int,
               started_at_ms: int, mode: str, command: Sequence[str], token: str, log_fd: int,
               awaited: bool = False, hints: str = "", env: dict[str, str] | None = None,
               cwd: str | os.PathLike[str] | None = None, limits: Limits | None = None) -> tuple[object, GoAhead]:
    """A held launcher under ``shell`` and its go-ahead: ``spawn_launcher(hold=True)`` + ``release``,
    or for the standby a ``--standby`` launcher and the run's message (sent by the go-ahead)."""
    if is_standby(shell):
        proc, channel, _capacity = new_standby(shell)
        task = encode_task(command, shell=mode == "shell", cwd=None, env=env)
        message = standby_message(shard_dir=shard_dir, run_id=run_id, attempt_id=attempt_id,
                                  callback_sequence=callback_sequence, started_at_ms=started_at_ms, task=task,
                                  token=token, awaited=awaited, limits=limits)
        return proc, GoAhead(channel, token, message, os.dup(log_fd), cwd, awaited)
    proc, channel = spawn_launcher(**launcher_kwargs(shell), shard_dir=shard_dir, run_id=run_id,  # type: ignore[arg-type]
                                   attempt_id=attempt_id, callback_sequence=callback_sequence,
                                   started_at_ms=started_at_ms, mode=mode, command=command,  # type: ignore[arg-type]
                                   token=token, log_fd=log_fd, hold=True, awaited=awaited, hints=hints,
                                   env=env, cwd=cwd, limits=limits)
    return proc, GoAhead(channel, token)


class HeldLaunch:
    """One held launcher of a fresh run under ``data_dir``: its ids, token, receipt shard and log
    file, the process, and ``go`` (its go-ahead, not given yet). What the launcher test files that
    play the host in-process start from; ``spawn_kwargs`` go to :func:`spawn_held`."""

    def __init__(self, shell: list[str], data_dir: Path, command: list[str], *, started_at_ms: int,
                 **spawn_kwargs: object) -> None:
        self.run_id, self.attempt_id, self.token = new_id(), new_id(), new_token()
        self.started_at_ms = started_at_ms
        self.shard = data_dir / "receipts" / shard_of(self.attempt_id)
        self.shard.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log = data_dir / f"{self.attempt_id}.log"
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            self.proc, self.go = spawn_held(shell, shard_dir=self.shard, run_id=self.run_id,
                                            attempt_id=self.attempt_id, callback_sequence=1,
                                            started_at_ms=started_at_ms, mode="argv", command=command,
                                            token=self.token, log_fd=fd, **spawn_kwargs)  # type: ignore[arg-type]
        finally:
            os.close(fd)
        self.channel = self.go.channel

    def cleanup(self) -> None:
        """Kill the launcher's group, reap it, close the channel (the test's teardown)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        except ProcessLookupError:
            pass
        self.proc.wait(DEADLINE_S)  # type: ignore[attr-defined]
        if isinstance(self.channel, socket.socket):
            self.channel.close()


def launcher_kwargs(shell: list[str]) -> dict[str, object]:
    """The spawn_launcher arguments that pick this launcher."""
    return {"compiled": shell[0]} if is_compiled(shell) else {"shell": shell}


def _compiled(kind: type[CompiledLauncher] = CompiledLauncher) -> tuple[list[str] | None, str]:
    from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher

    try:
        return kind([compiled_launcher(os.environ)]), ""
    except CompiledLauncherError as exc:
        return None, f"the compiled launcher cannot be built here: {exc}"


def _shell_argv(name: str) -> tuple[list[str] | None, str]:
    if name == "compiled":
        return _compiled()
    if name == "compiled-standby":
        return _compiled(StandbyLauncher)
    if name == "compiled-factory":
        return _compiled(FactoryLauncher)
    if name == "busybox-aarch64":
        return _aarch64_busybox()
    if name == "busybox":
        path = "/bin/busybox" if os.path.exists("/bin/busybox") else shutil.which("busybox")
        return ([path, "sh"], "") if path else (None, "busybox is not installed")
    path = shutil.which(name.removesuffix("-posix"))
    if path is None:
        return None, f"{name} is not installed"
    return ([path, "--posix"] if name.endswith("-posix") else [path]), ""


def require_tool(argv: list[str] | None, why: str) -> list[str]:
    """Skip with the reason, or fail under CI=true, where every tool is required."""
    if argv is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; under CI=true it is required")
        pytest.skip(why)
    return argv


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> list[str]:
    """argv prefix of one of the shells every launcher test runs under."""
    if request.param == "compiled-aarch64":
        return require_tool(*request.getfixturevalue("shipped_aarch64_launcher"))
    return require_tool(*_shell_argv(request.param))


ROOT = Path(__file__).resolve().parents[2]
#: The cross compiler tools/build_wheels.sh uses for a wheel of another machine than this one.
CROSS_CC = {"aarch64": "aarch64-linux-gnu-gcc", "x86_64": "x86_64-linux-gnu-gcc"}


def _build_wheel(machine: str, out: Path) -> Path | str:
    """The ql-runner wheel for ``machine``, built by tools/build_wheels.sh into ``out``; a string
    says which tool is missing (skipped, or failed under CI=true). A build that fails is an error."""
    import importlib.util

    if importlib.util.find_spec("build") is None:
        return "the 'build' package is not installed (pip install build; it is in the dev extras)"
    cc = "cc" if machine == os.uname().machine else CROSS_CC[machine]
    if shutil.which(cc) is None:
        return f"no {cc} to build the {machine} wheel (.ci/run installs gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "QL_LAUNCHER_CC", "QL_LAUNCHER_BUILD")}
    done = subprocess.run([str(ROOT / "tools" / "build_wheels.sh"), "--out", str(out), machine],
                          env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600,
                          check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"tools/build_wheels.sh {machine} failed:\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def wheel_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``wheel_of(machine)``: the platform wheel for x86_64 or aarch64, built once per session (both
    are cheap to build, ~5 s each, so nothing is cached across sessions that could go stale)."""
    out = tmp_path_factory.mktemp("wheels")
    built: dict[str, Path | str] = {}

    def get(machine: str) -> Path:
        if machine not in built:
            built[machine] = _build_wheel(machine, out)
        wheel = built[machine]
        return require_tool(None, wheel) if isinstance(wheel, str) else wheel  # type: ignore[return-value]

    return get


@pytest.fixture(scope="session")
def shipped_aarch64_launcher(wheel_of: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
                             ) -> tuple[list[str] | None, str]:
    """The AArch64 wheel's launcher as a ``shell`` value: a one-line wrapper that execs it under
    qemu-user (same pid: the launcher is the process the host spawned), since spawn_launcher takes
    one path."""
    import zipfile

    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        return None, "qemu-user (qemu-aarch64-static) is not installed"
    wheel = wheel_of("aarch64")
    where = tmp_path_factory.mktemp("aarch64-launcher")
    binary = where / "launcher-aarch64"
    with zipfile.ZipFile(wheel) as z:
        binary.write_bytes(z.read("ql_executors/local_process/bin/launcher-aarch64"))
    binary.chmod(0o700)
    assert _is_aarch64_elf(str(binary))
    wrapper = where / "launcher"
    wrapper.write_text(f'#!/bin/sh\nexec "{qemu}" "{binary}" "$@"\n')
    wrapper.chmod(0o700)
    return CompiledLauncher([str(wrapper)]), ""


_MODES: dict[tuple[str, ...], str] = {}


def launcher_mode(shell: list[str], path: str | None = None) -> str:
    """"async" or "foreground": the mode launcher.sh picks under ``shell`` with this PATH.

    The launcher's own probe, run the same way: GNU env with --default-signal means async.
    The compiled launcher resets signals itself: always async.
    """
    if is_compiled(shell):
        return "async"
    key = (*shell, path or os.environ.get("PATH", ""))
    if key not in _MODES:
        env = dict(os.environ, PATH=key[-1])
        probe = subprocess.run(
            [*shell, "-c", 'env -i "--default-signal=INT" >/dev/null 2>&1'], env=env, check=False
        )
        _MODES[key] = "async" if probe.returncode == 0 else "foreground"
    return _MODES[key]


def requires_pid_forwarding(shell: list[str]) -> None:
    """Skip where the launcher runs CMD in the foreground and so cannot forward a pid-alone signal."""
    if launcher_mode(shell) == "foreground":
        pytest.skip(
            "without GNU env the launcher runs the command in the foreground: a signal to the "
            "launcher's pid alone is held, not forwarded (docs/launcher.md; see "
            "test_launcher_busybox_only.py)"
        )


def is_bash(shell: list[str]) -> bool:
    return os.path.basename(shell[0]) == "bash"


def new_token() -> str:
    return secrets.token_urlsafe(32)  # 43 chars of [A-Za-z0-9_-], 256 bits


def wait_for(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S, *,
             diagnose: Callable[[], object] | None = None) -> object:
    """ql_core.testing's poller (``wait_until``); ``diagnose`` is called at the time-out (what
    ``what`` would show is its state when the wait began)."""
    return wait_until(cond, what, timeout, diagnose=diagnose)


# ---------------------------------------------------------------- /proc helpers


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and int(st[1]) == pid:
                out.append(int(entry))
    return out


def session_members(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and int(st[3]) == sid and st[0] not in ("Z", "X"):
                out.append(int(entry))
    return out


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except (FileNotFoundError, ProcessLookupError):
        return []


def environ(pid: int) -> dict[bytes, bytes]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if item)


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def child_running(launcher_pid: int, program: str) -> int:
    """Wait until the launcher's direct child has exec'd ``program``; return its pid."""

    def find() -> int | None:
        for c in children(launcher_pid):
            argv = cmdline(c)
            if argv and os.path.basename(argv[0]) == program.encode():
                return c
        return None

    return int(wait_for(find, f"{program} under launcher {launcher_pid}"))  # type: ignore[arg-type]


# ---------------------------------------------------------------- receipts

_RECEIPT = re.compile(
    rb'\{"schemaVersion":1,"runId":"(?P<run>[^"]*)","attemptId":"(?P<att>[^"]*)",'
    rb'"callbackSequence":(?P<seq>0|[1-9][0-9]*),"token":"(?P<tok>[^"]*)",'
    rb'"startedAtMs":(?P<st>0|[1-9][0-9]*),"finishedAtMs":(?P<fin>0|[1-9][0-9]*),'
    rb'"exitCode":(?P<code>0|[1-9][0-9]*)\}'
)
_KEYS = [
    "schemaVersion",
    "runId",
    "attemptId",
    "callbackSequence",
    "token",
    "startedAtMs",
    "finishedAtMs",
    "exitCode",
]


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def parse_receipt_strict(raw: bytes) -> dict[str, object]:
    """Strict check of the exact canonical bytes, then of the JSON it decodes to."""
    assert len(raw) <= 4096
    assert _RECEIPT.fullmatch(raw), f"not canonical: {raw!r}"
    obj = json.loads(raw.decode("ascii"), object_pairs_hook=_no_duplicates)
    assert list(obj) == _KEYS
    assert json.dumps(obj, separators=(",", ":")).encode() == raw
    for key in ("schemaVersion", "callbackSequence", "startedAtMs", "finishedAtMs", "exitCode"):
        assert type(obj[key]) is int
    assert 0 <= obj["exitCode"] <= 255  # type: ignore[operator]
    assert obj["finishedAtMs"] >= obj["startedAtMs"]  # type: ignore[operator]
    _check_with_codec(raw)
    return obj


def _check_with_codec(raw: bytes) -> None:
    """Also run the project's strict codec when it exists (it is written in parallel)."""
    try:
        from ql_core.receipts import codec
    except ImportError:
        return
    parse = getattr(codec, "parse_receipt", None)
    if parse is None:
        return
    result = parse(raw)
    rejection = getattr(codec, "ReceiptRejection", None)
    if isinstance(rejection, type):
        assert not isinstance(result, rejection), f"codec rejected {raw!r}: {result!r}"
    receipt = getattr(codec, "Receipt", None)
    if isinstance(receipt, type):
        assert isinstance(result, receipt), f"codec returned {result!r}"


# ---------------------------------------------------------------- tasks


@dataclass
class Task:
    proc: subprocess.Popen[bytes]
    run_id: str
    attempt_id: str
    token: str
    seq: int
    started_at_ms: int
    shard_dir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def receipt_path(self) -> Path:
        return self.shard_dir / f"{self.attempt_id}.json"

    def wait(self, timeout: float = DEADLINE_S) -> int:
        return self.proc.wait(timeout)

    def log(self) -> bytes:
        return self.log_path.read_bytes()

    def receipt(self) -> dict[str, object]:
        obj = parse_receipt_strict(self.receipt_path.read_bytes())
        assert obj["runId"] == self.run_id
        assert obj["attemptId"] == self.attempt_id
        assert obj["token"] == self.token
        assert obj["callbackSequence"] == self.seq
        assert obj["startedAtMs"] == self.started_at_ms
        assert (self.receipt_path.stat().st_mode & 0o777) == 0o600
        return obj

    def shard_entries(self) -> list[str]:
        return sorted(os.listdir(self.shard_dir)) if self.shard_dir.is_dir() else []

    def expect_signal_death(self, shell: list[str], code: int) -> None:
        """The launcher exits ``code`` (128+N) and the receipt says so.

        bash can lose the status when a signal reaches the launcher while it reaps the child (a
        group signal does exactly that; see launcher.sh). The launcher must then fail closed:
        exit 125 and publish nothing - never a wrong code.
        """
        rc = self.wait()
        if rc == 125 and is_bash(shell):
            self.assert_no_receipt()
            return
        assert rc == code
        assert self.receipt()["exitCode"] == code

    def assert_no_receipt(self) -> None:
        """This attempt published nothing: no receipt and no temp file of it in its shard. Other
        attempts of the same data dir may share the shard (the last two hex digits of their ids:
        one in 256), and their files are not this one's."""
        names = [name for name in self.shard_entries() if self.attempt_id in name]
        assert names == [], f"expected no receipt of {self.attempt_id}, found {names}"


class Launcher:
    """Starts tasks under one shell inside one data dir."""

    def __init__(self, shell: list[str], data_dir: Path) -> None:
        self.shell = shell
        self.data_dir = data_dir
        self._procs: list[subprocess.Popen[bytes]] = []

    def _ids(self) -> tuple[str, str, Path, Path]:
        run_id, attempt_id = new_id(), new_id()
        shard = self.data_dir / "receipts" / shard_of(attempt_id)
        shard.mkdir(mode=0o700, parents=True, exist_ok=True)
        logs = self.data_dir / "logs" / shard_of(attempt_id)
        logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        return run_id, attempt_id, shard, logs / f"{attempt_id}.log"

    def _open_log(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def start(
        self,
        command: Sequence[str],
        *,
        mode: str = "argv",
        token: str | None = None,
        seq: int = 1,
        started_at_ms: int | None = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        prepare: Callable[[Path, str], None] | None = None,
    ) -> Task:
        run_id, attempt_id, shard, log_path = self._ids()
        if prepare is not None:
            prepare(shard, attempt_id)
        token = new_token() if token is None else token
        started = int(time.time() * 1000) if started_at_ms is None else started_at_ms
        fd = self._open_log(log_path)
        if is_standby(self.shell):
            try:
                proc, go = spawn_held(self.shell, shard_dir=shard, run_id=run_id, attempt_id=attempt_id,
                                      callback_sequence=seq, started_at_ms=started, mode=mode, command=command,
                                      token=token, log_fd=fd, env=env, cwd=cwd)
            finally:
                os.close(fd)
            self._procs.append(proc)  # type: ignore[arg-type]
            go()
            return Task(proc, run_id, attempt_id, token, seq, started, shard, log_path)  # type: ignore[arg-type]
        try:
            proc = spawn_launcher(
                **launcher_kwargs(self.shell),  # type: ignore[arg-type]
                shard_dir=shard,
                run_id=run_id,
                attempt_id=attempt_id,
                callback_sequence=seq,
                started_at_ms=started,
                mode=mode,  # type: ignore[arg-type]
                command=list(command),
                token=token,
                log_fd=fd,
                cwd=cwd,
                env=env,
            )
        finally:
            os.close(fd)
        self._procs.append(proc)
        return Task(proc, run_id, attempt_id, token, seq, started, shard, log_path)

    def start_raw(
        self,
        *,
        fd3: bytes | None,
        args: Callable[[Path, str, str], list[str]] | None = None,
        command: Sequence[str] = ("true",),
        started_at_ms: int | None = None,
    ) -> Task:
        """Start the launcher bypassing spawn_launcher's validation: any fd-3 bytes, any argv."""
        run_id, attempt_id, shard, log_path = self._ids()
        started = int(time.time() * 1000) if started_at_ms is None else started_at_ms
        if args is None:
            argv = launcher_args(
                shard_dir=shard,
                run_id=run_id,
                attempt_id=attempt_id,
                callback_sequence=1,
                started_at_ms=started,
                mode="argv",
                command=list(command),
            )
        else:
            argv = args(shard, run_id, attempt_id)
        fd = self._open_log(log_path)
        if is_standby(self.shell):
            return self._start_raw_standby(fd3, argv, fd, run_id, attempt_id, started, shard, log_path)
        try:
            if is_compiled(self.shell):
                # The shell's trampoline moves the pipe to fd 3, then execs the binary in place.
                proc, _held = _spawn_with_fd3(
                    ["/bin/sh"], ["-c", 'exec 3<&0 0</dev/null; exec "$@"', "ql-launcher", *self.shell, *argv],
                    fd3, log_fd=fd, cwd=None, env=None, on_stdin=True)
            else:
                proc, _held = _spawn_with_fd3(
                    self.shell, [launcher_path(), *argv], fd3, log_fd=fd, cwd=None, env=None
                )
        finally:
            os.close(fd)
        self._procs.append(proc)
        token = fd3.decode("ascii", "replace").strip() if fd3 else ""
        return Task(proc, run_id, attempt_id, token, 1, started, shard, log_path)

    def _start_raw_standby(self, fd3: bytes | None, argv: list[str], fd: int, run_id: str, attempt_id: str,
                           started: int, shard: Path, log_path: Path) -> Task:
        """start_raw for a standby: the same launcher argv and token line, as one message.

        The argv's fields become the message's (``SHARD ... MODE -- CMD...``; without the ``--``
        the argument count is unreadable); a token line is its token only when it is exactly one
        line, anything else becomes a token no launcher accepts. ``fd3=None``: EOF, no message."""
        try:
            proc, channel, _capacity = new_standby(self.shell)
            self._procs.append(proc)
            if fd3 is not None:
                if fd3.endswith(b"\n") and fd3.count(b"\n") == 1:
                    token = fd3[:-1]
                else:
                    token = fd3 + b"\x01"
                ok = len(argv) >= 7 and argv[6] == "--"
                fields = [os.fsencode(a) for a in argv[:6]]
                words = [os.fsencode(a) for a in argv[7:]] if ok else []
                env = [k + b"=" + v for k, v in os.environb.items()]
                message = b"\0".join([b"ql-standby-2", *fields, b",,,,", b"", str(len(words)).encode() if ok else b"x",
                                       *words, str(len(env)).encode(), *env, token]) + b"\0"
                cwd_fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    hand_over(channel, message, log_fd=fd, cwd_fd=cwd_fd)
                finally:
                    os.close(cwd_fd)
            channel.close()
        finally:
            os.close(fd)
        token_text = fd3.decode("ascii", "replace").strip() if fd3 else ""
        return Task(proc, run_id, attempt_id, token_text, 1, started, shard, log_path)  # type: ignore[arg-type]

    def cleanup(self) -> None:
        kill_groups_and_reap(self._procs)


def kill_groups_and_reap(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each launcher's whole group (a test may leave grandchildren behind even after the
    launcher exited; we are its unreaping parent, so its pid is still its group's) and reap it."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(DEADLINE_S)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def launcher(shell: list[str], data_dir: Path) -> Iterator[Launcher]:
    lx = Launcher(shell, data_dir)
    try:
        yield lx
    finally:
        lx.cleanup()
