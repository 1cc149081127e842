"""The attempts one ``ql worker`` holds (or held): in memory, mirrored in ``ql_worker_lease``.

Shared by every thread of the worker under one lock (:attr:`HeldAttempts.lock`); the outbox's retry
times live here too, since forgetting an attempt drops both.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ql_core.submit import Submission

    from .results import LeaseFence
    from .worker_tables import WorkerLeases

__all__ = ["Held", "HeldAttempts", "LIVE", "PROCESS"]

#: Held-attempt steps. ``claimed``: claim answered; ``started``: ``start`` answered ok (spawn allowed);
#: ``launching``: runner is spawning; ``spawned``: handle stored locally; ``running``: control knows.
LIVE = ("claimed", "started", "launching", "spawned", "running")
#: The steps in which a process may exist.
PROCESS = ("launching", "spawned", "running")


@dataclass(eq=False)
class Held:
    """One attempt whose lease this worker holds (or held)."""

    fence: LeaseFence
    run_id: str
    log_id: str = ""
    #: The attempt's sealed spec (sealing.SealedCopy) until the runner opens it; never logged.
    spec: Any = field(default=None, repr=False)
    timeout_ms: int | None = None
    state: str = "claimed"
    #: Monotonic: past this the worker fences itself (renew sent + TTL − margin).
    own_deadline: float = 0.0
    renew_due: float = 0.0
    #: Monotonic time of the last answer that extended the lease (its latest possible expiry + TTL).
    last_ok: float = 0.0
    start_retry: float = 0.0
    deadline_mono: float | None = None
    intent: str | None = None
    sub: Submission | None = field(default=None, repr=False)
    stop_reason: str | None = None
    kill_due: float | None = None
    #: The attempt ended locally (its process is gone; its outbox row exists).
    ended: bool = False
    #: The attempt of a previous process (adopted on restart): never renewed, only stopped.
    previous: bool = False

    @property
    def attempt_id(self) -> str:
        return self.fence.attempt_id


class HeldAttempts:
    """The held attempts by attempt id, their lock, and the outbox's next try per attempt."""

    def __init__(self, leases: WorkerLeases) -> None:
        self.leases = leases
        self.lock = threading.RLock()
        self._by_id: dict[str, Held] = {}
        #: Monotonic time before which an attempt's outbox row is not submitted again.
        self.outbox_next: dict[str, float] = {}

    def get(self, attempt_id: str) -> Held | None:
        with self.lock:
            return self._by_id.get(attempt_id)

    def add(self, held: Held) -> None:
        with self.lock:
            self._by_id[held.attempt_id] = held

    def drop(self, attempt_id: str) -> None:
        with self.lock:
            self._by_id.pop(attempt_id, None)

    def select(self, keep: Callable[[Held], bool] = lambda held: True) -> list[Held]:
        """A snapshot of the held attempts ``keep`` accepts."""
        with self.lock:
            return [held for held in self._by_id.values() if keep(held)]

    def live_processes(self) -> int:
        """Attempts that occupy a slot: not ended locally, claimed up to running."""
        with self.lock:
            return sum(1 for h in self._by_id.values() if not h.ended and h.state in LIVE)

    def forget(self, held: Held, answer: str) -> None:
        """A final answer for an attempt that never ran here: its row is answered, nothing is held."""
        self.leases.mark_answered(held.attempt_id, answer)
        self.drop(held.attempt_id)
        self.outbox_next.pop(held.attempt_id, None)
