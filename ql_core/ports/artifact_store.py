"""The artifact-store seam: where a cluster worker ships an attempt's log, and where any node reads it.

A log artifact is the byte stream of one attempt, stored as chunks keyed by (attempt id, byte
offset). Contract (checked by :class:`ql_core.testing.ArtifactStoreContract`):

- **writes need a proof.** :meth:`ArtifactStore.open`, :meth:`~ArtifactStore.append` and
  :meth:`~ArtifactStore.finalize` take an opaque ``proof`` that the *store* checks (for the
  built-in PostgreSQL store: the worker's live session plus the attempt's lease identity and
  token, checked by the database); a refused proof is answer ``fenced``, never a write;
- **chunks are 1 byte .. MAX_CHUNK_BYTES (1 MiB)** and carry the SHA-256 of their bytes, which the
  store recomputes: a mismatch is ``corrupt`` (nothing written);
- **append only at the committed end.** The committed bytes are always one contiguous prefix
  ``[0, committed_bytes)``. An identical chunk at an offset already committed is ``duplicate``
  (replay after a lost answer: no-op); a different one there is ``conflict``; a chunk past the end
  is ``gap``; one past the quota (``max_bytes``, fixed at the first open) is ``quota``;
- **finalize** names the total length and whole-file SHA-256; it succeeds only when the length is
  the committed prefix and the stored bytes hash to that SHA-256 (``finalized``; a replay is
  ``already_finalized``; anything else ``mismatch``). After it, nothing can be appended;
- **reads** (:meth:`~ArtifactStore.read`) return committed bytes only, from any offset, at most
  ``limit`` bytes, in the same byte offsets as the worker's local file;
- :meth:`~ArtifactStore.run_log` names a run's current attempt and whether the run ended, so a
  follower on any node knows which artifact to read and when to stop;
- **retention** (:meth:`~ArtifactStore.sweep`) deletes bounded pages of artifacts of runs that
  ended longer ago than the retention.

Transient trouble (the store is unreachable, a timeout) raises :class:`ArtifactStoreUnavailable`:
the caller repeats the same call later (every write is idempotent). :class:`ArtifactStoreError` is
final (a bug, a schema mismatch). Neither message carries chunk bytes, a proof or a token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "MAX_CHUNK_BYTES",
    "ArtifactAccessDenied",
    "AppendAnswer",
    "FinalizeAnswer",
    "ArtifactState",
    "AppendResult",
    "FinalizeResult",
    "SweepResult",
    "RunLogRef",
    "ArtifactStoreError",
    "ArtifactStoreUnavailable",
    "ArtifactFencedError",
    "ArtifactStore",
    "ArtifactChangeWaiter",
]

#: The largest chunk a store accepts (and the largest slice a shipper reads at once).
MAX_CHUNK_BYTES = 1024 * 1024


class AppendAnswer(enum.StrEnum):
    APPENDED = "appended"
    #: The identical chunk was committed before at this offset (a replay): nothing changed.
    DUPLICATE = "duplicate"
    #: The bytes do not hash to the given SHA-256: nothing written (re-read and send again).
    CORRUPT = "corrupt"
    #: Another chunk is committed at (or across) this offset: refused, the committed bytes stay.
    CONFLICT = "conflict"
    #: The offset is past the committed end: send from ``committed_bytes``.
    GAP = "gap"
    #: The chunk would end past the artifact's ``max_bytes``.
    QUOTA = "quota"
    #: The artifact is finalized: nothing can be appended.
    FINALIZED = "finalized"
    #: The proof was refused (``fence_reason`` says why): stop writing this artifact.
    FENCED = "fenced"


class FinalizeAnswer(enum.StrEnum):
    FINALIZED = "finalized"
    #: Finalized before with the same length and SHA-256 (a replay).
    ALREADY_FINALIZED = "already_finalized"
    #: The length is not the committed prefix, or the stored bytes do not hash to the SHA-256.
    MISMATCH = "mismatch"
    FENCED = "fenced"


@dataclass(frozen=True, slots=True)
class ArtifactState:
    """What a store holds for one attempt (``open`` answers with it; readers ask :meth:`ArtifactStore.state`)."""

    attempt_id: str
    run_id: str | None
    committed_bytes: int
    max_bytes: int
    finalized: bool
    #: Set once finalized.
    total_bytes: int | None = None
    sha256: str | None = None
    #: When ``open`` was refused: why (e.g. ``WRONG_TOKEN``); the other fields are then zero.
    fence_reason: str | None = None

    @property
    def fenced(self) -> bool:
        return self.fence_reason is not None


@dataclass(frozen=True, slots=True)
class AppendResult:
    answer: AppendAnswer
    #: The committed contiguous prefix after the call: where the next chunk goes.
    committed_bytes: int
    fence_reason: str | None = None


@dataclass(frozen=True, slots=True)
class FinalizeResult:
    answer: FinalizeAnswer
    committed_bytes: int
    fence_reason: str | None = None

    @property
    def acknowledged(self) -> bool:
        """The artifact is final with exactly this length and SHA-256: the local copy may go."""
        return self.answer in (FinalizeAnswer.FINALIZED, FinalizeAnswer.ALREADY_FINALIZED)


@dataclass(frozen=True, slots=True)
class SweepResult:
    chunks_deleted: int
    artifacts_deleted: int


@dataclass(frozen=True, slots=True)
class RunLogRef:
    """Which artifact is a run's log, and whether the run has ended (what a follower needs to stop)."""

    run_id: str
    #: The run's current (latest) attempt; None while it is queued.
    attempt_id: str | None
    status: str
    terminal: bool
    exit_code: int | None = None
    reason: str | None = None
    #: The attempt was reported running (its task spawned): a log may exist. False for an attempt
    #: that never started (cancelled or released before the spawn): no log will ever come.
    attempt_started: bool = True


