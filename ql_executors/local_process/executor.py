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
import select
import signal as _signal
import subprocess

from ql_core.clock import now_ms_ceil
from ql_core.ports.executor import ExitObservation, IdentityState, SignalOutcome, SpawnedTask, SpawnRequest

from . import identity
from .launch import spawn_launcher

__all__ = ["LocalProcessExecutor", "LAUNCHER_LOST_STATUS", "encode_handle", "decode_handle"]

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


class LocalProcessExecutor:
    """Spawns the POSIX launcher in its own session; the task outlives the host."""

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        process = spawn_launcher(
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
        )
        handle = identity.capture_handle(process.pid)
        return SpawnedTask(handle=encode_handle(handle) if handle is not None else None, live=process)

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
        process: subprocess.Popen[bytes] = task.live
        returncode = _wait_exit(process, timeout_s)
        if returncode is None:
            return None
        finished = now_ms_ceil()
        if returncode < 0 or returncode == LAUNCHER_LOST_STATUS:
            # The launcher itself died of a signal, or told us it lost the command's status:
            # its own exit says nothing about the command's.
            return ExitObservation(exit_code=None, finished_at_ms=finished)
        return ExitObservation(exit_code=returncode, finished_at_ms=finished)

    def abort(self, task: SpawnedTask) -> None:
        process: subprocess.Popen[bytes] | None = task.live
        if process is None:
            return
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
