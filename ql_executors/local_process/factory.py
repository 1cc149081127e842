"""The standby factory: one compiled launcher that forks standbys instead of a new exec for each.

Every exec of the statically linked launcher runs glibc's start-up CPU probes (``cpuid``, which a
hypervisor traps): about 0.6 ms of CPU per launcher on a small VM, more than all the rest the
launcher does for a ``true`` task. A host that keeps standbys ready (:mod:`.standby`, from the second
task on) therefore starts one ``launcher --factory`` and asks it for each further standby: a fork of
a process that has run the probes already skips them (docs/launcher.md, "Standby factory").

The factory is started exactly as a standby is (:func:`~.launch.spawn_standby`: its channel a
``SOCK_SEQPACKET`` socketpair on stdin, an empty environment, its own session) and holds as little:
nothing of any run, ever. Asked with one byte, it forks (``CLONE_PARENT``) a standby that is **this
host's child** — waited for, reaped and signalled through a pidfd like one ``Popen`` started —
which leads a new session, shows ``--standby`` in ``ps`` and answers with its pid and the host's end
of its own new channel. From there it is a standby like any other (launcher.c, "Factory mode").

What if something goes wrong? The factory is nobody's task: any failure to get a standby from it
(no answer within :data:`ANSWER_WAIT_S`, EOF, an answer that is not our child) discards it (SIGKILL)
and the standby is started the classic way; the next refill starts a new factory. It exits on EOF,
on a forwarded signal, and — like an idle standby, checked once a second — when its owner dies,
even while a libc-forked child of the host still holds a copy of its channel. A forked host's child
drops its copy of the channel (``os.register_at_fork``) and never asks its parent's factory.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
import weakref

from ql_core.log import logger

from .child import Child, forget_after_fork
from .launch import standby_capacity

__all__ = ["ANSWER_WAIT_S", "FactorySlot", "Forked", "StandbyFactory", "spawn_factory"]

#: How long a host waits for its factory's answer (a fork and one message: well under a
#: millisecond) before it gives the factory up and starts a standby the classic way.
ANSWER_WAIT_S = 5.0
#: How long discarding the factory waits for it to die of SIGKILL (it holds nothing of a run).
DISCARD_WAIT_S = 5.0


class Forked:
    """A standby the factory forked, as ``Popen`` shows a process it started: ``pid``,
    ``args``, ``returncode`` (set by :class:`~.child.Child` when it reaps it), ``poll``, ``wait``,
    ``send_signal`` and ``kill`` — what ``SpawnedTask.live.process`` offers whichever started it."""

    __slots__ = ("args", "pid", "returncode")

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        #: What ``ps`` shows of it (``Popen.args``): the launcher's path and ``--standby``.
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.returncode is None:
                self._reap(0)
            return self.returncode
        end = time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            left = end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:
            self.returncode = -(1 << 16)  # reaped elsewhere (our Child, normally): no status here
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def spawn_factory(compiled: str) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start ``compiled --factory`` the way a standby is started; it and our channel end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        process = subprocess.Popen([compiled, "--factory"], stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True, env={})
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


class StandbyFactory:
    """One running factory of this process: :meth:`standby` asks it for a new standby."""

    def __init__(self, compiled: str) -> None:
        process, self._channel = spawn_factory(compiled)
        # One poller for the channel's whole life, not one built and registered per standby.
        self._poller = select.poll()
        self._poller.register(self._channel, select.POLLIN)
        self._compiled = compiled
        self._child = Child(process)  # our grip on it: liveness, signals, reaping, as for any launcher
        self._lock = threading.Lock()
        forget_after_fork(self)
        self._finalizer = weakref.finalize(self, _discard, self._child, self._channel)

    def owned(self) -> bool:
        """Started by this process (a forked host's child has only a closed copy) and not closed."""
        return self._child.ours and self._channel.fileno() >= 0

    def standby(self) -> tuple[Forked, socket.socket, int]:
        """A new idle standby, our child: its stand-in process, our channel end and its capacity.
        ``OSError`` when none came (the caller then discards this factory)."""
        with self._lock:
            channel = self._channel
            if channel.fileno() < 0:
                raise OSError("the standby factory is closed")
            channel.send(b"n", socket.MSG_NOSIGNAL)
            if not self._poller.poll(int(ANSWER_WAIT_S * 1000)):
                raise TimeoutError("the standby factory did not answer")
            message, fds, _flags, _addr = socket.recv_fds(channel, 32, 1, socket.MSG_CMSG_CLOEXEC)
        if len(fds) != 1 or not message.isdigit():
            for fd in fds:
                os.close(fd)
            raise OSError("the standby factory gave no standby" if message else "the standby factory exited")
        pid = int(message)
        # Family, type and protocol given: the factory's socketpair is always this kind, and
        # socket.socket(fileno=...) alone asks the kernel three times (getsockname, 2 getsockopt).
        ours = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, fds[0])
        try:
            # Ours to wait for (CLONE_PARENT), or not a standby we may use: ECHILD.
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            capacity = standby_capacity(ours)
        except BaseException:
            ours.close()
            raise
        return Forked(pid, [self._compiled, "--standby"]), ours, capacity

    def close(self) -> None:
        """End the factory (SIGKILL: it holds nothing) and reap it. Idempotent."""
        self._finalizer()

    def forget_after_fork(self) -> None:
        """In a forked child: the factory is the parent's; drop our copy of its channel."""
        self._finalizer.detach()
        self._channel.close()


