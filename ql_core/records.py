"""Typed records of the run store: what a journal backend returns and what the views show.

Immutable named tuples, one per table row or read view, with the column
names of the declared schema (:mod:`ql_core.db.models`), so a store builds
one with ``Record(*row)``. (Tuples, not dataclasses: defining them costs a
fifth, and every ``ql status`` pays for it; and :class:`~ql_core.lean_tuple.LeanNamedTuple`,
not ``typing.NamedTuple``, which compiles a ``__new__`` per class.) They carry no behaviour beyond
small derived properties (and :func:`run_view`, a run row and its attempt rows as the view);
decisions live in :mod:`ql_core.outcome` and the
services. Nothing here holds a command, argv, environment, token or output: an
attempt carries only its token's hash.

No ``from __future__ import annotations`` here (a leftover of ``typing.NamedTuple``, which turned
each string annotation into a compiled ``ForwardRef``); the lean base evaluates none either way.
"""

from typing import Any, Sequence

from .lean_tuple import LeanNamedTuple
from .states import RUN_TERMINAL

__all__ = [
    "RunRecord",
    "AttemptRecord",
    "EventRecord",
    "JournalEntry",
    "DispatchRecord",
    "LogFacts",
    "NewRun",
    "NewDispatch",
    "AttemptView",
    "RunView",
    "run_view",
    "log_facts_of",
]


class RunRecord(LeanNamedTuple):
    id: str
    name: str | None
    status: str
    exit_code: int | None
    reason: str | None
    version: int
    event_seq: int
    current_attempt_id: str | None
    created_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None
    deadline_at_ms: int | None
    cancel_reason: str | None
    cancel_requested_at_ms: int | None

    @property
    def terminal(self) -> bool:
        return self.status in RUN_TERMINAL


class AttemptRecord(LeanNamedTuple):
    id: str
    run_id: str
    attempt_no: int
    executor: str
    runtime_owner: str
    status: str
    exit_code: int | None
    reason: str | None
    log_artifact_id: str
    callback_token_hash: str
    callback_sequence: int
    deadline_at_ms: int | None
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    handle: str | None
    host_handle: str | None
    version: int


class EventRecord(LeanNamedTuple):
    run_id: str
    seq: int
    type: str
    attempt_id: str | None
    status: str | None
    exit_code: int | None
    reason: str | None
    at_ms: int

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


class JournalEntry(LeanNamedTuple):
    """A receipt-journal row, with the status and owner of its attempt (None: attempt unknown)."""

    attempt_id: str
    run_id: str
    state: str
    receipt_ref: str
    quarantine_reason: str | None
    registered_at_ms: int
    updated_at_ms: int
    terminal_seen_at_ms: int | None
    attempt_status: str | None
    attempt_owner: str | None


class DispatchRecord(LeanNamedTuple):
    """A run's cancellation dispatch record (one per run, bound to one attempt)."""

    run_id: str
    attempt_id: str
    reason: str
    state: str
    outcome: str | None
    lease_owner: str | None
    lease_expires_at_ms: int | None
    version: int
    tries: int
    next_attempt_at_ms: int
    term_sent_at_ms: int | None
    kill_sent_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int


class LogFacts(LeanNamedTuple):
    """What the run store knows about one log artifact."""

    id: str
    run_id: str
    attempt_id: str
    max_bytes: int
    size_bytes: int | None
    truncated: bool
    created_at_ms: int
    deleted_at_ms: int | None

    @property
    def deleted(self) -> bool:
        return self.deleted_at_ms is not None


class NewRun(LeanNamedTuple):
    """Everything the *create* commit writes (run, first attempt, log artifact, journal row, event)."""

    run_id: str
    attempt_id: str
    log_artifact_id: str
    name: str | None
    executor: str
    runtime_owner: str
    callback_token_hash: str
    created_at_ms: int
    deadline_at_ms: int | None
    log_relative_path: str
    log_max_bytes: int
    receipt_ref: str
    host_handle: str | None = None


class NewDispatch(LeanNamedTuple):
    """The cancellation dispatch record a cancel intent creates (due at ``due_at_ms``)."""

    attempt_id: str
    reason: str
    due_at_ms: int


class AttemptView(LeanNamedTuple):
    """One attempt as ``ql status`` shows it: low-sensitivity facts only (no token, no handle)."""

    attempt_id: str
    attempt_no: int
    status: str
    exit_code: int | None
    reason: str | None
    executor: str
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    log_artifact_id: str

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


class RunView(LeanNamedTuple):
    """A run as ``ql status`` shows it, with its attempts in order (oldest first)."""

    run_id: str
    name: str | None
    status: str
    exit_code: int | None
    reason: str | None
    created_at_ms: int
    finished_at_ms: int | None
    deadline_at_ms: int | None
    cancel_reason: str | None
    attempts: tuple[AttemptView, ...]

    @property
    def terminal(self) -> bool:
        return self.status in RUN_TERMINAL

    @property
    def current_attempt(self) -> AttemptView | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def log_artifact_id(self) -> str | None:
        attempt = self.current_attempt
        return attempt.log_artifact_id if attempt is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "status": self.status, "exit_code": self.exit_code,
                "reason": self.reason, "created_at_ms": self.created_at_ms, "finished_at_ms": self.finished_at_ms,
                "deadline_at_ms": self.deadline_at_ms, "cancel_reason": self.cancel_reason,
                "attempts": [a.as_dict() for a in self.attempts]}


def run_view(run: RunRecord, attempts: list[AttemptRecord]) -> RunView:
    """The public view of a run row and its attempt rows (oldest attempt first)."""
    return RunView(
        run_id=run.id, name=run.name, status=run.status, exit_code=run.exit_code, reason=run.reason,
        created_at_ms=run.created_at_ms, finished_at_ms=run.finished_at_ms, deadline_at_ms=run.deadline_at_ms,
        cancel_reason=run.cancel_reason,
        attempts=tuple(AttemptView(attempt_id=a.id, attempt_no=a.attempt_no, status=a.status,
                                   exit_code=a.exit_code, reason=a.reason, executor=a.executor,
                                   created_at_ms=a.created_at_ms, started_at_ms=a.started_at_ms,
                                   finished_at_ms=a.finished_at_ms, log_artifact_id=a.log_artifact_id)
                       for a in attempts))


def log_facts_of(row: Sequence[Any]) -> LogFacts:
    """A log artifact row (``LOG_COLUMNS`` order) as :class:`~ql_core.records.LogFacts`."""
    lid, run_id, attempt_id, max_bytes, size, truncated, created, deleted = row
    return LogFacts(lid, run_id, attempt_id, max_bytes, size, bool(truncated), created, deleted)
