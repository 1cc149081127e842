"""What one identity source reads (see :mod:`.identity`, "Sources"): the shared shapes.

:mod:`.identity` (the ``proc`` source, and every rule) and :mod:`.identity_psutil` (the portable
source) both speak these; neither imports the other's module for them, so the lazy import of the
psutil source is the only edge between the two.
"""

from __future__ import annotations

from typing import Protocol

from ql_core.value_class import value_class

__all__ = ["ProcStat", "IdentityUnreadable", "IdentitySource"]


@value_class()  # as @dataclass(frozen=True), without its import-time code generation
class ProcStat:
    """One process's record as a source reads it (Linux: fields of ``/proc/<pid>/stat``)."""

    __slots__ = ("state", "pgrp", "start_time", "session", "comm", "exit_code")
    state: str
    pgrp: int
    start_time: int
    session: int
    #: Field 2, the command name (15 bytes at most): a fork keeps it, an exec changes it.
    comm: bytes
    #: Field 52, the wait status of an exited (zombie) process; 0 also when it cannot be read.
    exit_code: int

    def __init__(self, state: str, pgrp: int, start_time: int, session: int = -1, comm: bytes = b"",
                 exit_code: int = 0) -> None:
        _set = object.__setattr__
        _set(self, "state", state)
        _set(self, "pgrp", pgrp)
        _set(self, "start_time", start_time)
        _set(self, "session", session)
        _set(self, "comm", comm)
        _set(self, "exit_code", exit_code)


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
