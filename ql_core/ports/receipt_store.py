"""The receipt-store seam: where completion receipts are published, read, removed and quarantined.

A receipt (ADR-0007 §2.4) is the executor's local proof of how an attempt
ended, written *before* the database knows. Contract (checked by
:class:`ql_core.testing.ReceiptStoreContract`):

- publication is atomic and never overwrites: a reader sees no receipt or a
  complete one; a second publication for the same attempt is
  ``already_exists`` and leaves the first untouched;
- :meth:`ReceiptStore.read` classifies what is there — ``missing``, ``valid``
  (parsed by the strict codec) or ``invalid`` (with the codec's rejection) —
  and raises :class:`ReceiptStoreError` only for trouble worth retrying
  (:class:`UnsafePathError` when a location is not what it must be: a
  symlink, a directory, another owner);
- :meth:`ReceiptStore.remove` is called only after the terminal commit;
  :meth:`ReceiptStore.quarantine` moves a rejected receipt aside without ever
  overwriting an earlier quarantined one (:class:`QuarantineConflictError`);
- :meth:`ReceiptStore.prepare` gives the executor the location its task
  publishes to (for the ``file`` store: the absolute shard directory, created
  and verified); core passes it through without reading it;
- ids are validated before any location is built (``ValueError``).

Every method may be called from several threads and processes at once.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ql_core.value_class import value_class

if TYPE_CHECKING:
    from ..receipts.codec import Receipt, ReceiptRejection

__all__ = [
    "PublishOutcome",
    "ReadStatus",
    "ReceiptRead",
    "ReceiptStoreError",
    "UnsafePathError",
    "ReceiptPublishError",
    "QuarantineConflictError",
    "ReceiptStore",
    "SurelyAbsent",
]


class ReceiptStoreError(Exception):
    """A receipt store operation failed; usually transient — retried next round."""


class UnsafePathError(ReceiptStoreError):
    """A location is a symlink, not a directory, not a regular file, or not ours: fail closed."""


class ReceiptPublishError(ReceiptStoreError):
    """Publication failed.

    ``final_visible`` is False when nothing became visible (the usual case) and
    True when the complete receipt was already published and only the cleanup
    or the directory sync failed.
    """

    def __init__(self, message: str, *, final_visible: bool = False) -> None:
        super().__init__(message)
        self.final_visible = final_visible


class QuarantineConflictError(ReceiptStoreError):
    """The quarantine slot already holds a different file; nothing was overwritten or removed."""


class PublishOutcome(enum.StrEnum):
    PUBLISHED = "published"
    ALREADY_EXISTS = "already_exists"


class ReadStatus(enum.StrEnum):
    """What :meth:`ReceiptStore.read` found (compares equal to its string value)."""

    MISSING = "missing"
    VALID = "valid"
    INVALID = "invalid"


@value_class()  # as @dataclass(frozen=True), without its import-time code generation
class ReceiptRead:
    """What is at an attempt's receipt location: nothing, a valid receipt, or a rejected file."""

    __slots__ = ("status", "receipt", "rejection")
    status: ReadStatus
    receipt: Receipt | None
    rejection: ReceiptRejection | None

    def __init__(self, status: ReadStatus, receipt: Receipt | None = None,
                 rejection: ReceiptRejection | None = None) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "receipt", receipt)
        _set(self, "rejection", rejection)


@runtime_checkable
class ReceiptStore(Protocol):
    """Keeps completion receipts; publication is atomic and never overwrites."""

    def prepare(self, attempt_id: str) -> str:
        """Make the attempt's location ready for an outside publisher; return it (opaque to core)."""
        ...

    def publish(self, receipt: Receipt, *, fsync: bool = True) -> PublishOutcome:
        """Publish atomically, never overwriting (``already_exists``); ReceiptPublishError on failure."""
        ...

    def read(self, attempt_id: str) -> ReceiptRead:
        """``missing`` / ``valid`` / ``invalid``; ReceiptStoreError for retryable trouble."""
        ...

    def remove(self, attempt_id: str) -> bool:
        """Delete the receipt after its terminal commit; False if there was none."""
        ...

    def quarantine(self, attempt_id: str) -> bool:
        """Move the receipt into quarantine (no overwrite: QuarantineConflictError); False if none."""
        ...

    def purge_quarantined(self, attempt_id: str) -> bool:
        """Delete the quarantined copy (its retention ended); False if there was none."""
        ...

    def quarantined_exists(self, attempt_id: str) -> bool:
        """Is there a quarantined copy for the attempt?"""
        ...

    def relative_ref(self, attempt_id: str) -> str:
        """A bounded, relative reference for the journal (never an absolute path; ≤ 64 chars)."""
        ...


@runtime_checkable
class SurelyAbsent(Protocol):
    """A receipt store that can say in one cheap look that no receipt is there (optional).

    Called by the awaited host (:func:`ql_core.wait.wait`) after it reaped the launcher and before
    it commits the status it saw: a missing receipt, an unusable slot and a failed read all lead
    on to that commit, so a True here spares the checked :meth:`ReceiptStore.read`. Core looks the
    method up with ``getattr`` (the hot path), as it does for the journal's ``TerminalLogSize``."""

    def surely_absent(self, attempt_id: str) -> bool:
        """True only when nothing is at the attempt's receipt path now; False (something is there,
        or the look failed) leaves the decision to :meth:`ReceiptStore.read`."""
        ...
