"""The worker's side of the control database: its connections, its session and its numbers.

Only the control loop thread calls :meth:`ControlSession.call`, and only the lease keeper
(:mod:`.lease_keeper`) calls :meth:`ControlSession.lease_call` — heartbeats and renewals on a
connection of their own, so they never wait behind the loop's calls. Every call is capped by
``control_call_timeout_s``; the lease calls' latencies are kept in a bounded window
(:data:`LATENCY_WINDOW`). The flags here are what the worker's parts tell each other about the
session (registered fence, claiming paused, taken over, draining), with the process's own signals
(``stop`` asked, ``done``, ``wake`` the control loop).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ql_core import metrics
from ql_core.clock import now_ms

from .control_db import ControlDB, TransientError

if TYPE_CHECKING:
    from .outbox import DbClock
    from .results import WorkerFence
    from .settings import ClusterSettings

__all__ = ["ControlSession", "LATENCY_WINDOW"]

#: The last this many lease calls' latencies are kept (percentiles at exit, the renewal headroom).
LATENCY_WINDOW = 2048


class ControlSession:
    """One worker process's control connection, lease numbers and session state."""

    def __init__(self, *, control_url: str, clock: DbClock, settings: ClusterSettings, profile: Any,
                 stop: threading.Event) -> None:
        from ql_core import __version__

        self.control_url = control_url
        self.clock = clock
        self.settings = settings
        self.profile = profile
        #: Set when the worker is asked to stop (it drains); ``done`` once it has; ``wake`` the control loop.
        self.stop = stop
        self.done = threading.Event()
        self.wake = threading.Event()
        self.version = __version__[:32]
        self.worker_id = settings.worker_id
        self.session = str(uuid.uuid4())
        #: The registered fence (None until the control plane answered ``register``).
        self.worker: WorkerFence | None = None
        self.ttl_s = float(profile.run_lease_s)
        self.ttl_ms = int(self.ttl_s * 1000)
        self.margin_s = float(profile.fence_margin_s)
        self.kill_grace_s = self.margin_s / 2
        self.call_timeout_s = min(float(profile.control_call_timeout_s), self.ttl_s / 3)
        self.claim_paused = False
        self.draining = False
        self.taken_over = False
        self.heartbeat_due = 0.0
        self.counts: dict[str, int] = {}
        self._db: ControlDB | None = None
        self._lease_db: ControlDB | None = None
        #: Seconds each of the last lease calls took (sent to answer or error), and the slowest
        #: since the keeper last looked.
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._slowest = 0.0
        self._latency_lock = threading.Lock()

    def _connect(self, *, lazy: bool = True) -> ControlDB:
        return ControlDB.connect(self.control_url, lazy=lazy,
                                 connect_timeout_s=max(2, int(self.call_timeout_s + 0.999)),
                                 statement_timeout_ms=int(max(1.0, self.call_timeout_s) * 1000),
                                 call_timeout_s=self.call_timeout_s)

    def db(self) -> ControlDB:
        if self._db is None:
            self._db = self._connect()
        return self._db

    def call(self, fn: Callable[[ControlDB], Any]) -> tuple[Any, float]:
        """One control call; measures the database clock. Returns (result, monotonic send time)."""
        sent_mono, sent_wall = time.monotonic(), now_ms()
        result = fn(self.db())
        probe = result[0] if isinstance(result, list) and result else result  # a batch: its first answer
        self.clock.observe(sent_wall, now_ms(), getattr(probe, "db_now_ms", None))
        return result, sent_mono

    def connect_lease(self) -> None:
        """Open the lease keeper's connection now, before anything is claimed, so that no renewal
        waits for a connect; a database that does not answer leaves it to the first lease call."""
        if self._lease_db is None:
            try:
                self._lease_db = self._connect(lazy=False)
            except TransientError:
                self._lease_db = None

    def lease_call(self, fn: Callable[[ControlDB], Any]) -> tuple[Any, float]:
        """:meth:`call` on the lease keeper's own connection, its latency measured."""
        if self._lease_db is None:
            self._lease_db = self._connect()
        sent_mono, sent_wall = time.monotonic(), now_ms()
        try:
            result = fn(self._lease_db)
        finally:
            took = time.monotonic() - sent_mono
            with self._latency_lock:
                self._latencies.append(took)
                self._slowest = max(self._slowest, took)
        probe = result[0] if isinstance(result, list) and result else result  # a batch: its first answer
        self.clock.observe(sent_wall, now_ms(), getattr(probe, "db_now_ms", None))
        return result, sent_mono

    def lease_latency_max_s(self) -> float:
        """The slowest lease call in the window (0 before the first)."""
        with self._latency_lock:
            return max(self._latencies, default=0.0)

    def take_slowest_lease_call_s(self) -> float:
        """The slowest lease call since the last time this was asked."""
        with self._latency_lock:
            slowest, self._slowest = self._slowest, 0.0
        return slowest

    def lease_latency_summary(self) -> dict[str, float | int]:
        """The window's lease-call latencies: count, p50, p99 and max in milliseconds."""
        with self._latency_lock:
            ordered = sorted(self._latencies)
        if not ordered:
            return {"calls": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}

        def at(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

        return {"calls": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 1)}

    def close(self) -> None:
        for db in (self._db, self._lease_db):
            if db is not None:
                db.close()

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n
        metrics.count(key, n)  # a no-op unless --metrics-listen (ql_core.metrics)

    def live_fence(self) -> WorkerFence | None:
        """The fence that proves this session (to the artifact store): None once taken over."""
        return None if self.taken_over else self.worker
