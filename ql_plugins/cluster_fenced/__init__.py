"""cluster-fenced: PostgreSQL as the control plane of many ql workers (DESIGN.md §9).

This package currently holds the control-plane database layer: the typed client
(:mod:`.control_db`) of the fenced PL/pgSQL operations that schema revision
``0003_cluster_control`` creates, and its result types (:mod:`.results`). See
``docs/cluster-control-db.md``. Importing it imports neither psycopg nor its client modules: the
re-exported names load on first use.
"""

from __future__ import annotations

#: Re-exported name -> the module that defines it, imported on first use (PEP 562): the plugin
#: module is imported for every `ql --help`, which must not pay for the database client.
_LAZY = {
    "MAX_CLAIM": "control_db",
    "SCHEMA_REVISION": "control_db",
    "SWEEP_HARD_CAP": "control_db",
    "SWEEP_PAGE": "control_db",
    "ControlDB": "control_db",
    "ControlDBError": "control_db",
    "MissingDriverError": "control_db",
    "TransientError": "control_db",
    "with_retries": "control_db",
    "CancelAnswer": "results",
    "CancelResult": "results",
    "ClaimedAttempt": "results",
    "ClaimResult": "results",
    "CompletionAnswer": "results",
    "CompletionResult": "results",
    "EndAnswer": "results",
    "EndResult": "results",
    "EndStatus": "results",
    "HeartbeatResult": "results",
    "Intents": "results",
    "LeaseAnswer": "results",
    "LeaseFence": "results",
    "LeaseResult": "results",
    "Outcome": "results",
    "Registration": "results",
    "SubmitAnswer": "results",
    "SubmitResult": "results",
    "SweepCounts": "results",
    "WorkerFence": "results",
    "completion_digest": "results",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
