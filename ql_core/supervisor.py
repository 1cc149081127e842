"""The supervisor: reconciliation rounds on a timer, with the lifecycle rules of DESIGN.md §2.

- explicit :meth:`Supervisor.start` / :meth:`Supervisor.stop`;
- a daemon thread: it never keeps the interpreter alive;
- no overlap: the next round is scheduled only after the previous one ended,
  and :meth:`Supervisor.run_round` (the caller's thread) shares one lock with
  the loop, so two rounds never run at once;
- each round is bounded by the profile (pages × page size) and resumes from
  the reconciler's cursors;
- :meth:`stop` asks the loop to finish its current round and waits at most
  ``stop_drain_s``; it reports whether the loop really ended;
- a round whose retention stopped at ``retention_budget_ms`` with work left
  (``retention_more``) is followed by the next one after a pause of that length
  instead of the full interval, so retention keeps up with any task rate the
  host can sustain (docs/recovery.md "History retention");
- :meth:`wake` starts the next round early (a best-effort wake-up source such
  as watchfiles calls it); it never replaces the periodic round.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from . import metrics
from .log import logger
from .reconciler import CursorStuckError, Reconciler, RoundReport

if TYPE_CHECKING:
    from .node import Node

__all__ = ["Supervisor"]


class Supervisor:
    """Periodic, non-overlapping, bounded reconciliation for one node."""

    def __init__(self, node: Node, *, interval_s: float | None = None,
                 on_round: Callable[[RoundReport], None] | None = None) -> None:
        self.profile = node.profile
        self.reconciler = Reconciler(node)
        self.interval_s = node.profile.scan_interval_s if interval_s is None else interval_s
        if not self.interval_s > 0:
            raise ValueError("the supervisor's interval must be positive")
        self.on_round = on_round
        self._wake = threading.Event()
        self._lifecycle = threading.Lock()
        #: The stop flag of the *current* loop thread (each start() gets a fresh one, so a
        #: loop still draining after a timed-out stop() can never be revived by accident).
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_round = threading.Lock()
        self.rounds = 0
        self.failures = 0
        self.last_error: str | None = None

    @property
    def running(self) -> bool:
        """True while a loop thread is alive and has not been asked to stop."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        """Start the loop (idempotent). The first round runs at once: it is the startup reconciliation."""
        with self._lifecycle:
            if self.running:
                return
            # A previous loop that is still finishing its round keeps its own (set) stop flag
            # and exits after that round; rounds never overlap thanks to the round lock.
            self._stop = threading.Event()
            self._wake.clear()
            self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="ql-supervisor",
                                            daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Run the next round now instead of at the end of the interval."""
        self._wake.set()

    def stop(self, drain_s: float | None = None) -> bool:
        """Stop after the current round; wait at most ``drain_s``. True if the loop has ended."""
        with self._lifecycle:
            self._stop.set()
            self._wake.set()
            thread = self._thread
        if thread is None:
            return True
        if thread is not threading.current_thread():
            thread.join(self.profile.stop_drain_s if drain_s is None else max(0.0, drain_s))
        return not thread.is_alive()

    def run_round(self) -> RoundReport:
        """One round now, in the caller's thread, never concurrently with the loop's."""
        with self._in_round:
            with metrics.round_scope() as scope:  # duration and counts for --metrics-listen (no-op when off)
                report = self.reconciler.round()
            metrics.observe_round(scope, report)
            self.rounds += 1
        if self.on_round is not None:
            self.on_round(report)
        return report

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            # A wake() that arrives during the round below is kept and shortens the next wait.
            self._wake.clear()
            backlog = False
            try:
                backlog = bool(self.run_round().counts.get("retention_more"))
            except CursorStuckError as exc:
                self.failures += 1
                self.last_error = type(exc).__name__
                logger.error("supervisor round stopped (fail closed): {}", exc)
                self.reconciler.attempt_cursor = self.reconciler.journal_cursor = ""
            except Exception as exc:  # noqa: BLE001 - a bad round must not kill the loop
                self.failures += 1
                self.last_error = type(exc).__name__
                logger.warning("supervisor round failed: {}", type(exc).__name__)
            if stop.is_set():
                break
            # Next round only after this one ended; the wait is interruptible by stop()/wake().
            remaining = self.interval_s - (time.monotonic() - started)
            if backlog:
                # Retention stopped at its budget with work left: the next round after a pause as long
                # as the budget, so a backlog drains at up to half of one core, never more.
                remaining = min(remaining, self.profile.retention_budget_ms / 1000)
            if remaining > 0:
                self._wake.wait(remaining)
