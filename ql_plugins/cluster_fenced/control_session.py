"""The worker's side of the control database: its one connection, its session and its numbers.

Only the control loop thread calls :meth:`ControlSession.call` (every call capped by
``control_call_timeout_s``); the flags here are what the worker's parts tell each other about the
session (registered fence, claiming paused, taken over, draining), with the process's own signals
(``stop`` asked, ``done``, ``wake`` the control loop).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

from ql_core import metrics
from ql_core.clock import now_ms

from .control_db import ControlDB

if TYPE_CHECKING:
    from .outbox import DbClock
    from .results import WorkerFence
    from .settings import ClusterSettings

__all__ = ["ControlSession"]


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

    def db(self) -> ControlDB:
        if self._db is None:
            self._db = ControlDB.connect(self.control_url, lazy=True,
                                         connect_timeout_s=max(2, int(self.call_timeout_s + 0.999)),
                                         statement_timeout_ms=int(max(1.0, self.call_timeout_s) * 1000),
                                         call_timeout_s=self.call_timeout_s)
        return self._db

    def call(self, fn: Callable[[ControlDB], Any]) -> tuple[Any, float]:
        """One control call; measures the database clock. Returns (result, monotonic send time)."""
        sent_mono, sent_wall = time.monotonic(), now_ms()
        result = fn(self.db())
        probe = result[0] if isinstance(result, list) and result else result  # a batch: its first answer
        self.clock.observe(sent_wall, now_ms(), getattr(probe, "db_now_ms", None))
        return result, sent_mono

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n
        metrics.count(key, n)  # a no-op unless --metrics-listen (ql_core.metrics)

    def live_fence(self) -> WorkerFence | None:
        """The fence that proves this session (to the artifact store): None once taken over."""
        return None if self.taken_over else self.worker