class FactorySlot:
    """An executor's one factory: started for a refill (``ahead``), used while it works, discarded
    (and the standby started the classic way) the moment it fails."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._factory: StandbyFactory | None = None

    def standby(self, compiled: str, *, ahead: bool) -> tuple[Forked, socket.socket, int] | None:
        """A standby from the factory, or None: there is none (and ``ahead`` is False: a one-shot
        host never starts one), or it failed — then it is discarded, and the next refill starts
        another."""
        with self._lock:
            factory = self._factory
            if factory is None or not factory.owned():
                if not ahead:
                    return None
                try:
                    factory = self._factory = StandbyFactory(compiled)
                except OSError as exc:
                    logger.debug("no standby factory: {}", type(exc).__name__)
                    return None
        try:
            return factory.standby()
        except OSError as exc:
            logger.debug("the standby factory failed ({}); starting standbys the classic way", type(exc).__name__)
            with self._lock:
                if self._factory is factory:
                    self._factory = None
            factory.close()
            return None

    def close(self) -> None:
        """Discard the factory, if any (idempotent)."""
        with self._lock:
            factory, self._factory = self._factory, None
        if factory is not None:
            factory.close()


def _discard(child: Child, channel: socket.socket) -> None:
    if not child.ours:
        channel.close()
        child.close()
        return
    try:
        child.signal_group(signal.SIGKILL)
        if child.wait(DISCARD_WAIT_S) is None:
            logger.warning("the standby factory (pid {}) did not exit; it is left to the system", child.pid)
            child.close()
        _end_late_answers(channel)
    except OSError as exc:  # best effort at close
        logger.debug("closing the standby factory failed: {}", type(exc).__name__)
    finally:
        channel.close()


def _end_late_answers(channel: socket.socket) -> None:
    """A standby that answered after we gave up waiting is our child all the same: end and reap it
    (it holds nothing of any run), so that it never stays a zombie of this host."""
    if channel.fileno() < 0:
        return
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(channel, 32, 1,
                                                           socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return
        for fd in fds:
            os.close(fd)
        if not message:
            return
        if message.isdigit():
            try:
                os.waitid(os.P_PID, int(message), os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                continue  # not ours: nothing to end or reap
            late = Child(Forked(int(message), []))
            late.signal_group(signal.SIGKILL)
            late.wait(DISCARD_WAIT_S)