class ArtifactStoreError(Exception):
    """A final error of an artifact store call (a bug, a schema mismatch): do not retry."""


class ArtifactStoreUnavailable(ArtifactStoreError):
    """Transient: the store could not be reached or did not answer in time. The call may or may
    not have committed; repeat the same call later (every write is idempotent)."""


class ArtifactAccessDenied(ArtifactStoreError):
    """The store refused this caller's credentials for the call (e.g. a least-privilege worker
    role reading logs): final, and not a bug; the message names no secret."""


class ArtifactFencedError(ArtifactStoreError):
    """Raised by helpers that cannot return an answer: the proof was refused."""


@runtime_checkable
class ArtifactStore(Protocol):
    """Log artifacts of attempts (see the module docstring). Not shared between threads."""

    name: str

    def open(self, attempt_id: str, proof: object, *, max_bytes: int) -> ArtifactState:
        """Create the artifact (quota ``max_bytes``, fixed at the first open) or look it up;
        its ``committed_bytes`` is where a writer resumes. ``fence_reason`` set: refused."""
        ...

    def append(self, attempt_id: str, proof: object, offset: int, data: bytes, sha256: str) -> AppendResult:
        """Commit one chunk at ``offset`` (1 byte .. :data:`MAX_CHUNK_BYTES`; ``sha256`` of ``data``, hex)."""
        ...

    def finalize(self, attempt_id: str, proof: object, *, total_bytes: int, sha256: str) -> FinalizeResult:
        """Close the artifact at ``total_bytes`` whose whole content hashes to ``sha256`` (hex)."""
        ...

    def state(self, attempt_id: str) -> ArtifactState | None:
        """The artifact of ``attempt_id`` (None: nothing shipped yet)."""
        ...

    def read(self, attempt_id: str, offset: int, limit: int = MAX_CHUNK_BYTES) -> bytes:
        """Up to ``limit`` committed bytes from ``offset`` (b"" at or past the committed end)."""
        ...

    def run_log(self, run_id: str) -> RunLogRef | None:
        """The run's current attempt and state as the cluster's control plane knows it (None: no
        such run). A store next to the control plane answers it directly; followers poll it."""
        ...

    def sweep(self, *, retention_s: float, limit: int) -> SweepResult:
        """Delete at most ``limit`` chunks of artifacts of runs ended more than ``retention_s`` ago."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class ArtifactChangeWaiter(Protocol):
    """A store that can say when an artifact changed (a chunk committed, the artifact finalized), so
    a follower sleeps until then instead of polling. Optional: a follower of a store without it
    polls (``ql_core.follow.ARTIFACT_POLL_S``)."""

    def wait_for_change(self, attempt_id: str | None, timeout_s: float) -> bool:
        """Block until the artifact of ``attempt_id`` (None: any artifact) changed, or ``timeout_s``
        passed; True when a change woke it. A wake-up is only a hint: the caller reads again.

        The first call only starts listening and returns True at once, so the caller reads once
        more: a change committed between its last read and the listen is never missed. A store
        that cannot listen (the connection failed) sleeps ``timeout_s`` and returns False."""
        ...
