"""What the worker's parts use of the cluster-worker run store (:class:`~.worker_store.WorkerJournal`).

A protocol, so that the parts (and :class:`~.worker.Worker`) name what they use without importing
the store that builds them (``WorkerJournal.run_worker`` imports the worker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from .outbox import DbClock, Payload
    from .settings import ClusterSettings
    from .worker_tables import WorkerLeases

__all__ = ["WorkerStore"]


class WorkerStore(Protocol):
    """The local lease table, the outbox writes and the worker's settings."""

    control_url: str
    settings: ClusterSettings
    profile: Any
    leases: WorkerLeases
    #: The database clock as this worker's calls measured it (outbox times are stated in it).
    clock: DbClock
    #: Called with the attempt id after an attempt went into the outbox.
    on_outbox: Callable[[str], None] | None

    def outbox_direct(self, attempt_id: str, payload: Payload) -> bool: ...

    def rebuild_outbox(self) -> int: ...
