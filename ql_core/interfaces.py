"""The narrow interfaces between core and plugins.

Core owns the domain logic (states, completion, reconciliation); a plugin
provides one mechanism: an executor spawns and inspects processes, a receipt
store keeps receipt files, a journal backend indexes pending receipts.
Third-party implementations prove themselves with :mod:`ql_core.testing`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .config import Config
    from .receipts.codec import Receipt
    from .receipts.file_store import PublishOutcome, ReceiptRead

__all__ = [
    "RuntimeContext",
    "RunEventInfo",
    "IdentityState",
    "SignalOutcome",
    "SpawnRequest",
    "SpawnedTask",
    "Executor",
    "ReceiptStore",
    "JournalBackend",
]


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """What a plugin factory gets: the validated config and this node's stable id."""

    config: Config
    node_id: str

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir


@dataclass(frozen=True, slots=True)
class RunEventInfo:
    """A committed run event, reduced to low-sensitivity fields."""

    run_id: str
    seq: int
    type: str
    attempt_id: str | None = None
    status: str | None = None
    exit_code: int | None = None
    reason: str | None = None


class IdentityState(enum.StrEnum):
    """What a durable process handle says about the launched process."""

    RUNNING = "running"
    EXITED = "exited"
    UNVERIFIABLE = "unverifiable"


class SignalOutcome(enum.StrEnum):
    """The result of a verified signal to a task's process group."""

    SIGNALLED = "signalled"
    ALREADY_EXITED = "already_exited"
    BLOCKED = "blocked"


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """Everything an executor needs to start one attempt; persisted before spawn."""

    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str
    started_at_ms: int
    command: tuple[str, ...]
    shell: bool
    log_path: Path
    receipt_shard_dir: Path
    cwd: str | None = None
    env: dict[str, str] | None = None


@dataclass(slots=True)
class SpawnedTask:
    """A started task: its durable handle (JSON-able) and, while we are its parent, the child."""

    handle: dict[str, Any]
    process: Any = field(default=None, repr=False)


@runtime_checkable
class Executor(Protocol):
    """Starts tasks, and later tells whether they still run (never from a bare pid)."""

    executor_type: str

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        """Start the task detached from the host, stdout/stderr on ``log_fd``; OSError if it cannot."""

    def capture_handle(self, task: SpawnedTask) -> dict[str, Any] | None:
        """The durable handle of a started task, or None if identity cannot be read."""

    def inspect(self, handle: dict[str, Any] | None) -> IdentityState:
        """running / exited / unverifiable for a stored handle."""

    def signal(self, handle: dict[str, Any] | None, signum: int) -> SignalOutcome:
        """Re-verify identity, then signal the task's process group."""


@runtime_checkable
class ReceiptStore(Protocol):
    """Keeps completion receipts; publication is atomic and never overwrites."""

    def publish(self, receipt: Receipt, *, fsync: bool = True) -> PublishOutcome: ...
    def read(self, attempt_id: str) -> ReceiptRead: ...
    def remove(self, attempt_id: str) -> bool: ...
    def quarantine(self, attempt_id: str) -> bool: ...
    def purge_quarantined(self, attempt_id: str) -> bool: ...
    def quarantined_exists(self, attempt_id: str) -> bool: ...
    def relative_ref(self, attempt_id: str) -> str: ...


@runtime_checkable
class JournalBackend(Protocol):
    """Indexes the attempts that may have a receipt (ADR-0007 §2.5); see ``ql_core.journal``."""

    name: str
