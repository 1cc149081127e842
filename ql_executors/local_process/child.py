"""Our grip on one launcher process: waited for, reaped and signalled through a pidfd.

A pid is only a number. In a host that ignores SIGCHLD, or reaps every child itself (a
``waitpid(-1)`` in some SIGCHLD handler), our launcher can be reaped behind our back and its pid
given to another process; a later ``waitpid(pid)`` then collects *another* child's status (which
would then outrank the task's true receipt), and a ``pidfd_open(pid)`` follows a stranger. So the
pidfd is opened at once, while the launcher certainly still exists (it waits for its go-ahead, or
is an idle standby), and everything after goes through it: ``poll`` to wait, ``waitid(P_PIDFD)``
to reap — ECHILD then only ever means "the kernel has no status for us" — and signals only while
it shows the process alive (so its pid, which is its group id, cannot have been reused).

Where pidfds are missing (Linux < 5.4), the status is taken only after ``waitid(WNOWAIT)`` shows a
child of that pid whose start time (``/proc``) is still the launcher's; anything else is no status.

A host keeps at most :data:`MAX_PIDFDS` pidfds open (one per launcher it has not reaped yet): an
embedded library must not eat its host's descriptors. A launcher started beyond that is followed the
way it is without pidfds.

A forked host's child closes the copies it inherited of every launcher's pidfd and channel
(``os.register_at_fork``): the launchers are the parent's, and an inherited channel would keep a
standby or an awaited task's publisher from ever seeing its host's death.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
import weakref
from typing import Protocol

from .identity import proc_start_time

__all__ = ["MAX_PIDFDS", "Child", "ForgetsAfterFork", "Reaped", "forget_after_fork"]


def _pidfd_waitid() -> int | None:
    """``os.P_PIDFD`` if this kernel's waitid takes it (Linux 5.4+; 5.3 has pidfds but not this)."""
    idtype = getattr(os, "P_PIDFD", None)
    if idtype is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        os.waitid(idtype, 1 << 30, os.WEXITED | os.WNOHANG)  # no such descriptor
    except OSError as exc:  # EBADF: the id type is known, the fd (on purpose) is not; EINVAL: unknown
        import errno

        return idtype if exc.errno == errno.EBADF else None
    return idtype


_P_PIDFD = _pidfd_waitid()
#: The most pidfds open at once in one host process (launchers started, not yet reaped). Beyond
#: it a launcher is waited for by pid with its start time checked, as where pidfds are missing.
MAX_PIDFDS = 256
_pidfds_lock = threading.Lock()
_pidfds_open = 0


def _open_pidfd(pid: int) -> int:
    global _pidfds_open
    if _P_PIDFD is None:
        return -1
    with _pidfds_lock:
        if _pidfds_open >= MAX_PIDFDS:
            return -1
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return -1
        _pidfds_open += 1
        return fd


def _close_pidfd(fd: int) -> None:
    global _pidfds_open
    os.close(fd)
    with _pidfds_lock:
        _pidfds_open -= 1


class Reaped:
    """The launcher was reaped: ``status`` is its exit status (negative: killed by that signal), or
    None when the kernel had none for us (reaped elsewhere, or SIGCHLD ignored in this host)."""

    __slots__ = ("status",)

    def __init__(self, status: int | None) -> None:
        self.status = status


