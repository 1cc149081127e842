"""The ``local`` executor: one ``/bin/sh`` launcher per task, identity by boot id + pid + start time.

Everything about local processes lives here, behind the executor protocol
(:mod:`ql_core.ports.executor`): the launcher and its special exit status
(125: it could not learn the command's status — no receipt follows), the
durable handle (a JSON document core stores without reading), verified
group signals, and the live fast path (blocking on a pidfd, no polling).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
import select
import signal as _signal
import subprocess

from ql_core.clock import now_ms_ceil
from ql_core.ports.executor import ExitObservation, IdentityState, SignalOutcome, SpawnedTask, SpawnRequest

from . import identity
from .launch import release, spawn_launcher

__all__ = ["LocalProcessExecutor", "LAUNCHER_LOST_STATUS", "encode_handle", "decode_handle", "run_as_user"]

#: launcher.sh's exit status when it could not learn the command's status (no receipt follows).
LAUNCHER_LOST_STATUS = 125
#: How long :meth:`LocalProcessExecutor.abort` gives a task between TERM and KILL.
ABORT_TERM_GRACE_S = 2.0


def encode_handle(handle: identity.ProcessHandle) -> str:
    """The stored form of a handle: compact JSON of :func:`identity.handle_to_dict` (well under 512 bytes)."""
    return json.dumps(identity.handle_to_dict(handle), separators=(",", ":"), sort_keys=True)


def decode_handle(data: str | None) -> identity.ProcessHandle | None:
    """Parse a stored handle; anything malformed is None (callers fail closed)."""
    if not data:
        return None
    try:
        return identity.handle_from_dict(json.loads(data))
    except ValueError:
        return None


class _Held:
    """The spawning host's grip on a launcher: its process and, until released, the token pipe."""

    __slots__ = ("process", "_write_fd", "_token")

    def __init__(self, process: subprocess.Popen[bytes], write_fd: int, token: str) -> None:
        self.process = process
        self._write_fd: int | None = write_fd
        self._token = token

    def release(self) -> None:
        if self._write_fd is not None:
            fd, self._write_fd = self._write_fd, None
            release(fd, self._token)

    def close(self) -> None:
        """Never release: the launcher reads EOF and exits 125 without running the command."""
        if self._write_fd is not None:
            fd, self._write_fd = self._write_fd, None
            os.close(fd)


def _wait_exit(process: subprocess.Popen[bytes], timeout_s: float | None) -> int | None:
    """Block until ``process`` exits (or ``timeout_s``): a pidfd poll, not Popen's sleep loop."""
    if process.returncode is not None:
        return process.returncode
    if timeout_s is None:
        return process.wait()
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(process.pid)
        except OSError:
            fd = -1  # already reaped elsewhere, or no pidfd support: fall back
        if fd >= 0:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                if not poller.poll(max(0, int(timeout_s * 1000))):
                    return None
            finally:
                os.close(fd)
            return process.wait()
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def run_as_user(name: object) -> tuple[int, int]:
    """Validate ``[plugin.local] run_as``: an existing user other than root, a root host, setpriv."""
    import pwd
    import shutil

    from ql_core.errors import ConfigError

    if not isinstance(name, str) or not name:
        raise ConfigError('[plugin.local] run_as must be a user name, e.g. run_as = "qltask"')
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"[plugin.local] run_as: no user {name!r} on this system; create it or fix the name") from None
    if entry.pw_uid == 0:
        raise ConfigError("[plugin.local] run_as must not be root: it exists to run tasks as another user")
    if os.geteuid() != 0:
        raise ConfigError(f"[plugin.local] run_as needs the ql host to run as root (it runs as uid {os.geteuid()}); "
                          f"remove run_as or start the host as root")
    if shutil.which("setpriv") is None:
        raise ConfigError("[plugin.local] run_as needs setpriv (util-linux) on PATH")
    return entry.pw_uid, entry.pw_gid


class LocalProcessExecutor:
    """Spawns the POSIX launcher in its own session; the task outlives the host.

    ``run_as=(uid, gid)`` (root hosts only): the launcher stays root, the command runs as that user
    through ``setpriv`` — so a task cannot read its launcher's memory (the token) or signal it.
    """

    def __init__(self, *, run_as: tuple[int, int] | None = None) -> None:
        self._prefix: tuple[str, ...] = ()
        if run_as is not None:
            uid, gid = run_as
            self._prefix = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--")

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        if self._prefix:
            command = ("/bin/sh", "-c", request.command[0]) if request.shell else request.command
            request = replace(request, command=self._prefix + tuple(command), shell=False)
        process, write_fd = spawn_launcher(
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
            env=request.env,
            hold=True,
        )
        # The launcher now waits for its token: the command starts only in release().
        held = _Held(process, write_fd, request.token)
        handle = identity.capture_handle(process.pid)
        return SpawnedTask(handle=encode_handle(handle) if handle is not None else None, live=held)

    def release(self, task: SpawnedTask) -> None:
        task.live.release()

    def inspect(self, handle: str | None) -> IdentityState:
        parsed = decode_handle(handle)
        if parsed is None:
            return IdentityState.UNVERIFIABLE
        return IdentityState(str(identity.inspect(parsed)))

    def signal(self, handle: str | None, signum: int) -> SignalOutcome:
        parsed = decode_handle(handle)
        if parsed is None:
            return SignalOutcome.BLOCKED
        return SignalOutcome(str(identity.signal_group(parsed, signum)))

    def wait(self, task: SpawnedTask, timeout_s: float | None) -> ExitObservation | None:
        process: subprocess.Popen[bytes] = task.live.process
        returncode = _wait_exit(process, timeout_s)
        if returncode is None:
            return None
        finished = now_ms_ceil()
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
        process = held.process
        # We are its parent and have not reaped it: its pid (= its group) cannot be reused.
        for signum, wait_s in ((_signal.SIGTERM, ABORT_TERM_GRACE_S), (_signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, signum)
                process.wait(timeout=wait_s)
                return
            except ProcessLookupError:
                process.wait()
                return
            except subprocess.TimeoutExpired:
                continue

    def host_handle(self) -> str | None:
        handle = identity.capture_handle(os.getpid())
        return encode_handle(handle) if handle is not None else None
