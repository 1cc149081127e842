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

A host keeps at most :data:`MAX_PIDFDS` pidfds open (one per launcher it has not reaped yet), and
never more than a quarter of its ``RLIMIT_NOFILE``: an embedded library must not eat its host's
descriptors. A launcher started beyond that is followed the way it is without pidfds.

Every launcher is tracked until it is reaped, whether or not anyone waits for it: each new launcher
first reaps up to :data:`REAP_SCAN` tracked ones that have exited (:func:`reap_exited`, never
blocking, never a SIGCHLD handler, never ``waitpid(-1)``), so a host that submits and never waits
keeps no zombies beyond those still running and the last few started.

A forked host's child closes the copies it inherited of every launcher's pidfd and channel
(``os.register_at_fork``): the launchers are the parent's, and an inherited channel would keep a
standby or an awaited task's publisher from ever seeing its host's death.

An awaited task's launcher is *kept* (:attr:`Child.keep`) from its hand-over until its host has
answered its publisher: its exit status is read with ``WNOWAIT`` and it stays an unreaped zombie.
Beside a zombie launcher, recovery knows the publisher for what it is — the holder of the task's
result, never signalled; beside a launcher already reaped it looks like any process the task left
behind, and a timeout's TERM would make the intent decide, its KILL destroy the result.
"""

from __future__ import annotations

import itertools
import os
import resource
import select
import threading
import time
import weakref
from typing import Protocol

from .identity import proc_start_time

__all__ = ["MAX_PIDFDS", "REAP_SCAN", "Child", "ForgetsAfterFork", "Process", "Reaped", "forget_after_fork",
           "pidfd_budget", "reap_exited", "tracked_launchers"]


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
#: This process's pid, set again in the child of every ``fork`` (:func:`_after_fork_in_child`, the hook
#: this module already relies on to drop the parent's pidfds): :attr:`Child.ours` is asked ~7 times
#: per task, a getpid syscall each.
_PID = os.getpid()
#: The most pidfds open at once in one host process (launchers started, not yet reaped). Beyond
#: it a launcher is waited for by pid with its start time checked, as where pidfds are missing.
MAX_PIDFDS = 256
_pidfds_lock = threading.Lock()
_pidfds_open = 0


def pidfd_budget() -> int:
    """How many pidfds this process may hold now: :data:`MAX_PIDFDS`, and never more than a
    quarter of its descriptor limit (``RLIMIT_NOFILE``'s soft limit), so that a host run under a
    small limit keeps its descriptors for itself and for the launchers' pipes and logs."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_PIDFDS
    return max(0, min(MAX_PIDFDS, soft // 4))


def _open_pidfd(pid: int) -> int:
    global _pidfds_open
    if _P_PIDFD is None:
        return -1
    with _pidfds_lock:
        if _pidfds_open >= pidfd_budget():
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


class Process(Protocol):
    """What :class:`Child` needs of the process it follows: a ``Popen``, or
    :class:`~.factory.Forked` for a standby the factory forked."""

    pid: int
    returncode: int | None


class Child:
    """One launcher of ours (``process``: its ``Popen``), tracked until it is reaped.

    Whoever uses the pidfd (a waiter, a liveness check, a signal) holds it through :meth:`_using`:
    the reaper (:func:`reap_exited`) never touches a launcher in use, and the pidfd is closed only
    once nobody uses it — so a pidfd number is never polled or signalled through after its reuse.
    """

    __slots__ = ("__weakref__", "_fd", "_lock", "_owner", "_start", "_users", "keep", "pid", "process", "reaped")

    def __init__(self, process: Process) -> None:
        # Reap what has exited first: the pidfds it frees may serve this launcher.
        reap_exited()
        self.process = process
        self.pid = process.pid
        self._owner = _PID
        self.reaped: Reaped | None = None
        #: Exited, it stays an unreaped zombie (its status read with WNOWAIT) until :meth:`unkeep`.
        self.keep = False
        self._lock = threading.Lock()
        self._users = 0
        self._fd = _open_pidfd(self.pid)
        self._start = proc_start_time(self.pid) if self._fd < 0 else None
        _LIVE.add(self)
        with _tracked_lock:
            _TRACKED[id(self)] = self

    @property
    def ours(self) -> bool:
        """Started by this process (not a copy inherited across ``fork``)."""
        return self._owner == _PID

    def _using(self) -> _InUse:
        return _InUse(self)

    # -- waiting and reaping --------------------------------------------------------------------
    def _exited(self, timeout_s: float | None) -> bool:
        """The pidfd is readable (the process exited) within ``timeout_s`` (None: no limit)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))

    def _reap_pidfd(self, block: bool) -> Reaped | None:
        flags = os.WEXITED | (0 if block else os.WNOHANG) | (os.WNOWAIT if self.keep else 0)
        try:
            info = os.waitid(_P_PIDFD, self._fd, flags)  # type: ignore[arg-type]
        except ChildProcessError:
            return Reaped(None)
        except OSError:  # the pidfd went bad: no status, none claimed
            return Reaped(None)
        if info is None:
            return None
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
        if self.keep:
            return Reaped(info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)
        try:
            _pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return Reaped(None)
        if _pid == 0:
            return None
        return Reaped(os.waitstatus_to_exitcode(status))

    def _try_reap_locked(self) -> Reaped | None:
        """Reap it now if it has exited (never blocks; the caller holds ``_lock``)."""
        if self.reaped is not None:
            return self.reaped
        reaped = self._reap_pidfd(block=False) if self._fd >= 0 else self._reap_checked(block=False)
        if reaped is not None and not self.keep:
            self._finish_locked(reaped)
        return reaped

    def wait(self, timeout_s: float | None) -> Reaped | None:
        """Block until the launcher exits (at most ``timeout_s``; None: no limit) and reap it (a
        kept one: read its status, leave it a zombie); None while it still runs. Once reaped, the
        same answer every time."""
        if self.reaped is not None:
            return self.reaped
        if not self.ours:
            return Reaped(None)  # a fork's copy: the launcher is the parent's to reap
        with self._using():
            if self._fd >= 0:
                # Blocks on the pidfd without the lock (the reaper skips a launcher in use), then
                # reaps under it: two waiters never both reap, and never take each other's status.
                if not self._exited(timeout_s) and self.reaped is None:
                    return None
                with self._lock:
                    if self.reaped is None:
                        # Exited (the pidfd said so): this waitid returns at once.
                        reaped = self._reap_pidfd(block=True) or Reaped(None)
                        if self.keep:
                            return reaped
                        self._finish_locked(reaped)
                    return self.reaped
            return self._wait_checked(timeout_s)

    def _wait_checked(self, timeout_s: float | None) -> Reaped | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.0005
        while True:
            with self._lock:
                reaped = self._try_reap_locked()
            if reaped is not None or (deadline is not None and time.monotonic() >= deadline):
                return reaped
            pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 2, 0.05)

    def unkeep(self) -> None:
        """Stop keeping it (:attr:`keep`): reaped now if it has exited and nobody is using it, else
        by its waiter or the next :func:`reap_exited`."""
        if not self.ours:
            return
        with self._lock:
            self.keep = False
            if self._users == 0 and self.reaped is None:
                self._try_reap_locked()

    def _finish_locked(self, reaped: Reaped) -> None:
        self.reaped = reaped
        # Popen must never wait for this pid again (a collected Popen without a returncode is
        # polled by pid at the next Popen: a reused pid's status would be taken from the host).
        self.process.returncode = reaped.status if reaped.status is not None else _NO_STATUS
        with _tracked_lock:
            _TRACKED.pop(id(self), None)
        if self._users == 0:
            self._close_locked()

    # -- state and signals ----------------------------------------------------------------------
    def alive(self) -> bool:
        """Not exited (as far as its pidfd — or, without one, ``waitid`` — tells)."""
        if self.reaped is not None or not self.ours:
            return False
        with self._using():
            if self.reaped is not None:
                return False
            if self._fd >= 0:
                return not self._exited(0)
            try:
                return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:
                return False

    def stopped(self) -> bool:
        """Stopped (SIGSTOP, SIGTSTP, a tracer): it would take no message until continued."""
        if self.reaped is not None or not self.ours:
            return False
        with self._using():
            idtype, ident = (_P_PIDFD, self._fd) if self._fd >= 0 else (os.P_PID, self.pid)
            try:
                info = os.waitid(idtype, ident, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)  # type: ignore[arg-type]
            except OSError:
                return False
            return info is not None and info.si_code in (os.CLD_STOPPED, os.CLD_TRAPPED)

    def signal_group(self, signum: int) -> None:
        """Signal the launcher's process group — only while the launcher is alive and unreaped, so
        its pid (the group's id) cannot have been handed to anyone else (the reaper leaves a
        launcher alone while it is in use)."""
        if not self.ours:
            return
        with self._using():
            if self.alive():
                try:
                    os.killpg(self.pid, signum)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        """Drop the pidfd (idempotent). The process itself is left as it is."""
        if not self.ours:
            return  # a fork's copy: its pidfd was closed after the fork (and a lock copied from a
            # thread of the parent may never be released here)
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _close_pidfd(fd)

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            _close_pidfd(fd)


class _InUse:
    """:meth:`Child._using`: the pidfd is in use while inside (a plain context manager: several per
    task, where a generator-based one costs a generator, its frame and contextlib's wrapper)."""

    __slots__ = ("_child",)

    def __init__(self, child: Child) -> None:
        self._child = child

    def __enter__(self) -> None:
        child = self._child
        with child._lock:  # noqa: SLF001 - Child's own helper
            child._users += 1  # noqa: SLF001

    def __exit__(self, *exc: object) -> None:
        child = self._child
        with child._lock:  # noqa: SLF001
            child._users -= 1  # noqa: SLF001
            if child._users == 0 and child.reaped is not None:  # noqa: SLF001
                child._close_locked()  # noqa: SLF001


#: Our launchers not reaped yet, oldest first (held strongly: a launcher nobody waits for is
#: still reaped, and its ``Popen`` never collected unreaped).
_TRACKED: dict[int, Child] = {}
_tracked_lock = threading.Lock()
#: ``Popen.returncode`` of a launcher the kernel had no status for (never read as a status).
_NO_STATUS = -(1 << 16)
#: How many tracked launchers one call of :func:`reap_exited` looks at (each a non-blocking
#: ``waitid``): every launcher start looks at this many, so unwaited launchers are reaped at the
#: pace they are started, with bounded work per call.
REAP_SCAN = 64


def reap_exited(limit: int | None = REAP_SCAN) -> int:
    """Reap launchers of ours that have exited and that nobody is using (waiting for, checking or
    signalling): at most ``limit`` looked at, oldest first (None: every one). Never blocks, never
    installs a SIGCHLD handler, never ``waitpid(-1)``: each through its own pidfd, or by pid with
    its start time checked. A reaped launcher's status is kept (a later ``wait`` returns it); its
    run still ends through its receipt. A kept launcher (:attr:`Child.keep`) is left alone, except
    by the closing sweep (``limit`` None). Returns how many were reaped."""
    with _tracked_lock:
        keys = list(_TRACKED) if limit is None else list(itertools.islice(_TRACKED, limit))
        children = [_TRACKED[k] for k in keys]
    reaped = 0
    running: list[Child] = []
    for child in children:
        if not child.ours or not child._lock.acquire(blocking=False):  # noqa: SLF001
            continue  # a fork's copy (dropped after fork), or someone is inside: not now
        try:
            if child.keep and limit is not None:
                running.append(child)  # kept for its host's answer: to the back of the line too
            elif child._users == 0 and child.reaped is None:  # noqa: SLF001
                child.keep = False  # closing (limit None): nothing is kept any longer
                if child._try_reap_locked() is not None:  # noqa: SLF001
                    reaped += 1
                else:
                    running.append(child)
        finally:
            child._lock.release()  # noqa: SLF001
    if running:
        with _tracked_lock:  # still running (or kept): to the back of the line, so the scan moves on
            for child in running:
                if _TRACKED.pop(id(child), None) is not None:
                    _TRACKED[id(child)] = child
    return reaped


def tracked_launchers() -> int:
    """How many launchers of this process are not reaped yet (diagnostics, tests)."""
    with _tracked_lock:
        return len(_TRACKED)


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
    global _PID, _pidfds_lock, _pidfds_open, _tracked_lock, _TRACKED
    _PID = os.getpid()
    _pidfds_lock = threading.Lock()
    _tracked_lock = threading.Lock()
    _TRACKED = {}  # the parent's launchers: never ours to reap
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