class Child:
    """One launcher of ours (``process``: its ``Popen``)."""

    __slots__ = ("__weakref__", "_fd", "_owner", "_start", "pid", "process", "reaped")

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.pid = process.pid
        self._owner = os.getpid()
        self.reaped: Reaped | None = None
        self._fd = _open_pidfd(self.pid)
        self._start = proc_start_time(self.pid) if self._fd < 0 else None
        _LIVE.add(self)

    @property
    def ours(self) -> bool:
        """Started by this process (not a copy inherited across ``fork``)."""
        return self._owner == os.getpid()

    # -- waiting and reaping --------------------------------------------------------------------
    def _exited(self, timeout_s: float) -> bool:
        """The pidfd is readable (the process exited) within ``timeout_s``."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))

    def _reap_pidfd(self) -> Reaped:
        try:
            info = os.waitid(_P_PIDFD, self._fd, os.WEXITED)  # type: ignore[arg-type]
        except ChildProcessError:
            return Reaped(None)
        except OSError:  # the pidfd went bad: no status, none claimed
            self.close()
            return Reaped(None)
        assert info is not None
        return Reaped(info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)

    def _reap_checked(self, block: bool) -> Reaped | None:
        """No pidfd: peek with WNOWAIT, reap only a child whose start time is still the launcher's."""
        flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
        try:
            info = os.waitid(os.P_PID, self.pid, flags)
        except ChildProcessError:
            return Reaped(None)
        if info is None:
            return None
        if self._start is None or proc_start_time(self.pid) != self._start:
            return Reaped(None)  # not (provably) our launcher: never its status, and not ours to reap
        try:
            _pid, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return Reaped(None)
        return Reaped(os.waitstatus_to_exitcode(status))

    def wait(self, timeout_s: float | None) -> Reaped | None:
        """Block until the launcher exits (at most ``timeout_s``; None: no limit) and reap it;
        None while it still runs. Once reaped, the same answer every time."""
        if self.reaped is not None:
            return self.reaped
        if not self.ours:
            return Reaped(None)  # a fork's copy: the launcher is the parent's to reap
        if self._fd >= 0:
            if timeout_s is not None and not self._exited(timeout_s):
                return None
            reaped = self._reap_pidfd()
        else:
            reaped = self._wait_checked(timeout_s)
            if reaped is None:
                return None
        self._finish(reaped)
        return reaped

    def _wait_checked(self, timeout_s: float | None) -> Reaped | None:
        if timeout_s is None:
            return self._reap_checked(block=True)
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while True:
            reaped = self._reap_checked(block=False)
            if reaped is not None or time.monotonic() >= deadline:
                return reaped
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)

    def _finish(self, reaped: Reaped) -> None:
        self.reaped = reaped
        if reaped.status is not None:
            self.process.returncode = reaped.status  # so Popen never waits for that pid again
        self.close()

    # -- state and signals ----------------------------------------------------------------------
    def alive(self) -> bool:
        """Not exited (as far as its pidfd — or, without one, ``waitid`` — tells)."""
        if self.reaped is not None or not self.ours:
            return False
        if self._fd >= 0:
            return not self._exited(0)
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def stopped(self) -> bool:
        """Stopped (SIGSTOP, SIGTSTP, a tracer): it would take no message until continued."""
        idtype, ident = (_P_PIDFD, self._fd) if self._fd >= 0 else (os.P_PID, self.pid)
        try:
            info = os.waitid(idtype, ident, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)  # type: ignore[arg-type]
        except OSError:
            return False
        return info is not None and info.si_code in (os.CLD_STOPPED, os.CLD_TRAPPED)

    def signal_group(self, signum: int) -> None:
        """Signal the launcher's process group — only while the launcher is alive and unreaped, so
        its pid (the group's id) cannot have been handed to anyone else."""
        if self.alive():
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Drop the pidfd (idempotent). The process itself is left as it is."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _close_pidfd(fd)

    def __del__(self) -> None:
        self.close()


class ForgetsAfterFork(Protocol):
    """Holds a launcher's channel: in a forked child, drops its copy without a word to the launcher."""

    def forget_after_fork(self) -> None: ...


_LIVE: weakref.WeakSet[Child] = weakref.WeakSet()
_HOLDERS: weakref.WeakSet[ForgetsAfterFork] = weakref.WeakSet()  # type: ignore[type-var]


def forget_after_fork(holder: ForgetsAfterFork) -> None:
    """Have ``holder.forget_after_fork()`` run in the child of every later ``fork`` (held weakly)."""
    _HOLDERS.add(holder)


def _after_fork_in_child() -> None:
    # One thread is left and no lock can be trusted: plain attribute access and os.close only.
    global _pidfds_lock, _pidfds_open
    _pidfds_lock = threading.Lock()
    for child in list(_LIVE):
        fd, child._fd = child._fd, -1  # noqa: SLF001 - this module's own object
        if fd >= 0:
            os.close(fd)
    _pidfds_open = 0
    for holder in list(_HOLDERS):
        try:
            holder.forget_after_fork()
        except Exception:  # noqa: BLE001, S110 - a fork must never fail because of us, nor log in the child
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
