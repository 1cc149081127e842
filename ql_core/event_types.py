"""Every event type ql can write into a run's history (``ql events``; docs/cli.md lists them).

The one list: ``tests/cli/test_cli_docs_drift.py`` fails when docs/cli.md's event table, or an event
type the code (core, the bundled plugins, the cluster's SQL functions) writes, drifts from it.
"""

from __future__ import annotations

__all__ = ["RUN_CREATED", "ATTEMPT_SPAWNED", "ATTEMPT_CLAIMED", "RUN_CANCEL_REQUESTED", "RUN_CANCEL_MOOT",
           "ATTEMPT_BLOCKED", "RUN_REQUEUED", "LOG_TRUNCATED", "ATTEMPT_LATE_CALLBACK_IGNORED",
           "ATTEMPT_RECEIPT_REJECTED", "ATTEMPT_OBSERVATION_LOST", "ATTEMPT_COMPLETION_FENCED",
           "ENDED_STATES", "OUTCOME_EVENT_TYPES", "EVENT_TYPES"]

RUN_CREATED = "run.created"
ATTEMPT_SPAWNED = "attempt.spawned"
#: Cluster: a worker claimed a queued run (its new attempt is ``starting``).
ATTEMPT_CLAIMED = "attempt.claimed"
RUN_CANCEL_REQUESTED = "run.cancel_requested"
RUN_CANCEL_MOOT = "run.cancel_moot"
ATTEMPT_BLOCKED = "attempt.blocked"
#: Cluster: a lost attempt of a run with retries left; the run is queued again.
RUN_REQUEUED = "run.requeued"
LOG_TRUNCATED = "log.truncated"
ATTEMPT_LATE_CALLBACK_IGNORED = "attempt.late_callback_ignored"
ATTEMPT_RECEIPT_REJECTED = "attempt.receipt_rejected"
ATTEMPT_OBSERVATION_LOST = "attempt.observation_lost"
#: Cluster: a completion from a worker that no longer holds the lease (audited, not applied).
ATTEMPT_COMPLETION_FENCED = "attempt.completion_fenced"

#: The states a run or an attempt ends in: each has an ``attempt.<state>`` and a ``run.<state>`` event.
ENDED_STATES = ("succeeded", "failed", "cancelled", "timed_out", "lost")  # = ql_core.states.RUN_TERMINAL
OUTCOME_EVENT_TYPES = tuple(f"{kind}.{state}" for state in ENDED_STATES for kind in ("attempt", "run"))

EVENT_TYPES: tuple[str, ...] = (
    RUN_CREATED, ATTEMPT_SPAWNED, ATTEMPT_CLAIMED, RUN_CANCEL_REQUESTED, RUN_CANCEL_MOOT,
    *OUTCOME_EVENT_TYPES, ATTEMPT_BLOCKED, RUN_REQUEUED, LOG_TRUNCATED, ATTEMPT_LATE_CALLBACK_IGNORED,
    ATTEMPT_RECEIPT_REJECTED, ATTEMPT_OBSERVATION_LOST, ATTEMPT_COMPLETION_FENCED,
)
