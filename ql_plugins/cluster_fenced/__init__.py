"""cluster-fenced: PostgreSQL as the control plane of many ql workers (DESIGN.md §9).

This package currently holds the control-plane database layer: the typed client
(:mod:`.control_db`) of the fenced PL/pgSQL operations that schema revision
``0003_cluster_control`` creates, and its result types (:mod:`.results`). See
``docs/cluster-control-db.md``. Importing it does not import psycopg.
"""

from __future__ import annotations

from .control_db import (
    MAX_CLAIM,
    SCHEMA_REVISION,
    SWEEP_HARD_CAP,
    SWEEP_PAGE,
    ControlDB,
    ControlDBError,
    MissingDriverError,
    TransientError,
    with_retries,
)
from .results import (
    CancelAnswer,
    CancelResult,
    ClaimedAttempt,
    ClaimResult,
    CompletionAnswer,
    CompletionResult,
    EndAnswer,
    EndResult,
    EndStatus,
    HeartbeatResult,
    Intents,
    LeaseAnswer,
    LeaseFence,
    LeaseResult,
    Outcome,
    Registration,
    SubmitAnswer,
    SubmitResult,
    SweepCounts,
    WorkerFence,
    completion_digest,
)

__all__ = [
    "ControlDB",
    "ControlDBError",
    "TransientError",
    "MissingDriverError",
    "with_retries",
    "SCHEMA_REVISION",
    "MAX_CLAIM",
    "SWEEP_PAGE",
    "SWEEP_HARD_CAP",
    "CancelAnswer",
    "CancelResult",
    "ClaimedAttempt",
    "ClaimResult",
    "CompletionAnswer",
    "CompletionResult",
    "EndAnswer",
    "EndResult",
    "EndStatus",
    "HeartbeatResult",
    "Intents",
    "LeaseAnswer",
    "LeaseFence",
    "LeaseResult",
    "Outcome",
    "Registration",
    "SubmitAnswer",
    "SubmitResult",
    "SweepCounts",
    "WorkerFence",
    "completion_digest",
]
