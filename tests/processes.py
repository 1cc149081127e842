"""Processes of ql found from outside, as a test sees them: /proc only, nothing of ql imported."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["foreign_standbys", "standby_launchers"]


def standby_launchers() -> dict[int, int]:
    """Live standby launchers (``ql-launcher --standby``) on this machine: pid -> parent pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[1:2] != [b"--standby"]:
                continue
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            found[int(entry)] = int(fields[1])
    return found


def foreign_standbys(before: dict[int, int]) -> list[int]:
    """Standbys started since ``before`` that are not this test process's own: those of another
    host (live or dead: a dead host's standby has been reparented, whoever its new parent is)."""
    return [pid for pid, parent in standby_launchers().items() if pid not in before and parent != os.getpid()]
