"""Processes of ql found from outside, as a test sees them: /proc only, nothing of ql imported."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["OUTLIVED_EXIT_CODE", "argv_with", "pids", "pids_with", "proc_stat", "standby_launchers",
           "standbys_of", "under_subreaper", "zombie_children"]

#: The exit code of :func:`under_subreaper`'s wrapper when a descendant outlived the host.
OUTLIVED_EXIT_CODE = 97

_SUBREAPER = r"""
import ctypes, os, signal, sys, time
bound = float(sys.argv[1])
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("subreaper: prctl(PR_SET_CHILD_SUBREAPER) failed")
host = os.fork()
if host == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status = os.waitpid(host, 0)
code = os.waitstatus_to_exitcode(status)
code = code if code >= 0 else 128 - code
deadline = time.monotonic() + bound
while True:  # every orphan of the host is now our child: reap them all, bounded
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        sys.exit(code)
    if pid == 0 and time.monotonic() > deadline:
        break
    if pid == 0:
        time.sleep(0.02)
left = [int(p) for p in os.listdir("/proc") if p.isdigit()
        and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
print(f"subreaper: {left} outlived the host by {bound:g} s (killed)", file=sys.stderr)
for pid in left:
    os.kill(pid, signal.SIGKILL)
sys.exit(%d)
""" % OUTLIVED_EXIT_CODE


def under_subreaper(argv: list[str], bound_s: float = 60.0) -> list[str]:
    """``argv`` run as the child of a subreaper (prctl PR_SET_CHILD_SUBREAPER): when the host dies its
    orphans (a standby launcher, say) are reparented to the wrapper, not init, so they are this
    test's own and nobody else's. The wrapper exits with the host's code once every descendant is
    gone, or, when one still lives ``bound_s`` seconds after the host, kills them and exits
    :data:`OUTLIVED_EXIT_CODE` naming their pids on stderr."""
    return [sys.executable, "-c", _SUBREAPER, str(bound_s), *argv]


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


def argv_with(marker: str) -> dict[int, list[bytes]]:
    """Live (not zombie) processes whose argv holds ``marker`` (a unique word of a test's command),
    with that argv as read once: a process exiting meanwhile reads as an empty cmdline, so a second
    read may no longer say what it is."""
    out = {}
    for pid in pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = proc_stat(pid)
        if marker.encode() in argv and fields is not None and fields[0] not in ("Z", "X"):
            out[pid] = argv
    return out


def pids_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose argv holds ``marker`` (:func:`argv_with`'s pids)."""
    return list(argv_with(marker))


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


def zombie_children(parent: int) -> list[int]:
    """Children of ``parent`` that exited and were never reaped."""
    return [pid for pid in pids() if (st := proc_stat(pid)) is not None and int(st[1]) == parent and st[0] == "Z"]
