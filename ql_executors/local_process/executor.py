"""The ``local`` executor: one ``/bin/sh`` launcher per task, identity by boot id + pid + start time.

Everything about local processes lives here, behind the executor protocol
(:mod:`ql_core.ports.executor`): the launcher and its special exit status
(125: it could not learn the command's status — no receipt follows), the
durable handle (a JSON document core stores without reading), verified
group signals, and the live fast path (blocking on a pidfd, no polling) with
acknowledged completion: a task the host awaits publishes its receipt only if
the host does not acknowledge the status it reaped (docs/launcher.md).
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
import socket
import subprocess
import threading
import time
from dataclasses import replace

from ql_core.clock import boot_ms, elapsed_ms_ceil, now_ms_ceil
from ql_core.ports.executor import ExitObservation, IdentityState, SignalOutcome, SpawnedTask, SpawnRequest
from ql_core.ports.journal import TaskSpec

from ql_core.log import logger

from . import identity
from .compiled import CompiledLauncherError, compiled_launcher
from .launch import (
    STANDBY_SPEC_MAX,
    EncodedTask,
    Limits,
    acknowledge,
    encode_task,
    hand_over,
    release,
    spawn_launcher,
    spawn_standby,
    standby_message,
    standby_message_size,
)
from .child import Child, Process, forget_after_fork, reap_exited
from .handles import START_BOOT_KEY, decode_handle, encode_handle, handle_dict, start_boot
from .containment import CGROUP_ENV, Containment, find_containment, group_cgroups, kill_cgroup, sweep
from .settings import LAUNCHER_CHOICES, run_as_user  # noqa: F401 - part of this module's API
from .factory import FactorySlot
from .standby import Standby, StandbyPool

__all__ = ["LocalProcessExecutor", "LAUNCHER_CHOICES", "LAUNCHER_LOST_STATUS", "STATUS_NOT_REAPABLE", "encode_handle",
           "decode_handle", "start_boot", "run_as_user"]

#: launcher.sh's exit status when it could not learn the command's status (no receipt follows).
LAUNCHER_LOST_STATUS = 125
#: ``[plugin.local] launcher``: ``auto`` (compiled where it can be built, else the shell script),
#: ``compiled`` (required: an error names why it cannot be built) or ``shell`` (launcher.sh).
#: How long :meth:`LocalProcessExecutor.abort` gives a task between TERM and KILL.
ABORT_TERM_GRACE_S = 2.0


def _with_boot(request: SpawnRequest) -> SpawnRequest:
    """A request without a boot-clock start (a caller other than ql's runtime): measured from now,
    which is after its true start — its deadline late, never early."""
    if request.started_boot_ms is not None:
        return request
    return replace(request, started_boot_ms=boot_ms())


def _limits(request: SpawnRequest) -> Limits:
    return Limits(start_boot_ms=request.started_boot_ms, timeout_ms=request.timeout_ms,
                  grace_ms=request.cancel_grace_ms, quota_bytes=request.log_max_bytes)


def _start_of(request: SpawnRequest) -> tuple[int, int] | None:
    if request.started_boot_ms is None:
        return None
    return request.started_at_ms, request.started_boot_ms


def _finished(start: tuple[int, int] | None) -> int:
    """An upper bound of the finish time on the start's clock: ``started_at_ms`` + the boot-clock
    duration since (what the launcher writes into the receipt); the wall clock without one."""
    if start is not None:
        elapsed = elapsed_ms_ceil(start[1])
        if elapsed is not None:
            return start[0] + elapsed
    return now_ms_ceil()


#: How long a host that closed an exited, awaited launcher's channel without "ok" waits for the
#: publisher to publish and exit before it reaps the launcher (each look is one pass over /proc).
PUBLISHER_WAIT_S = 5.0


def _wait_publisher_gone(leader: int) -> None:
    """Until the group ``leader`` (a zombie launcher of ours) led has no other live member — its
    publisher published and exited — at most :data:`PUBLISHER_WAIT_S`."""
    end = time.monotonic() + PUBLISHER_WAIT_S
    while identity.group_has_others(leader) and time.monotonic() < end:
        time.sleep(0.005)


class _Held:
    """The spawning host's grip on a launcher: its process (followed by a pidfd: :class:`.child.Child`)
    and its channel (the token pipe until released; for an awaited task the socket that carries the
    acknowledgement later)."""

    __slots__ = ("__weakref__", "_channel", "_released", "_token", "child", "encoded", "start")

    def __init__(self, child: Child, channel: int | socket.socket, token: str) -> None:
        self.child = child
        #: (started_at_ms, started_boot_ms) of its run: the finish time is measured from there.
        self.start: tuple[int, int] | None = None
        #: A standby's task, encoded once by :meth:`LocalProcessExecutor.standby` for its message.
        self.encoded: tuple[TaskSpec, EncodedTask] | None = None
        self._channel: int | socket.socket | None = channel
        self._token = token
        self._released = False
        forget_after_fork(self)

    @property
    def process(self) -> Process:
        return self.child.process

    def forget_after_fork(self) -> None:
        """In a forked child: drop the inherited copy of the channel, saying nothing."""
        with contextlib.suppress(OSError):
            self.close()

    @property
    def awaited(self) -> bool:
        return isinstance(self._channel, socket.socket)

    def release(self) -> None:
        if self._channel is not None and not self._released:
            self._released = True
            if not self.awaited:
                channel, self._channel = self._channel, None
                release(channel, self._token)
            else:
                self.child.keep = True  # a zombie until we answered its publisher (.child)
                release(self._channel, self._token)

    def handed_over(self, *, awaited: bool) -> None:
        """A standby got its run (and so its go-ahead): the channel stays open only if awaited."""
        self._released = True
        if not awaited:
            self.close()

    @property
    def channel(self) -> int | socket.socket | None:
        return self._channel

    def status_is_the_commands(self) -> bool:
        """After reaping an awaited launcher: did it mark its exit status as the command's? (It
        sends one byte right before exiting with it; a launcher that lost the status, or died,
        sends none.) Only the launcher and its publisher hold the other end of the socket."""
        if not isinstance(self._channel, socket.socket) or not self._released:
            return False
        try:
            return self._channel.recv(1, socket.MSG_DONTWAIT) == b"s"
        except OSError:
            return False

    def acknowledge(self, committed: bool) -> None:
        """Answer the publisher: ``ok`` (committed: it publishes nothing), else a bare close — and
        then, if the launcher has exited, wait (bounded) until the publisher has published and gone
        before the launcher is reaped: beside its zombie launcher it is never signalled."""
        if isinstance(self._channel, socket.socket):
            channel, self._channel = self._channel, None
            publishing = not committed and not self.child.alive()
            acknowledge(channel, committed)
            if publishing:
                _wait_publisher_gone(self.child.pid)
        self.child.unkeep()

    def close(self) -> None:
        """Drop the channel: an unreleased launcher reads EOF and exits 125 without running the
        command; a released, awaited one publishes its receipt as if the host had died."""
        channel, self._channel = self._channel, None
        if isinstance(channel, socket.socket):
            channel.close()
        elif channel is not None:
            os.close(channel)
        self.child.unkeep()


class _LaunchHints:
    """What this host verified once about a shell and PATH, so launchers skip a probe per task.

    Learned from the second task on (a one-shot ``ql run`` never pays for the probes): ``e`` when
    the ``env`` the launcher would find on that PATH resets signals (``--default-signal``), ``p``
    when the shell's printf is a builtin. A probe that fails or errs gives no hint (the launcher
    then checks for itself, as it always did).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = 0
        self._known: dict[str | None, str] = {}

    def for_path(self, path: str | None) -> str:
        if path is None:  # the shell would use its own default PATH: nothing we can check for it
            return ""
        with self._lock:
            self._seen += 1
            if self._seen < 2:
                return ""
            hints = self._known.get(path)
            if hints is None:
                hints = self._known[path] = self._probe(path)
            return hints

    @staticmethod
    def _probe(path: str) -> str:
        import shutil  # here: shutil (with bz2, lzma, zlib) is ~2 ms of every host start otherwise

        hints = ""
        try:
            env_tool = shutil.which("env", path=path)
            # Judged by what it prints, never by an exit status (a host that ignores SIGCHLD gets 0
            # from every child): only an env that took the option runs the echo.
            if env_tool is not None and subprocess.run(
                    [env_tool, "-i", "--default-signal=HUP,INT,QUIT,TERM,USR1,USR2", "/bin/sh", "-c",
                     "echo ql-env-ok"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                    check=False).stdout == b"ql-env-ok\n":
                hints += "e"
            out = subprocess.run(["/bin/sh", "-c", "command -V printf"], stdin=subprocess.DEVNULL,
                                 capture_output=True, timeout=10, check=False, env={"PATH": path})
            if b"builtin" in out.stdout:
                hints += "p"
        except (OSError, subprocess.SubprocessError):
            return ""
        return hints


#: ``ExitObservation.detail`` when the kernel has no status for our launcher: this host ignores
#: SIGCHLD (the kernel reaps its children) or something else in it reaped the launcher first.
STATUS_NOT_REAPABLE = "LAUNCHER_STATUS_NOT_REAPABLE"


#: Linux's MAX_ARG_STRLEN: the longest single argument or environment entry execve takes.
_MAX_ARG_STRLEN = 32 * 4096
#: The least ``sysconf(SC_ARG_MAX)`` says on Linux (glibc: the larger of a quarter of the stack
#: limit and 128 KiB): a task below it needs no ``getrlimit`` call to know it fits.
_ARG_MAX_FLOOR = 32 * 4096


def _host_cwd_fd() -> int:
    """An ``O_PATH`` descriptor of this host's working directory, for the task to start in (where a
    ``Popen`` child would be). Raises ``OSError`` when the host cannot search it: a child would
    inherit it anyway, but the launcher could not enter it (``fchdir`` needs search permission),
    so :meth:`LocalProcessExecutor.standby` leaves such a task to the classic path."""
    return os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _check_cwd(cwd: str) -> None:
    """A working directory the launcher could not enter fails now, as ``Popen(cwd=...)`` would."""
    import errno
    import stat

    st = os.stat(cwd)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), cwd)
    if not os.access(cwd, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), cwd)


