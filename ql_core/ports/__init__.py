"""The four plugin seams as typed protocols, and the types that cross them.

- :mod:`~ql_core.ports.executor` — start, inspect, signal and wait for tasks;
- :mod:`~ql_core.ports.receipt_store` — publish, read, remove, quarantine receipts;
- :mod:`~ql_core.ports.journal` — the run store (journal backend);
- :mod:`~ql_core.ports.wakeup` — best-effort "something changed" notifications;
- :mod:`~ql_core.ports.context` — what every plugin factory receives.

Each seam has a contract suite in :mod:`ql_core.testing`. Everything exported
here is public API (see ``docs/plugins.md`` for the stability promise).
"""

from .context import RunEventInfo, RuntimeContext
from .executor import (
    MAX_HANDLE_BYTES,
    Executor,
    ExitObservation,
    IdentityState,
    SignalOutcome,
    SpawnedTask,
    SpawnRequest,
)
from .journal import (
    ConflictError,
    ControlService,
    Decide,
    DispatchClaim,
    EventSpec,
    JournalBackend,
    QueuedRun,
    QueueingBackend,
    Snapshot,
    StoreBusyError,
    StoreError,
    TaskSpec,
    Transition,
    WorkerService,
)
from .receipt_store import (
    PublishOutcome,
    QuarantineConflictError,
    ReadStatus,
    ReceiptPublishError,
    ReceiptRead,
    ReceiptStore,
    ReceiptStoreError,
    UnsafePathError,
)
from .wakeup import ChangeKind, OnChange, WakeupSource, WakeupWatch

__all__ = [
    "RuntimeContext",
    "RunEventInfo",
    "MAX_HANDLE_BYTES",
    "Executor",
    "ExitObservation",
    "IdentityState",
    "SignalOutcome",
    "SpawnRequest",
    "SpawnedTask",
    "JournalBackend",
    "Snapshot",
    "Transition",
    "Decide",
    "DispatchClaim",
    "EventSpec",
    "StoreError",
    "StoreBusyError",
    "ConflictError",
    "TaskSpec",
    "QueuedRun",
    "QueueingBackend",
    "WorkerService",
    "ControlService",
    "ReceiptStore",
    "ReceiptRead",
    "ReadStatus",
    "PublishOutcome",
    "ReceiptStoreError",
    "ReceiptPublishError",
    "QuarantineConflictError",
    "UnsafePathError",
    "WakeupSource",
    "WakeupWatch",
    "OnChange",
    "ChangeKind",
]
