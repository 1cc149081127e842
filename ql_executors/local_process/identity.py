"""Durable process identity of a launched task (DESIGN.md §2 "Process identity").

A handle is boot id + pid + process-group id + process start time (Linux: ``/proc/sys/kernel/random/
boot_id`` and fields 5 and 22 of ``/proc/<pid>/stat``). A pid alone is only evidence: it is reused.
Together with the start time (clock ticks since boot) and the boot id it names one process for ever.

Rules this module enforces:

- boot id changed, pid gone, start time changed, or state zombie/dead: the launched process has
  exited (``IdentityState.EXITED``);
- identity that cannot be read at all (no ``/proc``, permission denied, unparsable): ``UNVERIFIABLE``
  - the caller blocks; it never signals and never guesses;
- signals go only to the process group the launcher leads (``pgid == pid``), after re-verifying the
  identity immediately before ``killpg``; a bare pid is never signalled.

Known limit of this version: identity follows the launcher, the group leader. Once the launcher has
exited, ``inspect`` says ``EXITED`` even if a grandchild the command left behind still lives in the
group, and ``signal_group`` then reports ``ALREADY_EXITED`` without signalling it. The launcher only
exits after its direct child did, so this concerns processes the command itself orphaned.

Race note: between the re-verification and ``killpg`` the group id cannot be handed to an unrelated
group while any of our group's members lives (Linux does not reuse a pid still in use as a pgid);
only after the whole group is gone *and* the pid space wrapped around could it name another group.
Non-Linux systems (no ``/proc``) are ``UNVERIFIABLE`` in this version.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ProcessHandle",
    "IdentityState",
    "SignalOutcome",
    "read_boot_id",
    "capture_handle",
    "inspect",
    "signal_group",
]

_PROC = "/proc"
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_GONE_STATES = frozenset({"Z", "X", "x"})  # zombie, dead ('x' on some older kernels)


@dataclass(frozen=True)
class ProcessHandle:
    """Identity of a launched process; ``start_time`` is ``/proc/<pid>/stat`` field 22 (ticks)."""

    boot_id: str
    pid: int
    pgid: int
    start_time: int


class IdentityState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    UNVERIFIABLE = "unverifiable"


class SignalOutcome(StrEnum):
    SIGNALLED = "signalled"
    ALREADY_EXITED = "already_exited"
    BLOCKED = "blocked"


@dataclass(frozen=True)
class _Stat:
    state: str
    pgrp: int
    start_time: int


class _Unreadable(Exception):
    """Identity cannot be read at all: no /proc, permission denied, or an unparsable record."""


def read_boot_id() -> str | None:
    """The current boot id, or ``None`` when it cannot be read."""
    try:
        with open(_BOOT_ID_PATH, "rb") as f:
            value = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return value if _BOOT_ID.fullmatch(value) else None


def _parse_stat(raw: bytes) -> _Stat:
    # comm (field 2) may contain spaces and parentheses: everything after the LAST ')' is fields 3..
    end = raw.rfind(b")")
    if end < 0:
        raise _Unreadable("no ')' in stat")
    fields = raw[end + 1 :].split()
    # fields[0] is field 3 (state), fields[2] field 5 (pgrp), fields[19] field 22 (starttime)
    if len(fields) < 20:
        raise _Unreadable("short stat")
    try:
        state = fields[0].decode("ascii")
        pgrp = int(fields[2])
        start_time = int(fields[19])
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Unreadable("bad stat field") from exc
    if len(state) != 1 or start_time < 0:
        raise _Unreadable("bad stat field")
    return _Stat(state=state, pgrp=pgrp, start_time=start_time)


def _read_stat(pid: int) -> _Stat | None:
    """The stat record of ``pid``; ``None`` when that process does not exist."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        # ENOENT means "no such pid" only if /proc itself is there to ask.
        if not os.path.exists(f"{_PROC}/self/stat"):
            raise _Unreadable("/proc is not mounted") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ESRCH:  # exited between open and read
            return None
        raise _Unreadable(str(exc)) from exc
    return _parse_stat(raw)


def _check_pid(pid: int) -> None:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError("pid must be a positive int")


def capture_handle(pid: int) -> ProcessHandle | None:
    """Capture the identity of ``pid``, or ``None`` when it cannot be captured.

    A process that already became a zombie still gets its handle: its pid and start time stay
    pinned until it is reaped, and ``inspect`` will report it exited. That keeps a task that ended
    instantly from being treated as "handle could not be saved".
    """
    _check_pid(pid)
    boot_id = read_boot_id()
    if boot_id is None:
        return None
    try:
        stat = _read_stat(pid)
    except _Unreadable:
        return None
    if stat is None:
        return None
    return ProcessHandle(boot_id=boot_id, pid=pid, pgid=stat.pgrp, start_time=stat.start_time)


def _valid(handle: ProcessHandle) -> bool:
    ints = (handle.pid, handle.pgid, handle.start_time)
    return (
        isinstance(handle.boot_id, str)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
        and handle.pid > 0
        and handle.start_time >= 0
    )


def _probe(handle: ProcessHandle) -> tuple[IdentityState, _Stat | None]:
    if not _valid(handle):  # e.g. a corrupted stored handle: fail closed
        return IdentityState.UNVERIFIABLE, None
    boot_id = read_boot_id()
    if boot_id is None:
        return IdentityState.UNVERIFIABLE, None
    if boot_id != handle.boot_id:
        return IdentityState.EXITED, None
    try:
        stat = _read_stat(handle.pid)
    except _Unreadable:
        return IdentityState.UNVERIFIABLE, None
    if stat is None or stat.start_time != handle.start_time or stat.state in _GONE_STATES:
        return IdentityState.EXITED, stat
    return IdentityState.RUNNING, stat


def inspect(handle: ProcessHandle) -> IdentityState:
    """Whether the process ``handle`` names is still running (see the module doc for the rules)."""
    return _probe(handle)[0]


def signal_group(handle: ProcessHandle, sig: int) -> SignalOutcome:
    """Send ``sig`` to the process group led by the process ``handle`` names.

    ``BLOCKED`` (nothing sent) when the handle is not a group leader's, the identity cannot be
    verified, or the process now sits in another group; ``ALREADY_EXITED`` (nothing sent) when the
    identity says it exited or the group is gone; ``SIGNALLED`` otherwise.
    """
    if not _valid(handle) or handle.pid <= 1 or handle.pgid != handle.pid:
        return SignalOutcome.BLOCKED  # never killpg(0)/killpg(1), never a group we do not lead
    state, stat = _probe(handle)
    if state is IdentityState.EXITED:
        return SignalOutcome.ALREADY_EXITED
    if state is IdentityState.UNVERIFIABLE or stat is None or stat.pgrp != handle.pgid:
        return SignalOutcome.BLOCKED
    try:
        os.killpg(handle.pgid, sig)
    except ProcessLookupError:
        return SignalOutcome.ALREADY_EXITED
    except PermissionError:
        return SignalOutcome.BLOCKED
    return SignalOutcome.SIGNALLED
