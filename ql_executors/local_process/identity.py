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

A group outlives its leader. When the launcher is gone (killed on its own, say) but its command
still runs in the launcher's process group, the task is still running: with the ``proc`` source,
``inspect`` says ``RUNNING`` as long as the group has members — each in the launcher's session and
started after it — and ``signal_group`` signals that group, so cancel and timeout still reach the
command and ``lost`` is declared only once the whole group is gone. (A group id cannot be handed to
another group while any member lives; a member that fails the checks — another session, started
before our launcher — makes the group foreign: ``EXITED``, never signalled. The ``psutil`` source
follows the leader only.)

A launcher that exited but was not reaped (a zombie: its host is stopped, say) is judged by what it
left: while its acknowledged-path publisher — its own fork, same command name, in its group and
session, not stopped — still waits (bounded) to publish the task's result, ``inspect`` says
``RUNNING`` (nothing may be decided yet) and ``signal_group`` sends nothing (``ALREADY_EXITED``: a
KILL would only destroy that result). ``leader_state`` reports on the launcher process alone (alive,
or exited with the status the kernel still holds for it), for recovery's judgement of a receipt.

Race note: between the re-verification and ``killpg`` the group id cannot be handed to an unrelated
group while any of our group's members lives (Linux does not reuse a pid still in use as a pgid);
only after the whole group is gone *and* the pid space wrapped around could it name another group.

Sources. Identity is read by one of two sources behind the same opaque handle:

- ``proc`` (the default on Linux): the above, exact (clock ticks, kernel boot id);
- ``psutil`` (the default elsewhere; ``identity_psutil``, loaded on first use): ``psutil.boot_time()``,
  ``Process(pid).create_time()``, ``os.getpgid``, status zombie/dead = exited. Both times are
  wall-clock derived, so they are compared with a slack (see that module); a wall-clock step larger
  than the slack between capture and inspection makes a live task look exited (it then ends
  ``lost``, never a false success).

``QL_IDENTITY_SOURCE=proc|psutil`` (or the ``source`` argument) forces one. A handle records the
source that made it and is only ever judged by that same source: when the active source differs,
the handle is ``UNVERIFIABLE`` (never signalled, never declared exited). ``handle_to_dict`` /
``handle_from_dict`` are the JSON form core stores; a dict without ``source`` is the original
``/proc`` format. What a source reads and the protocol both sources follow are in
``identity_source``.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from enum import StrEnum
from typing import Any

from ql_core.log import logger
from ql_core.value_class import lean_dataclass

from .identity_source import IdentitySource, IdentityUnreadable, ProcStat

__all__ = [
    "ProcessHandle",
    "IdentityState",
    "LeaderState",
    "SignalOutcome",
    "SOURCE_ENV",
    "SOURCES",
    "default_source",
    "read_boot_id",
    "proc_start_time",
    "capture_handle",
    "inspect",
    "leader_state",
    "group_has_others",
    "signal_group",
    "handle_to_dict",
    "handle_from_dict",
]

SOURCE_ENV = "QL_IDENTITY_SOURCE"
SOURCES = ("proc", "psutil")

_PROC = "/proc"
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_GONE_STATES = frozenset({"Z", "X", "x"})  # zombie, dead ('x' on some older kernels)


# A dataclass (changed with dataclasses.replace), without generated methods (start-up CPU).
@lean_dataclass(frozen=True)
class ProcessHandle:
    """Identity of a launched process, as read by ``source``.

    ``proc``: ``boot_id`` is the kernel boot id, ``start_time`` field 22 of ``/proc/<pid>/stat``
    (clock ticks since boot). ``psutil``: ``boot_id`` is the boot time in whole seconds (decimal
    digits), ``start_time`` the process create time in milliseconds since the epoch.
    """

    boot_id: str
    pid: int
    pgid: int
    start_time: int
    source: str = "proc"

    def __init__(self, boot_id: str, pid: int, pgid: int, start_time: int, source: str = "proc") -> None:
        _set = object.__setattr__
        _set(self, "boot_id", boot_id)
        _set(self, "pid", pid)
        _set(self, "pgid", pgid)
        _set(self, "start_time", start_time)
        _set(self, "source", source)