class LocalProcessExecutor:
    """Spawns the POSIX launcher in its own session; the task outlives the host.

    ``run_as=(uid, gid)`` (root hosts only): the launcher stays root, the command runs as that user
    through ``setpriv`` — so a task cannot read its launcher's memory (the token) or signal it.
    """

    def __init__(self, *, run_as: tuple[int, int] | None = None, launcher: str = "auto",
                 standby: bool = True, containment: str = "auto", cgroup_parent: str | None = None) -> None:
        if launcher not in LAUNCHER_CHOICES:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHER_CHOICES)}")
        #: Each task in its own cgroup v2 where usable, else its process group (:mod:`.containment`).
        self.containment: Containment = find_containment(containment, cgroup_parent)
        if self.containment.parent is not None:
            sweep(self.containment.parent)  # what crashed runs left behind, once empty
        else:
            logger.debug("tasks are contained by their process group: {}", self.containment.reason)
        self._launcher_choice = launcher
        self._lock = threading.Lock()
        self._compiled: str | None = None
        self._compiled_resolved = False
        if launcher == "compiled":
            self.compiled_launcher()  # built now: CompiledLauncherError names why it cannot be
        self._prefix: tuple[str, ...] = ()
        if run_as is not None:
            uid, gid = run_as
            self._prefix = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--")
        self._hints = _LaunchHints()
        self._host_handle: tuple[int, str | None] | None = None
        #: Standby launchers (compiled launcher only): see :mod:`.standby`.
        self._standbys = StandbyPool(self._new_standby) if standby else None
        #: What forks this executor's standbys once it keeps them ready (:mod:`.factory`).
        self._factory = FactorySlot()

    def _prefixed(self, command: tuple[str, ...], shell: bool) -> tuple[tuple[str, ...], bool]:
        """``run_as``: the command runs through setpriv (a shell command as ``/bin/sh -c WORD``)."""
        if not self._prefix:
            return command, shell
        return self._prefix + (("/bin/sh", "-c", command[0]) if shell else tuple(command)), False

    def _with_prefix(self, request: SpawnRequest) -> SpawnRequest:
        if not self._prefix:
            return request
        command, shell = self._prefixed(request.command, request.shell)
        return replace(request, command=command, shell=shell)

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        request = self._with_prefix(request)
        try:
            return self._spawn(request, log_fd=log_fd)
        except FileNotFoundError:
            if self._compiled is None or os.path.exists(self._compiled):
                raise
            # The cached binary was removed under us (a cleaned cache): nothing was started, so
            # resolve again (rebuild, or launcher.sh for auto) and spawn once more.
            self.compiled_launcher(again=True)
            return self._spawn(request, log_fd=log_fd)

    def _spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        compiled = self.compiled_launcher()
        request = _with_boot(request)
        env_path = (request.env if request.env is not None else os.environ).get("PATH")
        env = request.env
        if self.containment.parent is not None:
            env = {**(env if env is not None else os.environ), CGROUP_ENV: self.containment.parent}
            self._make_cgroup(request.attempt_id)
        process, channel = spawn_launcher(
            shard_dir=request.receipt_location,
            run_id=request.run_id,
            attempt_id=request.attempt_id,
            callback_sequence=request.callback_sequence,
            started_at_ms=request.started_at_ms,
            mode="shell" if request.shell else "argv",
            command=list(request.command),
            token=request.token,
            log_fd=log_fd,
            cwd=request.cwd,
            env=env,
            hold=True,
            awaited=request.awaited,
            hints="" if compiled is not None else self._hints.for_path(env_path),
            compiled=compiled,
            limits=_limits(request),
        )
        # The launcher now waits for its token: the command starts only in release(). Followed by a
        # pidfd from now on (child.py): it cannot exit before its go-ahead, so this is our launcher.
        held = _Held(Child(process), channel, request.token)
        held.start = _start_of(request)
        handle = identity.capture_handle(process.pid)
        return SpawnedTask(handle=encode_handle(handle, start_boot_ms=request.started_boot_ms)
                           if handle is not None else None, live=held)

    def _make_cgroup(self, attempt_id: str) -> None:
        """The task's cgroup, made before its go-ahead (its launcher makes it too when missing)."""
        parent = self.containment.parent
        if parent is not None:
            with contextlib.suppress(OSError):
                os.mkdir(os.path.join(parent, attempt_id), 0o755)

    def compiled_launcher(self, *, again: bool = False) -> str | None:
        """The compiled launcher's path, or None for the shell launcher, resolved once (``again``:
        once more). ``auto``: built on first use where a C compiler is available, else the shell
        launcher, silently; ``compiled``: CompiledLauncherError when it cannot be built."""
        with self._lock:
            if again or not self._compiled_resolved:
                self._compiled = self._resolve_launcher()
                self._compiled_resolved = True
            return self._compiled

    def _resolve_launcher(self) -> str | None:
        if self._launcher_choice == "shell":
            return None
        try:
            return compiled_launcher(os.environ)
        except (CompiledLauncherError, OSError) as exc:
            if self._launcher_choice == "compiled":
                raise
            logger.debug("the compiled launcher is not available ({}); using launcher.sh", exc)
            return None

    def release(self, task: SpawnedTask) -> None:
        task.live.release()

    # -- standby launchers (ql_core.ports.executor.StandbyExecutor) ------------------------------
    def _new_standby(self, ahead: bool = False) -> Standby:
        """A new idle standby: forked by this executor's factory when it has one (``ahead``, a
        refill off the submit path: starting one first), else started the classic way."""
        compiled = self.compiled_launcher()
        if compiled is None:
            raise CompiledLauncherError("standby launchers need the compiled launcher")
        forked = self._factory.standby(compiled, ahead=ahead)
        if forked is not None:
            process, channel, capacity = forked
        else:
            process, channel, capacity = spawn_standby(compiled)
        child = Child(process)  # an idle standby exits only on EOF or a signal: this is it
        return Standby(child, channel, identity.capture_handle(process.pid), capacity)

    def standby(self, spec: TaskSpec, *, awaited: bool) -> SpawnedTask | None:
        """An idle standby launcher for ``spec`` (its handle final), or None: no compiled launcher,
        standbys switched off, a task execve would refuse or too large for one message, or none
        could be started. Either way nothing of the run has been started."""
        if self._standbys is None or self.compiled_launcher() is None:
            return None
        command, shell = self._prefixed(spec.command, spec.shell)
        try:
            encoded = encode_task(command, shell=shell, cwd=spec.cwd, env=spec.env)
        except ValueError:
            return None  # the classic path refuses it with the same error, before anything runs
        if self.containment.parent is not None:
            # A standby's own environment stays empty (a task can read its parent's): the parent
            # cgroup travels in the message's environment, which the launcher drops from CMD's.
            entry = CGROUP_ENV.encode() + b"=" + os.fsencode(self.containment.parent)
            encoded = encoded._replace(env=[*encoded.env, entry])
        size = standby_message_size(encoded)
        if (size > STANDBY_SPEC_MAX or encoded.longest >= _MAX_ARG_STRLEN
                or (encoded.exec_bytes > _ARG_MAX_FLOOR and encoded.exec_bytes > os.sysconf("SC_ARG_MAX"))):
            return None  # the classic path runs it, or reports E2BIG as it always did
        try:
            os.close(_host_cwd_fd())
        except OSError:
            return None  # a directory the host cannot search: only a Popen child can inherit it
        try:
            ready = self._standbys.take()
        except (OSError, CompiledLauncherError) as exc:
            logger.debug("no standby launcher ({}); spawning the classic way", type(exc).__name__)
            return None
        if size > ready.capacity:
            self._standbys.give_back(ready)  # this socket takes less than one message (a low wmem)
            return None
        held = _Held(ready.child, ready.channel, "")
        held.encoded = (spec, encoded)
        # Stamped when taken, just before the create commit: recovery's duration counts from about there.
        handle = encode_handle(ready.handle, start_boot_ms=boot_ms()) if ready.handle is not None else None
        return SpawnedTask(handle=handle, live=held)

    def start(self, task: SpawnedTask, request: SpawnRequest, *, log_fd: int) -> None:
        """Hand a standby its run; the go-ahead is the same message. Raises (OSError, ValueError)
        only when nothing was sent: the standby then has nothing, and core aborts it."""
        held: _Held = task.live
        channel = held.channel
        if held.encoded is None or not isinstance(channel, socket.socket):
            raise ValueError("not a standby launcher's task")
        spec, encoded = held.encoded
        if (request.command, request.shell, request.cwd, request.env) != (spec.command, spec.shell, spec.cwd,
                                                                          spec.env):
            raise ValueError("a standby task is started with the task it was taken for")
        request = _with_boot(request)
        message = standby_message(
            shard_dir=request.receipt_location, run_id=request.run_id, attempt_id=request.attempt_id,
            callback_sequence=request.callback_sequence, started_at_ms=request.started_at_ms, task=encoded,
            token=request.token, awaited=request.awaited, limits=_limits(request))
        if request.cwd is not None:
            _check_cwd(request.cwd)  # as Popen's chdir would fail: before anything is sent
        cwd_fd = _host_cwd_fd()
        self._make_cgroup(request.attempt_id)
        held.child.keep = request.awaited  # before it can run: a zombie until we answered its publisher
        try:
            hand_over(channel, message, log_fd=log_fd, cwd_fd=cwd_fd)
        finally:
            os.close(cwd_fd)
        held.encoded = None
        held.start = _start_of(request)
        held.handed_over(awaited=request.awaited)
        if self._standbys is not None:
            self._standbys.handed_over()

    def close(self) -> None:
        """Discard the idle standby launcher (it exits having run nothing), and reap every launcher
        of this process that has exited unwaited (those still running are reaped by the next
        launcher start in this process). Idempotent."""
        if self._standbys is not None:
            self._standbys.close()
        self._factory.close()
        reap_exited(limit=None)
        if self.containment.parent is not None:
            sweep(self.containment.parent)

    def reap_exited(self) -> int:
        """Reap up to :data:`~.child.REAP_SCAN` launchers of this process that exited unwaited (each
        launcher start does the same); their runs still end through their receipts."""
        return reap_exited()

    def inspect(self, handle: str | None) -> IdentityState:
        parsed = decode_handle(handle)
        if parsed is None:
            return IdentityState.UNVERIFIABLE
        return IdentityState(str(identity.inspect(parsed)))

    def leader_state(self, handle: str | None) -> tuple[str, int | None]:
        """The launcher process itself (not its group): ``alive``, ``exited`` (with its command's
        status when the kernel still shows it) or ``unknown`` — :func:`.identity.leader_state`.
        Recovery asks it before it consumes a receipt (docs/launcher.md, "Hardening")."""
        parsed = decode_handle(handle)
        if parsed is None:
            return "unknown", None
        state, status = identity.leader_state(parsed)
        return str(state), status

    def signal(self, handle: str | None, signum: int) -> SignalOutcome:
        parsed = decode_handle(handle)
        if parsed is None:
            return SignalOutcome.BLOCKED
        # A KILL also goes to the task's cgroup, found through the members of the verified group
        # (the launcher itself is outside it; this matters once it was killed on its own: then
        # nothing else would reach what the task moved out of the group).
        cgroups = (group_cgroups(self.containment.parent, parsed.pgid)
                   if signum == _signal.SIGKILL and self.containment.parent is not None and parsed.pgid > 1 else [])
        outcome = SignalOutcome(str(identity.signal_group(parsed, signum)))
        if outcome is SignalOutcome.SIGNALLED:
            for path in cgroups:
                kill_cgroup(path)
        return outcome

    def acknowledge(self, task: SpawnedTask, *, committed: bool) -> None:
        held: _Held | None = task.live
        if held is not None:
            held.acknowledge(committed)

    def wait(self, task: SpawnedTask, timeout_s: float | None) -> ExitObservation | None:
        held: _Held = task.live
        reaped = held.child.wait(timeout_s)
        if reaped is None:
            return None
        finished = _finished(held.start)
        returncode = reaped.status
        if returncode is not None and returncode >= 0 and held.status_is_the_commands():
            # The launcher exited with the command's status and left a publisher waiting for our
            # word: the status is the kernel's (waitpid), the receipt held back for acknowledge().
            return ExitObservation(exit_code=returncode, finished_at_ms=finished, held_receipt=True)
        # Nothing is held back for us: decide from the receipt as a plain host would.
        held.close()
        if returncode is None:
            # No status from the kernel: only the receipt (published now that the channel is
            # closed) or recovery may decide — never a status we did not see.
            return ExitObservation(exit_code=None, finished_at_ms=finished, detail=STATUS_NOT_REAPABLE)
        if returncode < 0:
            # The launcher itself died of a signal: its exit says nothing about the command, which
            # may run on in the launcher's process group (identity still follows it there).
            return ExitObservation(exit_code=None, finished_at_ms=finished,
                                   detail=f"LAUNCHER_KILLED_BY_SIGNAL_{-returncode}")
        if returncode == LAUNCHER_LOST_STATUS:
            # The launcher told us it could not learn the command's status (or never got its token).
            return ExitObservation(exit_code=None, finished_at_ms=finished, detail="LAUNCHER_LOST_STATUS")
        return ExitObservation(exit_code=returncode, finished_at_ms=finished)

    def abort(self, task: SpawnedTask) -> None:
        held: _Held | None = task.live
        if held is None:
            return
        held.close()  # not released yet: the launcher reads EOF and never runs the command
        child = held.child
        # Signalled only while its pidfd shows it alive and unreaped: its pid (= its group) is ours.
        for signum, wait_s in ((_signal.SIGTERM, ABORT_TERM_GRACE_S), (_signal.SIGKILL, 5.0)):
            if child.wait(0) is not None:
                return
            child.signal_group(signum)
            if child.wait(wait_s) is not None:
                return

    def elapsed_ms(self, handle: str | None) -> int | None:
        """How long the attempt of ``handle`` has run, on the boot clock (ports.executor,
        "Durations"): from the start its handle records, in this boot only (after a reboot its
        task cannot be running). None when the handle records none or the boot differs."""
        # One parse of the stored JSON for both facts (this runs in every terminal decision).
        data = handle_dict(handle)
        if data is None:
            return None
        since = data.pop(START_BOOT_KEY, None)
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            return None
        try:
            parsed = identity.handle_from_dict(data)
        except ValueError:
            return None
        if parsed is None or parsed.source != "proc" or parsed.boot_id != identity.read_boot_id():
            return None
        return elapsed_ms_ceil(since)

    def host_handle(self) -> str | None:
        # The calling process's identity never changes while it runs: read once (per pid: a host
        # that forked gets its own).
        pid = os.getpid()
        cached = self._host_handle
        if cached is None or cached[0] != pid:
            handle = identity.capture_handle(pid)
            cached = self._host_handle = (pid, encode_handle(handle) if handle is not None else None)
        return cached[1]
