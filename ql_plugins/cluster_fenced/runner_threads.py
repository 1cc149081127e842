"""The worker's runner threads, kept for the next attempt instead of one new thread per attempt.

A runner thread (:meth:`.runner.Runner.run_attempt`) mirrors its attempt into the local store,
spawns it and waits for it. The local store keeps one SQLite connection per thread
(``edge_sqlite.connection``): a thread per attempt opened a new connection for every task (the
open, the WAL and durability pragmas, a cold statement cache: every statement compiled again) and
closed it when the thread ended — CPU the embedded host, whose threads live on, never spends.
Here a runner thread that finished its attempt waits :data:`IDLE_S` for the next one, so its
connection (and its compiled statements) serve attempt after attempt; past that it ends, and with
it its connection, as before.

Nothing of an attempt outlives it in the thread: each attempt gets everything from its ``Held``,
and the thread's name follows the attempt it runs (``ql-attempt-<id tail>``, ``ql-attempt-idle``).
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Callable

from ql_core.log import logger

if TYPE_CHECKING:
    from .held_attempts import Held

__all__ = ["RunnerThreads", "IDLE_S"]

#: How long an idle runner thread waits for another attempt before it ends (and closes its connection).
IDLE_S = 30.0


class RunnerThreads:
    """Runs ``target(held)`` in an idle runner thread, or in a new one when none is idle."""

    def __init__(self, target: Callable[[Held], None], *, idle_s: float = IDLE_S) -> None:
        self._target = target
        self._idle_s = idle_s
        self._queue: queue.SimpleQueue[Held | None] = queue.SimpleQueue()
        # Guards ``_idle``: an attempt is queued only for a thread counted idle, and a thread stops
        # being counted (and ends) only when it finds nothing queued under the same lock — so an
        # attempt is never queued for a thread that has gone.
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, held: Held) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._queue.put(held)
                return
        thread = threading.Thread(target=self._serve, args=(held,), name=_name(held), daemon=True)
        thread.start()

    def stop(self) -> None:
        """End the idle threads now (the worker exits): their connections close with them. A
        thread still running its attempt ends after it, at the latest :data:`IDLE_S` later."""
        with self._lock:
            n, self._idle = self._idle, 0
            for _ in range(n):
                self._queue.put(None)

    def idle(self) -> int:
        """How many runner threads wait for an attempt now (diagnostics, tests)."""
        with self._lock:
            return self._idle

    def _serve(self, held: Held | None) -> None:
        me = threading.current_thread()
        while held is not None:
            me.name = _name(held)
            try:
                self._target(held)
            except Exception as exc:  # noqa: BLE001 - as a thread of its own would have: logged, then the next one
                logger.error("runner of attempt {} failed: {}", held.attempt_id, type(exc).__name__)
            del held  # nothing of this attempt is kept while the thread waits
            me.name = "ql-attempt-idle"
            held = self._next()

    def _next(self) -> Held | None:
        with self._lock:
            self._idle += 1
        try:
            return self._queue.get(timeout=self._idle_s)
        except queue.Empty:
            with self._lock:
                try:
                    return self._queue.get_nowait()  # queued for us as the wait ended (counted already)
                except queue.Empty:
                    self._idle -= 1
                    return None


def _name(held: Held) -> str:
    return f"ql-attempt-{held.attempt_id[-6:]}"
