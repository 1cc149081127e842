"""``NiceExecutor``: every task starts under ``nice``, optionally ``ionice`` and ``prlimit``.

It is an executor in its own right (selected by name, recorded on every
attempt it starts) that delegates the crash-safe parts — the launcher, its
receipt, the durable handle, verified signals, the live wait — to ql's local
executor, and changes only *what* is started: the task's command gets a
prefix, so the limits apply to the task and everything it runs, and nothing
of the host or the launcher is affected.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from typing import Any

from ql_core.errors import ConfigError, unknown_setting
from ql_core.ports import ExitObservation, IdentityState, SignalOutcome, SpawnedTask, SpawnRequest
from ql_executors.local_process.executor import LocalProcessExecutor

__all__ = ["NiceSettings", "NiceExecutor", "settings_from"]

_IO_CLASSES = {"idle": "3", "best-effort": "2"}


@dataclass(frozen=True)
class NiceSettings:
    """What ``[plugin.nice]`` may set."""

    niceness: int = 10
    io_class: str | None = None
    max_open_files: int | None = None


def settings_from(table: dict[str, Any]) -> NiceSettings:
    """Validate ``[plugin.nice]``; every mistake is one ConfigError line naming the key and the fix."""
    bad = unknown_setting("plugin.nice", table, ("niceness", "io_class", "max_open_files"))
    if bad is not None:
        raise bad
    niceness = table.get("niceness", 10)
    if isinstance(niceness, bool) or not isinstance(niceness, int) or not 0 <= niceness <= 19:
        raise ConfigError("[plugin.nice] niceness must be an integer from 0 to 19")
    io_class = table.get("io_class")
    if io_class is not None and io_class not in _IO_CLASSES:
        raise ConfigError('[plugin.nice] io_class must be "idle" or "best-effort"')
    nofile = table.get("max_open_files")
    if nofile is not None and (isinstance(nofile, bool) or not isinstance(nofile, int) or not 16 <= nofile <= 1 << 20):
        raise ConfigError("[plugin.nice] max_open_files must be an integer from 16 to 1048576")
    return NiceSettings(niceness, io_class, nofile)


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ConfigError(f"the nice executor needs `{name}` on PATH; install {package}")
    return path


class NiceExecutor:
    """Runs each task under ``nice -n N`` (and ``ionice``/``prlimit`` when configured)."""

    def __init__(self, settings: NiceSettings | None = None) -> None:
        self.settings = settings or NiceSettings()
        prefix = [_tool("nice", "coreutils"), "-n", str(self.settings.niceness)]
        if self.settings.io_class is not None:
            prefix += [_tool("ionice", "util-linux"), "-c", _IO_CLASSES[self.settings.io_class]]
        if self.settings.max_open_files is not None:
            n = self.settings.max_open_files
            prefix += [_tool("prlimit", "util-linux"), f"--nofile={n}:{n}", "--"]
        self._prefix = tuple(prefix)
        self._local = LocalProcessExecutor()

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        # A shell command becomes `nice ... /bin/sh -c WORD`: the limits cover the whole script.
        command = ("/bin/sh", "-c", request.command[0]) if request.shell else request.command
        return self._local.spawn(replace(request, command=self._prefix + command, shell=False), log_fd=log_fd)

    def release(self, task: SpawnedTask) -> None:
        self._local.release(task)

    def inspect(self, handle: str | None) -> IdentityState:
        return self._local.inspect(handle)

    def signal(self, handle: str | None, signum: int) -> SignalOutcome:
        return self._local.signal(handle, signum)

    def wait(self, task: SpawnedTask, timeout_s: float | None) -> ExitObservation | None:
        return self._local.wait(task, timeout_s)

    def acknowledge(self, task: SpawnedTask, *, committed: bool) -> None:
        self._local.acknowledge(task, committed=committed)

    def abort(self, task: SpawnedTask) -> None:
        self._local.abort(task)

    def host_handle(self) -> str | None:
        return self._local.host_handle()
