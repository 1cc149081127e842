"""The **lease keeper** thread of ``ql worker``: heartbeats and lease renewals on their own connection.

A worker's leases are its authority to run: they must never wait behind its other work. The
control loop's calls — claims, starts, ``running`` reports, outbox submissions, the drain
announcement — each take up to ``control_call_timeout_s`` on a slow database, and the loop touches
the local store between them; on a busy machine (every slot running a CPU-bound task, more burners
beside it) a renewal queued behind them could come too late and the worker would fence its own
tasks. So the keeper has its own thread and its own control connection
(:meth:`~.control_session.ControlSession.lease_call`) and does only this: the worker session's
heartbeat and the held attempts' renewals (:meth:`~.fence_guard.FenceGuard.renew`), each when due.

Every lease call's latency is measured (a bounded window); a renewal slower than half the fence
margin is logged (at most once a minute) naming the setting to raise, the renewal schedule keeps two
such latencies of headroom before the own deadline (:meth:`~.fence_guard.FenceGuard.next_renew`),
and the worker logs the window's percentiles when it stops.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ql_core.log import logger

from .control_db import TransientError
from .fence_guard import IDLE_S
from .results import LeaseAnswer

if TYPE_CHECKING:
    from .control_session import ControlSession
    from .fence_guard import FenceGuard

__all__ = ["LeaseKeeper"]

#: Seconds between two "a renewal was slow" warnings at most.
_SLOW_WARN_EVERY_S = 60.0


class LeaseKeeper:
    """Heartbeat and renewals, when due, on the session's lease connection (its own thread)."""

    def __init__(self, session: ControlSession, guard: FenceGuard) -> None:
        self.session = session
        self.guard = guard
        #: Set by :meth:`stop` (before the worker deregisters: no heartbeat may follow it).
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_at = -_SLOW_WARN_EVERY_S

    def start(self) -> None:
        """Connect (here, before the control loop claims: no renewal pays for a connect), then run."""
        self.session.connect_lease()
        self._thread = threading.Thread(target=self.run, name="ql-worker-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread (a call in flight ends within its call timeout)."""
        self.stopped.set()
        self.guard.renew_wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.session.call_timeout_s * 2 + 5.0)

    def run(self) -> None:
        session = self.session
        while not self.stopped.is_set() and not session.done.is_set():
            try:
                self.heartbeat()
                if not self.stopped.is_set():
                    self.guard.renew()
            except Exception as exc:  # noqa: BLE001 - the keeper must go on; the guard fences if it cannot
                logger.error("lease round failed ({}); retried in 0.2s", type(exc).__name__)
                self.stopped.wait(0.2)
            self._warn_if_slow()
            self._sleep()

    def _sleep(self) -> None:
        now = time.monotonic()
        due = [self.session.heartbeat_due, *self.guard.renewals_due()]
        timeout = max(0.0, min(min(due) - now, IDLE_S))
        if timeout > 0:
            self.guard.renew_wake.wait(timeout)
        self.guard.renew_wake.clear()

    def heartbeat(self) -> None:
        """Renew the worker session's lease when due; another process holding it fences everything."""
        session = self.session
        worker = session.worker
        if worker is None or session.taken_over or time.monotonic() < session.heartbeat_due:
            return
        ttl_ms = int(session.profile.session_lease_s * 1000)
        try:
            res, sent = session.lease_call(lambda db: db.heartbeat(worker, ttl_ms=ttl_ms))
        except TransientError:
            session.heartbeat_due = time.monotonic() + 1.0
            return
        if res.answer is LeaseAnswer.OK:
            session.heartbeat_due = sent + session.profile.heartbeat_interval_s
            if session.claim_paused:
                logger.info("worker session confirmed: claiming again")
            session.claim_paused = False
            return
        if self.stopped.is_set():
            return  # deregistering: the answer is about the session we are ending
        # Another process registered this worker id: every lease of ours is fenced.
        logger.error("worker id {} was registered by another process: fencing every attempt", session.worker_id)
        session.taken_over = True
        for held in self.guard.held.select():
            self.guard.self_fence(held, by_database=True)
        session.wake.set()

    def _warn_if_slow(self) -> None:
        session = self.session
        slowest = session.take_slowest_lease_call_s()
        now = time.monotonic()
        if slowest > session.margin_s / 2 and now - self._warned_at >= _SLOW_WARN_EVERY_S:
            self._warned_at = now
            logger.warning("a lease call took {:.2f}s, more than half the fence margin ({:g}s): the machine or the "
                           "control database is slow; raise fence_margin_s and run_lease_s in "
                           "[plugin.cluster-fenced] if the worker fences its own tasks", slowest, session.margin_s)
