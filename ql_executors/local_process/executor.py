"""LocalProcessExecutor: one ``/bin/sh`` launcher per task, identity by boot id + pid + start time."""

from __future__ import annotations

from typing import Any

from ql_core.interfaces import IdentityState, SignalOutcome, SpawnedTask, SpawnRequest

from . import identity
from .launch import spawn_launcher

__all__ = ["LocalProcessExecutor"]


def _handle_from(data: dict[str, Any] | None) -> identity.ProcessHandle | None:
    if not data:
        return None
    try:
        return identity.ProcessHandle(boot_id=str(data["boot_id"]), pid=int(data["pid"]),
                                      pgid=int(data["pgid"]), start_time=int(data["start_time"]))
    except (KeyError, TypeError, ValueError):
        return None


class LocalProcessExecutor:
    """Spawns the POSIX launcher in its own session; the task outlives the host."""

    executor_type = "local_process"

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        process = spawn_launcher(
            shard_dir=str(request.receipt_shard_dir),
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
        return SpawnedTask(handle={}, process=process)

    def capture_handle(self, task: SpawnedTask) -> dict[str, Any] | None:
        handle = identity.capture_handle(task.process.pid)
        if handle is None:
            return None
        return {"boot_id": handle.boot_id, "pid": handle.pid, "pgid": handle.pgid, "start_time": handle.start_time}

    def inspect(self, handle: dict[str, Any] | None) -> IdentityState:
        parsed = _handle_from(handle)
        if parsed is None:
            return IdentityState.UNVERIFIABLE
        return IdentityState(str(identity.inspect(parsed)))

    def signal(self, handle: dict[str, Any] | None, signum: int) -> SignalOutcome:
        parsed = _handle_from(handle)
        if parsed is None:
            return SignalOutcome.BLOCKED
        return SignalOutcome(str(identity.signal_group(parsed, signum)))
