"""Standby launchers: compiled launchers started before their run exists (docs/launcher.md).

A standby is ``ql-launcher --standby``: a new session, nothing of any run in its argv, environment
or memory, waiting on a private socket for the one message that hands it a run and lets it start
(:func:`~.launch.standby_message`). Because it exists first, its identity — the durable handle —
is known before the run's create commit, which records it: a task's command then starts after one
durable commit instead of two, and the launcher's start is off the submit path entirely once a
host keeps one ready.

What if the host dies at any point? An idle standby exits 125 without running anything (its group
is its own, and it is nobody's task): it reads EOF, or — when a child the host forked through libc
(no ``os.register_at_fork`` hook ran there) still holds a copy of the host's end — sees its owner
die: it checks once a second that the process that created its socket pair is still its parent
(launcher.c ``wait_for_message``, docs/launcher.md). One whose handle is committed but that
never got its run does the same, and recovery finds its process gone without a receipt: ``lost``,
and nothing ran. Once handed its run it is an ordinary launcher: the receipt decides.

The pool keeps at most one idle standby per executor, refilled after a hand-over from the second
task on (a one-shot ``ql run`` never leaves an unused launcher behind) — from then on by a fork of
the executor's standby factory rather than a new exec (:mod:`.factory`) — and discards it (SIGKILL:
it holds nothing) with the runtime, when the executor is collected, or at interpreter exit. A
standby is used only by the process that started it (a forked host's child drops its copy of the
channel and starts its own) and only while it is provably alive, idle and not stopped. A signal
ends an idle standby (launcher.c): it is then found dead and replaced, never handed a run.
"""

from __future__ import annotations

import signal
import socket
import threading
import weakref
from collections.abc import Callable

from ql_core.log import logger

from .child import Child, forget_after_fork
from .identity import ProcessHandle

__all__ = ["Standby", "StandbyPool"]

#: How long discarding an idle standby waits for it to die of SIGKILL (it holds nothing of a run).
DISCARD_WAIT_S = 5.0


class Standby:
    """One idle standby launcher: its process (followed by a pidfd), our end of its channel, its
    identity (the durable handle is encoded from it, stamped, when a run takes it: one encoding per
    task, no parse of an encoded one), and the largest message the channel takes."""

    __slots__ = ("__weakref__", "capacity", "channel", "child", "handle")

    def __init__(self, child: Child, channel: socket.socket, handle: ProcessHandle | None, capacity: int) -> None:
        self.child = child
        self.channel = channel
        self.handle = handle
        self.capacity = capacity

    def idle_and_alive(self) -> bool:
        """Ours (not inherited across a fork), alive, and not stopped: it would take a run now."""
        return self.child.alive() and not self.child.stopped()  # alive() is False for a fork's copy

    def discard(self) -> None:
        """Close our end and end it: an idle standby holds nothing of any run, so it is killed
        outright (a stopped one would never read the EOF) and reaped. A fork's copy only lets go."""
        self.channel.close()
        if not self.child.ours:
            self.child.close()
            return
        self.child.signal_group(signal.SIGKILL)
        if self.child.wait(DISCARD_WAIT_S) is None:
            logger.warning("a discarded standby launcher (pid {}) did not exit; it is left to the system",
                           self.child.pid)
            self.child.close()


def _discard_quietly(standby: Standby | None) -> None:
    if standby is not None:
        try:
            standby.discard()
        except OSError as exc:  # best effort at close
            logger.debug("closing a standby launcher failed: {}", type(exc).__name__)


class _Slot:
    """The one idle standby of a pool (a holder the finalizer can reach without the pool)."""

    __slots__ = ("__weakref__", "ready")

    def __init__(self) -> None:
        self.ready: Standby | None = None
        forget_after_fork(self)

    def close(self) -> None:
        ready, self.ready = self.ready, None
        _discard_quietly(ready)

    def forget_after_fork(self) -> None:
        """In a forked child: the standby is the parent's; drop our copy of its channel."""
        ready, self.ready = self.ready, None
        if ready is not None:
            ready.channel.close()


class StandbyPool:
    """At most one idle standby, taken by :meth:`take`, kept ready by :meth:`handed_over`."""

    def __init__(self, spawn: Callable[..., Standby]) -> None:
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

    def give_back(self, standby: Standby) -> None:
        """A standby taken but not used (it had nothing of a run): ready again, or discarded."""
        self._keep(standby)

    def _keep(self, standby: Standby) -> None:
        """Make ``standby`` the ready one; discard it when another is ready already."""
        spare: Standby | None = standby
        with self._lock:
            if self._slot.ready is None:
                self._slot.ready, spare = standby, None
        _discard_quietly(spare)

    def handed_over(self) -> None:
        """A standby got its run: from the second on, keep the next one ready (off the submit path;
        ``ahead=True`` lets the executor start its factory for it)."""
        with self._lock:
            self._handed += 1
            if self._handed < 2 or self._slot.ready is not None:
                return
        try:
            fresh = self._spawn(ahead=True)
        except Exception as exc:  # noqa: BLE001 - the next submit spawns one itself, or falls back
            logger.debug("no standby launcher kept ready: {}", type(exc).__name__)
            return
        self._keep(fresh)

    def close(self) -> None:
        """Discard the idle standby (idempotent; the pool may be used again afterwards)."""
        with self._lock:
            ready, self._slot.ready = self._slot.ready, None
        _discard_quietly(ready)
