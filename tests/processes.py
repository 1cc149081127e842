"""Processes of ql found from outside, as a test sees them: /proc only, nothing of ql imported."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["foreign_standbys", "pids", "pids_with", "proc_stat", "standby_launchers", "standbys_of", "zombie_children"]


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (index 0 = state, 1 = parent pid), or None if the pid is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rfind(b")") + 1 :].decode().split()


def pids() -> list[int]:
    """Every pid on this machine now (zombies too)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def pids_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose argv holds ``marker`` (a unique word of a test's command)."""
    out = []
    for pid in pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = proc_stat(pid)
        if marker.encode() in argv and fields is not None and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


def standby_launchers() -> dict[int, int]:
    """Live standby launchers (``ql-launcher --standby``) on this machine: pid -> parent pid."""
    found = {}
    for pid in pids():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] != [b"--standby"]:
                continue
        except OSError:
            continue
        fields = proc_stat(pid)
        if fields is not None and fields[0] not in ("Z", "X"):
            found[pid] = int(fields[1])
    return found


def standbys_of(parent: int) -> list[int]:
    """Live standby launchers whose parent is ``parent``."""
    return [pid for pid, ppid in standby_launchers().items() if ppid == parent]


def foreign_standbys(before: dict[int, int]) -> list[int]:
    """Standbys started since ``before`` that are not this test process's own: those of another
    host (live or dead: a dead host's standby has been reparented, whoever its new parent is)."""
    return [pid for pid, parent in standby_launchers().items() if pid not in before and parent != os.getpid()]


def zombie_children(parent: int) -> list[int]:
    """Children of ``parent`` that exited and were never reaped."""
    return [pid for pid in pids() if (st := proc_stat(pid)) is not None and int(st[1]) == parent and st[0] == "Z"]