class IdentityState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    UNVERIFIABLE = "unverifiable"


class SignalOutcome(StrEnum):
    SIGNALLED = "signalled"
    ALREADY_EXITED = "already_exited"
    BLOCKED = "blocked"


class LeaderState(StrEnum):
    """What became of the launcher process itself (not its group): see :func:`leader_state`."""

    ALIVE = "alive"
    EXITED = "exited"
    UNKNOWN = "unknown"


#: Stands for the members of a group whose leader is gone (see _orphaned_group).
_ORPHANED = "orphaned"
#: Stands for the publisher an exited launcher left behind (see _publisher_pending).
_PUBLISHING = "publishing"


#: The boot id read from each path (only a valid one is kept). A process never outlives its boot,
#: so the first good read stays true for its whole life: every later identity check and duration
#: (two per awaited task) would otherwise reopen the file for the same answer. Keyed by path, so a
#: test pointing ``_BOOT_ID_PATH`` elsewhere reads that file.
_BOOT_IDS: dict[str, str] = {}


def read_boot_id() -> str | None:
    """The current boot id, or ``None`` when it cannot be read."""
    path = _BOOT_ID_PATH
    known = _BOOT_IDS.get(path)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            value = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    if _BOOT_ID.fullmatch(value) is None:
        return None
    _BOOT_IDS[path] = value
    return value


def _parse_stat(raw: bytes) -> ProcStat:
    # comm (field 2) may contain spaces and parentheses: everything after the LAST ')' is fields 3..
    end = raw.rfind(b")")
    if end < 0:
        raise IdentityUnreadable("no ')' in stat")
    fields = raw[end + 1 :].split()
    # fields[0] is field 3 (state), [2] field 5 (pgrp), [3] field 6 (session), [19] field 22 (starttime)
    if len(fields) < 20:
        raise IdentityUnreadable("short stat")
    try:
        state = fields[0].decode("ascii")
        pgrp = int(fields[2])
        session = int(fields[3])
        start_time = int(fields[19])
    except (UnicodeDecodeError, ValueError) as exc:
        raise IdentityUnreadable("bad stat field") from exc
    if len(state) != 1 or start_time < 0:
        raise IdentityUnreadable("bad stat field")
    start = raw.find(b"(")
    comm = raw[start + 1 : end] if 0 <= start < end else b""
    try:
        exit_code = int(fields[49]) if len(fields) > 49 else 0
    except ValueError:
        exit_code = 0
    return ProcStat(state=state, pgrp=pgrp, start_time=start_time, session=session, comm=comm,
                 exit_code=exit_code)


