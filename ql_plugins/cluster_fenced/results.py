"""Typed answers of the control-plane functions (docs/cluster-control-db.md).

Everything here is a frozen dataclass or a string enum and imports nothing heavy: a worker's
outbox can persist :class:`LeaseFence` and compare :class:`CompletionAnswer` values without
psycopg. Secrets (the lease token, the run's spec) are excluded from ``repr`` so they never reach a
log line or a traceback by accident.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CompletionAnswer",
    "LeaseAnswer",
    "EndAnswer",
    "EndStatus",
    "CancelAnswer",
    "SubmitAnswer",
    "WorkerFence",
    "LeaseFence",
    "Registration",
    "HeartbeatResult",
    "ClaimedAttempt",
    "ClaimResult",
    "Intents",
    "LeaseResult",
    "CompletionResult",
    "EndResult",
    "CancelResult",
    "SubmitResult",
    "SweepCounts",
    "Outcome",
    "completion_digest",
]


class CompletionAnswer(enum.StrEnum):
    """The answer of :meth:`ControlDB.complete`. All four are final: the worker deletes its
    receipt/outbox row after any of them and retries only on a transient error."""

    #: The terminal transition committed now (this call).
    APPLIED = "applied"
    #: An exact replay (same completion digest) of the completion that was applied before, e.g.
    #: after the response to the applying COMMIT was lost.
    ALREADY_COMPLETED = "already_completed"
    #: This lease holder ended the attempt before with another payload (or without a receipt).
    ALREADY_TERMINAL = "already_terminal"
    #: Not the lease holder any more (or never): nothing changed; an audit event was recorded.
    FENCED = "fenced"


class LeaseAnswer(enum.StrEnum):
    """Answer of heartbeat, start, running and renew."""

    OK = "ok"
    #: The caller's fence is stale or its lease expired: stop acting for it (self-fence).
    FENCED = "fenced"


class EndAnswer(enum.StrEnum):
    """Answer of :meth:`ControlDB.end_without_completion` (final, like a completion's)."""

    APPLIED = "applied"
    #: A replay of the same end (after a lost response).
    ALREADY_ENDED = "already_ended"
    #: The holder ended the attempt differently before (e.g. a completion was applied).
    ALREADY_TERMINAL = "already_terminal"
    FENCED = "fenced"
    #: Not allowed in the lease's state: releasing a running attempt, losing a never-started one.
    REFUSED = "refused"


class EndStatus(enum.StrEnum):
    """What :meth:`ControlDB.end_without_completion` asserts."""

    #: The task provably exited and no receipt exists.
    LOST = "lost"
    #: The attempt was never spawned: hand it back to the queue (drain).
    RELEASED = "released"


class CancelAnswer(enum.StrEnum):
    #: Intent committed; the lease holder learns it on its next renew.
    REQUESTED = "requested"
    #: Nothing was running (queued, or its lease was still ``claimed``): the run ended at once.
    CANCELLED = "cancelled"
    ALREADY_REQUESTED = "already_requested"
    ALREADY_TERMINAL = "already_terminal"
    NOT_FOUND = "not_found"


class SubmitAnswer(enum.StrEnum):
    CREATED = "created"
    #: A run with this id exists already (a replayed submit): nothing changed.
    EXISTS = "exists"


@dataclass(frozen=True, slots=True)
class WorkerFence:
    """Who a worker process is: its id, the generation ``register`` gave it and its session."""

    worker_id: str
    generation: int
    session: str


@dataclass(frozen=True, slots=True)
class LeaseFence:
    """Everything a per-attempt call presents; the worker persists it before spawning."""

    worker_id: str
    worker_generation: int
    session: str
    attempt_id: str
    lease_generation: int
    lease_token: str = field(repr=False)

    def params(self) -> tuple[str, int, str, str, int, str]:
        return (self.worker_id, self.worker_generation, self.session, self.attempt_id,
                self.lease_generation, self.lease_token)


@dataclass(frozen=True, slots=True)
class Registration:
    worker: WorkerFence
    lease_expires_at_ms: int
    db_now_ms: int


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    answer: LeaseAnswer
    lease_expires_at_ms: int | None
    db_now_ms: int


@dataclass(frozen=True, slots=True)
class ClaimedAttempt:
    """One claimed run. ``lease_token`` exists only here (the database keeps its digest)."""

    run_id: str
    attempt_id: str
    attempt_no: int
    lease_generation: int
    lease_token: str = field(repr=False)
    #: The run's task spec for THIS attempt, sealed (sealing.SealedCopy; None: the database had no
    #: copy for it). Opened only by the worker, in memory, right before the spawn; never logged.
    sealed_spec: Any = field(repr=False, default=None)
    timeout_ms: int | None = None
    lease_expires_at_ms: int = 0
    db_now_ms: int = 0

    def fence(self, worker: WorkerFence) -> LeaseFence:
        return LeaseFence(worker.worker_id, worker.generation, worker.session, self.attempt_id,
                          self.lease_generation, self.lease_token)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    #: ``FENCED``: the worker's generation/session is stale or its session lease expired.
    answer: LeaseAnswer
    attempts: tuple[ClaimedAttempt, ...]
    db_now_ms: int | None


@dataclass(frozen=True, slots=True)
class Intents:
    """The run's committed intents as the lease holder must know them."""

    cancel_reason: str | None = None
    cancel_requested_at_ms: int | None = None
    deadline_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class LeaseResult:
    answer: LeaseAnswer
    #: Why it is fenced (e.g. ``LEASE_EXPIRED``, ``STALE_WORKER_GENERATION``); None when ok.
    reason: str | None
    lease_expires_at_ms: int | None
    db_now_ms: int
    intents: Intents


@dataclass(frozen=True, slots=True)
class CompletionResult:
    answer: CompletionAnswer
    #: The attempt's terminal status (applied / already_*), None when fenced.
    status: str | None
    reason: str | None
    fence_reason: str | None
    db_now_ms: int


@dataclass(frozen=True, slots=True)
class EndResult:
    answer: EndAnswer
    #: ``requeued`` or the run's terminal status (applied / replays).
    outcome: str | None
    fence_reason: str | None
    db_now_ms: int


@dataclass(frozen=True, slots=True)
class CancelResult:
    answer: CancelAnswer
    status: str | None
    db_now_ms: int


@dataclass(frozen=True, slots=True)
class SubmitResult:
    answer: SubmitAnswer
    created_at_ms: int
    db_now_ms: int


@dataclass(frozen=True, slots=True)
class SweepCounts:
    #: (a) expired claimed leases: runs back to the queue.
    requeued: int
    #: (b) expired started leases that ended their run ``lost``.
    lost: int
    #: (b) expired started leases whose run was queued again (retry policy).
    retried: int
    #: (c) timeout intents committed.
    timeouts: int
    #: (d) retention.
    leases_deleted: int
    specs_deleted: int
    #: Candidates left for a later round because another transaction held their run.
    skipped: int
    db_now_ms: int

    @property
    def acted(self) -> int:
        return self.requeued + self.lost + self.retried + self.timeouts


@dataclass(frozen=True, slots=True)
class Outcome:
    """``ql_map_outcome``: the terminal status, its reason, and whether a cancel intent was moot."""

    status: str
    reason: str | None
    moot: bool


def completion_digest(attempt_id: str, *, exit_code: int, started_at_ms: int | None, finished_at_ms: int,
                      signalled: bool) -> str:
    """SHA-256 (hex) of every field a completion submits: the key of exact-replay detection.

    Compute it once from the receipt and persist it in the outbox row, so that a replay sends the
    same digest (``already_completed``) and any other payload is recognised as different.
    """
    payload = json.dumps({"attempt_id": attempt_id, "exit_code": exit_code, "started_at_ms": started_at_ms,
                          "finished_at_ms": finished_at_ms, "signalled": bool(signalled)},
                         sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("ascii")).hexdigest()
