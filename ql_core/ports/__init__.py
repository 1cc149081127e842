"""The five plugin seams as typed protocols, and the types that cross them.

- :mod:`~ql_core.ports.executor` — start, inspect, signal and wait for tasks;
- :mod:`~ql_core.ports.receipt_store` — publish, read, remove, quarantine receipts;
- :mod:`~ql_core.ports.journal` — the run store (journal backend), in four parts: runs and events,
  the receipt journal, cancel dispatch, the log ledger;
- :mod:`~ql_core.ports.wakeup` — best-effort "something changed" notifications;
- :mod:`~ql_core.ports.artifact_store` — where a cluster worker ships a run's log, and readers read it;
- :mod:`~ql_core.ports.context` — what every plugin factory receives.

Each seam has a contract suite in :mod:`ql_core.testing`. Everything exported
here is public API (see ``docs/plugins.md`` for the stability promise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .artifact_store import ArtifactStore, ArtifactStoreError, ArtifactStoreUnavailable
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
        BatchTransitions,
        CancelDispatch,
        ConflictError,
        Decide,
        DispatchClaim,
        EventSpec,
        JournalBackend,
        LogLedger,
        QueuedRun,
        QueueingBackend,
        ReceiptJournal,
        RunJournal,
        Snapshot,
        StoreBusyError,
        StoreError,
        TaskSpec,
        Transition,
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

# Imported on first use (PEP 562): a reader that needs one protocol does not pay for all five.
_WHERE = {
    "ArtifactStore": "artifact_store",
    "ArtifactStoreError": "artifact_store",
    "ArtifactStoreUnavailable": "artifact_store",
    "RunEventInfo": "context",
    "RuntimeContext": "context",
    "MAX_HANDLE_BYTES": "executor",
    "Executor": "executor",
    "ExitObservation": "executor",
    "IdentityState": "executor",
    "SignalOutcome": "executor",
    "SpawnedTask": "executor",
    "SpawnRequest": "executor",
    "BatchTransitions": "journal",
    "CancelDispatch": "journal",
    "ConflictError": "journal",
    "Decide": "journal",
    "DispatchClaim": "journal",
    "EventSpec": "journal",
    "JournalBackend": "journal",
    "LogLedger": "journal",
    "QueuedRun": "journal",
    "QueueingBackend": "journal",
    "ReceiptJournal": "journal",
    "RunJournal": "journal",
    "Snapshot": "journal",
    "StoreBusyError": "journal",
    "StoreError": "journal",
    "TaskSpec": "journal",
    "Transition": "journal",
    "PublishOutcome": "receipt_store",
    "QuarantineConflictError": "receipt_store",
    "ReadStatus": "receipt_store",
    "ReceiptPublishError": "receipt_store",
    "ReceiptRead": "receipt_store",
    "ReceiptStore": "receipt_store",
    "ReceiptStoreError": "receipt_store",
    "UnsafePathError": "receipt_store",
    "ChangeKind": "wakeup",
    "OnChange": "wakeup",
    "WakeupSource": "wakeup",
    "WakeupWatch": "wakeup",
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ql_core.ports' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ArtifactStore",
    "ArtifactStoreError",
    "ArtifactStoreUnavailable",
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
    "RunJournal",
    "ReceiptJournal",
    "CancelDispatch",
    "LogLedger",
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
