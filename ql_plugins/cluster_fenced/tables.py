"""The cluster control plane's declared schema (revisions ``0003_cluster_control`` and
``0006_artifacts``; PostgreSQL only), declared on core's ``METADATA`` when the plugin's schema
branch loads (:mod:`.migrations`, found by ``ql_core.db.migrate.version_locations``).

Three tables beside the common ones (``ql_run``, ``ql_run_attempt``, ``ql_run_event``):

- :class:`Worker` (``ql_worker``): one row per configured worker id; ``generation`` is bumped by
  every registration of a new process (``session``) and is the worker's fencing token.
- :class:`AttemptLease` (``ql_attempt_lease``): the run lease of one attempt, the only authority to
  run it. ``lease_generation`` (a database-wide sequence) is the lease's fencing token; only the
  SHA-256 digest of the lease token is stored.
- :class:`RunSpec` (``ql_run_spec``): what to run (command, shell flag, cwd, env), SEALED since
  revision 0005 (one AES-GCM copy per allowed attempt), handed only to the lease holder by
  ``ql_claim`` and erased when the attempt / the run ends.

They are written only by the PL/pgSQL functions that the same revision creates (see
``docs/cluster-control-db.md``); this module is the declaration that the schema test compares with
the migrated database. The edge SQLite database does not have them: each table carries
``info={"ql_dialects": ("postgresql",)}`` and :func:`ql_core.db.models.include_object` tells
Alembic's comparison to skip them on other dialects.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import BigInteger, CheckConstraint, Column, Index, Integer, LargeBinary, Text, text
from sqlmodel import Field

from ql_core.db.models import QlTable, ms_column

__all__ = [
    "Worker",
    "AttemptLease",
    "RunSpec",
    "Artifact",
    "ArtifactChunk",
    "POSTGRESQL_ONLY",
    "LIVE_LEASE_STATES",
]

#: ``Table.info`` of a table that exists only on these dialects.
POSTGRESQL_ONLY: dict[str, Any] = {"ql_dialects": ("postgresql",)}

#: Lease states in which the lease still grants something: exactly the rows with ``ended_at_ms IS
#: NULL`` (``ck_ql_lease_ended``), the partial index's predicate since revision 0013.
LIVE_LEASE_STATES = ("claimed", "starting", "running")


class Worker(QlTable, table=True):
    """A worker id and the process (``session``, ``generation``) that currently holds it."""

    __tablename__ = "ql_worker"
    __table_args__ = ({"info": POSTGRESQL_ONLY},)

    #: The configured worker id (stable across restarts).
    id: str = Field(primary_key=True, max_length=64)
    #: A fresh UUID per process start; registering another session bumps ``generation``.
    session: str = Field(max_length=36)
    #: Fencing token of the worker: every registration of a new session increments it.
    generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    #: "active" (registered, revision 0003), "draining" (its drain started, 0008), "stopped"
    #: (deregistered after its drain, 0004).
    status: str = Field(max_length=16)
    version: int = 1
    slots: int
    #: Worker session lease (heartbeat); claim needs it live, per-attempt calls need the run lease.
    lease_expires_at_ms: int = Field(sa_column=ms_column())
    registered_at_ms: int = Field(sa_column=ms_column())
    heartbeat_at_ms: int = Field(sa_column=ms_column())
    ql_version: str = Field(max_length=32)


class AttemptLease(QlTable, table=True):
    """The run lease of one attempt: claimed → starting → running → ended.

    Stored with ``fillfactor = 50`` (revision 0013): room on each page for the HOT updates of start
    and running."""

    __tablename__ = "ql_attempt_lease"
    __table_args__ = (
        # Predicates on ended_at_ms, not status (0013): start and running change status only, and
        # a column of an index predicate is indexed as far as HOT updates are concerned.
        Index("ix_ql_lease_live_expiry", "expires_at_ms", postgresql_where=text("ended_at_ms IS NULL")),
        Index("ix_ql_lease_ended", "ended_at_ms", postgresql_where=text("ended_at_ms IS NOT NULL")),
        Index("ux_ql_lease_generation", "lease_generation", unique=True),
        CheckConstraint("(status = 'ended') = (ended_at_ms IS NOT NULL)", name="ck_ql_lease_ended"),
        {"info": POSTGRESQL_ONLY},
    )

    attempt_id: str = Field(primary_key=True, max_length=36, foreign_key="ql_run_attempt.id")
    run_id: str = Field(max_length=36)
    #: "claimed" | "starting" | "running" | "ended"
    status: str = Field(max_length=16)
    version: int = 1
    #: Fencing token of this grant (from the sequence ``ql_lease_generation_seq``).
    lease_generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    #: SHA-256 (hex) of the lease token; the token itself is returned once by ``ql_claim``.
    token_digest: str = Field(max_length=64)
    worker_id: str = Field(max_length=64)
    worker_generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    expires_at_ms: int = Field(sa_column=ms_column())
    claimed_at_ms: int = Field(sa_column=ms_column())
    #: Database time of ``ql_start`` (claimed → starting: the worker may spawn from now on).
    started_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    #: Database time of ``ql_running`` (the worker reported the process spawned).
    running_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    renewed_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    #: When the run's cancel/timeout intent was first handed to the lease holder.
    intent_delivered_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    ended_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    #: completed | worker_lost | released (by the holder) | expired | cancelled (by others)
    end_reason: Optional[str] = Field(default=None, max_length=16)
    #: The caller's digest of the completion that was applied: an exact replay is recognised by it.
    completion_digest: Optional[str] = Field(default=None, max_length=64)


class RunSpec(QlTable, table=True):
    """A run's SEALED spec (revision 0005): one AES-GCM copy per attempt its retry policy allows."""

    __tablename__ = "ql_run_spec"
    __table_args__ = ({"info": POSTGRESQL_ONLY},)

    run_id: str = Field(primary_key=True, max_length=36, foreign_key="ql_run.id")
    #: The n-th attempt that may start gets copy n (its associated data binds run id and n).
    ordinal: int = Field(primary_key=True)
    #: Which key sealed it (16 hex digits, ql_plugins/cluster_fenced/sealing.py); never the key.
    key_id: str = Field(max_length=16)
    #: nonce ‖ ciphertext ‖ tag — never the command, cwd or environment in clear.
    sealed: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at_ms: int = Field(sa_column=ms_column())


