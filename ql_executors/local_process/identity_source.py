"""What one identity source reads (see :mod:`.identity`, "Sources"): the shared shapes.

:mod:`.identity` (the ``proc`` source, and every rule) and :mod:`.identity_psutil` (the portable
source) both speak these; neither imports the other's module for them, so the lazy import of the
psutil source is the only edge between the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["ProcStat", "IdentityUnreadable", "IdentitySource"]


@dataclass(frozen=True)
class ProcStat:
    """One process's record as a source reads it (Linux: fields of ``/proc/<pid>/stat``)."""

    state: str
    pgrp: int
    start_time: int
    session: int = -1
    #: Field 2, the command name (15 bytes at most): a fork keeps it, an exec changes it.
    comm: bytes = b""
    #: Field 52, the wait status of an exited (zombie) process; 0 also when it cannot be read.
    exit_code: int = 0


class IdentityUnreadable(Exception):
    """Identity cannot be read at all: no /proc, permission denied, or an unparsable record."""


class IdentitySource(Protocol):
    """One way of reading process identity; ``stat`` raises :class:`IdentityUnreadable` when it cannot tell."""

    name: str

    def boot(self) -> str | None: ...

    def same_boot(self, stored: str, current: str) -> bool: ...

    def stat(self, pid: int) -> ProcStat | None: ...

    def same_start(self, stored: int, current: int) -> bool: ...

    def valid_boot(self, value: str) -> bool: ...