def _read_stat(pid: int) -> ProcStat | None:
    """The stat record of ``pid``; ``None`` when that process does not exist."""
    try:
        # One open and one read (the file is a few hundred bytes, produced whole by one read): not a
        # buffered file object, whose set-up costs more than the read (every task's handle comes here).
        fd = os.open(f"{_PROC}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        # ENOENT means "no such pid" only if /proc itself is there to ask.
        if not os.path.exists(f"{_PROC}/self/stat"):
            raise IdentityUnreadable("/proc is not mounted") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ESRCH:  # exited between open and read
            return None
        raise IdentityUnreadable(str(exc)) from exc
    return _parse_stat(raw)


def proc_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time, clock ticks since boot); None when that
    process is gone or its record cannot be read."""
    try:
        found = _read_stat(pid)
    except IdentityUnreadable:
        return None
    return None if found is None else found.start_time


class _ProcSource:
    """Linux ``/proc``: exact boot id and start ticks, read in one ``read`` of the stat file."""

    name = "proc"

    def boot(self) -> str | None:
        return read_boot_id()

    def same_boot(self, stored: str, current: str) -> bool:
        return stored == current

    def stat(self, pid: int) -> ProcStat | None:
        return _read_stat(pid)

    def same_start(self, stored: int, current: int) -> bool:
        return stored == current

    def valid_boot(self, value: str) -> bool:
        return _BOOT_ID.fullmatch(value) is not None


_PROC_SOURCE = _ProcSource()


def default_source() -> str:
    """The active source: ``QL_IDENTITY_SOURCE`` if set, else ``proc`` on Linux, ``psutil`` elsewhere.

    An unknown forced value is returned as is: every handle is then unverifiable (fail closed).
    """
    forced = os.environ.get(SOURCE_ENV, "").strip()
    if forced:
        return forced
    return "proc" if sys.platform.startswith("linux") else "psutil"


def _get_source(name: str) -> IdentitySource | None:
    if name == "proc":
        return _PROC_SOURCE
    if name == "psutil":
        from .identity_psutil import PSUTIL_SOURCE  # lazy: psutil itself is imported only here

        return PSUTIL_SOURCE
    logger.warning("process identity: unknown source {!r}; every handle is unverifiable", name)
    return None


def _active(handle: ProcessHandle | None, source: str | None) -> IdentitySource | None:
    """The source to judge ``handle`` with: the active one, and only if it made the handle."""
    name = default_source() if source is None else source
    if handle is not None and handle.source != name:
        return None  # never judge a handle by another source's rules
    return _get_source(name)


def _check_pid(pid: int) -> None:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError("pid must be a positive int")


def capture_handle(pid: int, *, source: str | None = None) -> ProcessHandle | None:
    """Capture the identity of ``pid``, or ``None`` when it cannot be captured.

    A process that already became a zombie still gets its handle: its pid and start time stay
    pinned until it is reaped, and ``inspect`` will report it exited. That keeps a task that ended
    instantly from being treated as "handle could not be saved". ``source`` overrides
    ``default_source()``.
    """
    _check_pid(pid)
    src = _active(None, source)
    if src is None:
        return None
    boot_id = src.boot()
    if boot_id is None:
        return None
    try:
        stat = src.stat(pid)
    except IdentityUnreadable:
        return None
    if stat is None or stat.start_time < 0:
        return None
    return ProcessHandle(
        boot_id=boot_id, pid=pid, pgid=stat.pgrp, start_time=stat.start_time, source=src.name
    )


def _valid(handle: ProcessHandle) -> bool:
    ints = (handle.pid, handle.pgid, handle.start_time)
    return (
        isinstance(handle.boot_id, str)
        and isinstance(handle.source, str)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
        and handle.pid > 0
        and handle.start_time >= 0
    )


def _probe(handle: ProcessHandle, source: str | None) -> tuple[IdentityState, ProcStat | None]:
    if not _valid(handle):  # e.g. a corrupted stored handle: fail closed
        return IdentityState.UNVERIFIABLE, None
    src = _active(handle, source)
    if src is None or not src.valid_boot(handle.boot_id):
        return IdentityState.UNVERIFIABLE, None
    boot_id = src.boot()
    if boot_id is None:
        return IdentityState.UNVERIFIABLE, None
    if not src.same_boot(handle.boot_id, boot_id):
        return IdentityState.EXITED, None
    try:
        stat = src.stat(handle.pid)
    except IdentityUnreadable:
        return IdentityState.UNVERIFIABLE, None
    leader_gone = stat is None or (stat.state in _GONE_STATES and src.same_start(handle.start_time, stat.start_time))
    if (leader_gone and stat is not None and src.name == "proc" and handle.pgid == handle.pid
            and _publisher_pending(handle, stat)):
        # The launcher exited (its host has not reaped it: stopped, say) and left its publisher
        # waiting (bounded) for that host's word: the task's result exists and may still be
        # published. Nothing is decided yet, and nothing is signalled (signal_group).
        return IdentityState.RUNNING, ProcStat(state=_PUBLISHING, pgrp=handle.pgid, start_time=handle.start_time)
    if leader_gone and src.name == "proc" and handle.pgid == handle.pid and _orphaned_group(handle):
        # The launcher is gone (or an unreaped zombie) but its command runs on in its group: still
        # running, still in reach.
        return IdentityState.RUNNING, ProcStat(state=_ORPHANED, pgrp=handle.pgid, start_time=handle.start_time)
    if stat is None or stat.state in _GONE_STATES:
        return IdentityState.EXITED, stat
    if not src.same_start(handle.start_time, stat.start_time):
        return IdentityState.EXITED, stat
    return IdentityState.RUNNING, stat


def _orphaned_group(handle: ProcessHandle) -> bool:
    """Does the group the (now gone) launcher led still have members, all of them ours?

    Ours: in the launcher's session (it was a session leader: sid == pid == pgid) and started no
    earlier than the launcher. One member that is not ours makes the whole group foreign (False).
    One bounded pass over /proc; only called once the leader itself is gone.
    """
    try:
        os.killpg(handle.pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # members exist but are not ours to signal; the checks below decide
    found = False
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return False
    for name in entries:
        if not name.isdigit():
            continue
        try:
            member = _read_stat(int(name))
        except IdentityUnreadable:
            return False  # cannot tell: fail closed (exited, never signalled)
        if member is None or member.pgrp != handle.pgid or member.state in _GONE_STATES:
            continue
        if member.session != handle.pid or member.start_time < handle.start_time:
            return False
        found = True
    return found


def _publisher_pending(handle: ProcessHandle, leader: ProcStat) -> bool:
    """Is the zombie launcher's publisher still there to publish the task's result?

    The publisher is the launcher's own fork (same command name; the command's processes were
    exec'd and carry theirs), in the launcher's group and session, started after it. A stopped
    publisher publishes nothing until continued: it does not count (the attempt is then decided
    as any exited one, and a receipt it publishes later is recorded as late). One bounded pass
    over /proc; only called once the leader is a zombie.
    """
    if leader.state not in _GONE_STATES or not leader.comm:
        return False
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return False
    for name in entries:
        if not name.isdigit() or int(name) == handle.pid:
            continue
        try:
            member = _read_stat(int(name))
        except IdentityUnreadable:
            continue
        if (member is not None and member.pgrp == handle.pgid and member.session == handle.pid
                and member.start_time >= handle.start_time and member.comm == leader.comm
                and member.state not in _GONE_STATES and member.state not in ("T", "t")):
            return True
    return False


def group_has_others(leader: int) -> bool:
    """Has the process group ``leader`` leads a live member other than the leader itself (the
    publisher an exited launcher left, say)? One bounded pass over /proc; False when it cannot tell."""
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return False
    for name in entries:
        if not name.isdigit() or int(name) == leader:
            continue
        try:
            member = _read_stat(int(name))
        except IdentityUnreadable:
            continue
        if member is not None and member.pgrp == leader and member.state not in _GONE_STATES:
            return True
    return False


def leader_state(handle: ProcessHandle, *, source: str | None = None) -> tuple[LeaderState, int | None]:
    """The launcher process itself, not its group: ``ALIVE`` while it runs (not a zombie);
    ``EXITED`` once it exited, with the command's status when the kernel still holds the
    launcher's (an unreaped zombie that exited normally: a launcher exits with its command's
    status) and that status is not 0; ``UNKNOWN`` when nothing can be told.

    Why never 0: ``/proc/PID/stat`` shows the exit status only to a reader allowed to ptrace the
    process and shows 0 to any other, so a 0 proves nothing; any other value is the kernel's.
    """
    if not _valid(handle):
        return LeaderState.UNKNOWN, None
    src = _active(handle, source)
    if src is None or src.name != "proc" or not src.valid_boot(handle.boot_id):
        return LeaderState.UNKNOWN, None
    boot_id = src.boot()
    if boot_id is None:
        return LeaderState.UNKNOWN, None
    if not src.same_boot(handle.boot_id, boot_id):
        return LeaderState.EXITED, None
    try:
        stat = src.stat(handle.pid)
    except IdentityUnreadable:
        return LeaderState.UNKNOWN, None
    if stat is None or not src.same_start(handle.start_time, stat.start_time):
        return LeaderState.EXITED, None
    if stat.state not in _GONE_STATES:
        return LeaderState.ALIVE, None
    status = stat.exit_code
    if status > 0 and status & 0x7F == 0 and status <= 0xFFFF:  # WIFEXITED
        return LeaderState.EXITED, (status >> 8) & 0xFF
    return LeaderState.EXITED, None


def inspect(handle: ProcessHandle, *, source: str | None = None) -> IdentityState:
    """Whether the process ``handle`` names is still running (see the module doc for the rules)."""
    return _probe(handle, source)[0]


def signal_group(handle: ProcessHandle, sig: int, *, source: str | None = None) -> SignalOutcome:
    """Send ``sig`` to the process group led by the process ``handle`` names.

    ``BLOCKED`` (nothing sent) when the handle is not a group leader's, the identity cannot be
    verified, or the process now sits in another group; ``ALREADY_EXITED`` (nothing sent) when the
    identity says it exited or the group is gone; ``SIGNALLED`` otherwise.
    """
    if not _valid(handle) or handle.pid <= 1 or handle.pgid != handle.pid:
        return SignalOutcome.BLOCKED  # never killpg(0)/killpg(1), never a group we do not lead
    state, stat = _probe(handle, source)
    if state is IdentityState.EXITED or (stat is not None and stat.state == _PUBLISHING):
        # A launcher that exited has nothing left to stop: its command ended and its publisher
        # holds the result (and ignores the forwarded signals) — a KILL would only destroy it.
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


# ---------------------------------------------------------------- the stored (JSON) form

_PROC_KEYS = frozenset({"boot_id", "pid", "pgid", "start_time"})
_PSUTIL_KEYS = frozenset({"source", "boot_time", "pid", "pgid", "create_time_ms"})
_MAX_INT = 2**63 - 1


def handle_to_dict(handle: ProcessHandle) -> dict[str, Any]:
    """The JSON-able form core stores (well under 512 bytes once serialized).

    ``proc`` handles keep the original four keys plus ``source``. ``psutil`` handles use other key
    names on purpose: a reader that only knows the ``/proc`` format fails to parse them (and so
    fails closed) instead of comparing a boot time with a kernel boot id.
    """
    if handle.source == "psutil":
        return {
            "source": "psutil",
            "boot_time": int(handle.boot_id),
            "pid": handle.pid,
            "pgid": handle.pgid,
            "create_time_ms": handle.start_time,
        }
    return {
        "source": handle.source,
        "boot_id": handle.boot_id,
        "pid": handle.pid,
        "pgid": handle.pgid,
        "start_time": handle.start_time,
    }


def _int_in(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= _MAX_INT


def handle_from_dict(data: object) -> ProcessHandle | None:
    """Parse a stored handle; ``None`` for anything that is not exactly a valid one (fail closed)."""
    if not isinstance(data, dict):
        return None
    source = data.get("source", "proc")
    if source == "proc":
        if set(data) - {"source"} != _PROC_KEYS:
            return None
        boot_id, start = data["boot_id"], data["start_time"]
        if not isinstance(boot_id, str) or _BOOT_ID.fullmatch(boot_id) is None:
            return None
    elif source == "psutil":
        if set(data) != _PSUTIL_KEYS or not _int_in(data["boot_time"], 0):
            return None
        boot_id, start = str(data["boot_time"]), data["create_time_ms"]
    else:
        return None
    pid, pgid = data["pid"], data["pgid"]
    if not (_int_in(pid, 1) and _int_in(pgid, 0) and _int_in(start, 0)):
        return None
    return ProcessHandle(boot_id=boot_id, pid=pid, pgid=pgid, start_time=start, source=source)