def _text(*, primary_key: bool = False, nullable: bool = False) -> Any:
    return Column(Text, primary_key=primary_key, nullable=nullable)


class Artifact(QlTable, table=True):
    """A shipped attempt log (revision ``0006_artifacts``): who may write it (the lease identity,
    copied at the first open), its quota, the committed contiguous prefix, and once finalized its
    total length and whole-file SHA-256. Written only by the ``ql_artifact_*`` functions."""

    __tablename__ = "ql_artifact"
    __table_args__ = (
        Index("ix_ql_artifact_run", "run_id"),
        Index("ix_ql_artifact_created", "created_at_ms"),
        {"info": POSTGRESQL_ONLY},
    )

    attempt_id: str = Field(sa_column=_text(primary_key=True))
    run_id: str = Field(sa_column=_text())
    worker_id: str = Field(sa_column=_text())
    worker_generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    lease_generation: int = Field(sa_column=Column(BigInteger, nullable=False))
    token_digest: str = Field(sa_column=_text())
    max_bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    committed_bytes: int = Field(sa_column=Column(BigInteger, nullable=False, server_default=text("0")))
    chunk_count: int = Field(sa_column=Column(Integer, nullable=False, server_default=text("0")))
    #: "open" | "final"
    status: str = Field(sa_column=Column(Text, nullable=False, server_default=text("'open'")))
    total_bytes: Optional[int] = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    sha256: Optional[str] = Field(default=None, sa_column=_text(nullable=True))
    created_at_ms: int = Field(sa_column=ms_column())
    updated_at_ms: int = Field(sa_column=ms_column())
    finalized_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))


class ArtifactChunk(QlTable, table=True):
    """One chunk (1 byte .. 1 MiB) of a shipped log at a byte offset, with the SHA-256 the database
    computed on insert."""

    __tablename__ = "ql_artifact_chunk"
    __table_args__ = ({"info": POSTGRESQL_ONLY},)

    attempt_id: str = Field(sa_column=_text(primary_key=True))
    byte_offset: int = Field(sa_column=Column(BigInteger, primary_key=True, nullable=False))
    length: int = Field(sa_column=Column(Integer, nullable=False))
    sha256: str = Field(sa_column=_text())
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
