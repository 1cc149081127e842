"""Standby launchers: compiled launchers started before their run exists (docs/launcher.md).

A standby is ``ql-launcher --standby``: a new session, nothing of any run in its argv, environment
or memory, waiting on a private socket for the one message that hands it a run and lets it start
(:func:`~.launch.standby_message`). Because it exists first, its identity — the durable handle —
is known before the run's create commit, which records it: a task's command then starts after one
durable commit instead of two, and the launcher's start is off the submit path entirely once a
host keeps one ready.

What if the host dies at any point? An idle standby reads EOF and exits 125 without running
anything (its group is its own, and it is nobody's task). One whose handle is committed but that
never got its run does the same, and recovery finds its process gone without a receipt: ``lost``,
and nothing ran. Once handed its run it is an ordinary launcher: the receipt decides.

The pool keeps at most one idle standby per executor, refilled after a hand-over from the second
task on (a one-shot ``ql run`` never leaves an unused launcher behind), and closes it with the
runtime, when the executor is collected, or at interpreter exit. A standby is used only by the
process that started it (a forked host starts its own) and only while it is provably idle and alive.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import weakref
from collections.abc import Callable

from ql_core.log import logger

__all__ = ["Standby", "StandbyPool"]

#: How long closing an idle standby waits for it to read EOF and exit before it is killed.
CLOSE_WAIT_S = 1.0


class Standby:
    """One idle standby launcher: its process, our end of its channel, its handle."""

    __slots__ = ("channel", "handle", "owner", "process")

    def __init__(self, process: subprocess.Popen[bytes], channel: socket.socket, handle: str | None) -> None:
        self.process = process
        self.channel = channel
        self.handle = handle
        #: The process that started it (its parent): only that one may hand it a run or reap it.
        self.owner = os.getpid()

    def idle_and_alive(self) -> bool:
        """Ours, not exited, and its channel not at EOF (an idle standby never writes)."""
        if self.owner != os.getpid() or self.process.returncode is not None:
            return False
        try:
            pid, status = os.waitpid(self.process.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid != 0:  # gone before it was used (killed, say): reaped here, never used
            self.process.returncode = os.waitstatus_to_exitcode(status)
            return False
        poller = select.poll()
        poller.register(self.channel, select.POLLIN | select.POLLHUP)
        return not poller.poll(0)

    def discard(self) -> None:
        """Close our end (the standby reads EOF and exits 125 having run nothing), then reap it —
        killed if it does not exit at once. A forked copy only drops its descriptor."""
        self.channel.close()
        if self.owner != os.getpid() or self.process.returncode is not None:
            return
        try:
            self.process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # our unreaped child: its group is ours
            except ProcessLookupError:
                pass
            self.process.wait()


def _discard_quietly(standby: Standby | None) -> None:
    if standby is not None:
        try:
            standby.discard()
        except OSError as exc:  # best effort at close
            logger.debug("closing a standby launcher failed: {}", type(exc).__name__)


class _Slot:
    """The one idle standby of a pool (a holder the finalizer can reach without the pool)."""

    __slots__ = ("ready",)

    def __init__(self) -> None:
        self.ready: Standby | None = None

    def close(self) -> None:
        ready, self.ready = self.ready, None
        _discard_quietly(ready)


class StandbyPool:
    """At most one idle standby, taken by :meth:`take` and refilled by :meth:`refill`."""

    def __init__(self, spawn: Callable[[], Standby]) -> None:
        self._spawn = spawn
        self._lock = threading.Lock()
        self._slot = _Slot()
        self._handed = 0
        # Closed with the pool's owner (collected without close) and at interpreter exit.
        self._finalizer = weakref.finalize(self, _Slot.close, self._slot)

    def take(self) -> Standby:
        """An idle standby of this process: the ready one if it is still idle and alive, else a
        new one (``OSError``/``CompiledLauncherError`` from its spawn: none could be started)."""
        with self._lock:
            ready, self._slot.ready = self._slot.ready, None
        if ready is not None:
            if ready.idle_and_alive():
                return ready
            _discard_quietly(ready)
        return self._spawn()

    def handed_over(self) -> None:
        """A standby got its run: from the second on, keep the next one ready (off the submit path)."""
        with self._lock:
            self._handed += 1
            if self._handed < 2 or self._slot.ready is not None:
                return
        try:
            fresh = self._spawn()
        except Exception as exc:  # noqa: BLE001 - the next submit spawns one itself, or falls back
            logger.debug("no standby launcher kept ready: {}", type(exc).__name__)
            return
        with self._lock:
            if self._slot.ready is None:
                self._slot.ready, fresh = fresh, None
        _discard_quietly(fresh)

    def close(self) -> None:
        """Discard the idle standby (idempotent; the pool may be used again afterwards)."""
        with self._lock:
            ready, self._slot.ready = self._slot.ready, None
        _discard_quietly(ready)
