"""The built-in ``postgres`` artifact store: shipped logs as chunks in the control database.

Tables and functions come from schema revision ``0006_artifacts``. Writes go through the fenced
functions in :data:`ARTIFACT_WORKER_FUNCTIONS` (``SECURITY DEFINER``; the least-privilege worker
role is granted EXECUTE on exactly these); reads select the tables directly (readers are control
nodes and other workers with read access).

The proof a writer presents is a :class:`~.results.LeaseFence` built from two halves:

- ``worker_id``, ``worker_generation``, ``session``: the caller's **current, live** worker session
  (the database checks them against ``ql_worker`` and that the session lease has not expired);
- ``attempt_id``, ``lease_generation``, ``lease_token``: the attempt's lease as claimed — the lease
  must name the same worker id with a generation ≤ the caller's, and the token must hash to it.

So the worker that ran an attempt can write its log while the attempt runs, after it ended
(finalize after completion) and after a restart of that worker (same data dir: same worker id and
the persisted token; a newer generation and session). Nobody else can: not another worker id, not
a stale process of the same id (its session was replaced), not anyone without the token. The lease
identity is copied onto the artifact row at the first open, so the proof outlives the lease row
(which the sweeper deletes after ``lease_retention_s``).

Privacy: chunk bytes, proofs and tokens never reach a message (errors carry the operation, the
exception class and the SQLSTATE only, as :class:`~.control_db.ControlDB`'s).
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any

from ql_core.ports.artifact_store import (
    MAX_CHUNK_BYTES,
    AppendAnswer,
    AppendResult,
    ArtifactState,
    ArtifactAccessDenied,
    ArtifactStoreError,
    ArtifactStoreUnavailable,
    FinalizeAnswer,
    FinalizeResult,
    RunLogRef,
    SweepResult,
)

from .control_db import ControlDB, ControlDBError, TransientError
from .results import LeaseFence

#: SHA-256 of zero bytes (an empty log).
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

if TYPE_CHECKING:
    from ql_core.ports import RuntimeContext

__all__ = ["PostgresArtifactStore", "ARTIFACT_WORKER_FUNCTIONS", "STORE_NAME", "make_artifact_store",
           "READ_PAGE_CHUNKS"]

STORE_NAME = "postgres"

#: The fenced functions a worker calls (revision 0006_artifacts), with their argument types — what
#: ``ql db grant-worker ROLE`` grants EXECUTE on. Each needs the proof described in the module
#: docstring: a live worker session of the worker id named by the attempt's lease, plus the lease's
#: generation and token.
ARTIFACT_WORKER_FUNCTIONS: tuple[str, ...] = (
    "ql_artifact_open(text, bigint, text, text, bigint, text, bigint)",
    "ql_artifact_append(text, bigint, text, text, bigint, text, bigint, bytea, text)",
    "ql_artifact_finalize(text, bigint, text, text, bigint, text, bigint, text)",
    "ql_artifact_chunks(text, bigint, text, text, bigint, text, bigint, integer)",
    # revision 0016: empty, final logs recorded with the completions (control_db.py)
    "ql_artifact_empty_many(text[], bigint[], text[], text[], bigint[], text[], bigint)",
)

#: Chunks fetched per round trip when the store re-reads an artifact to verify its SHA-256.
READ_PAGE_CHUNKS = 4

_SQL_OPEN = ("SELECT answer, fence_reason, committed_bytes, max_bytes, status, total_bytes, sha256"
             " FROM ql_artifact_open(%s, %s, %s, %s, %s, %s, %s)")
_SQL_APPEND = ("SELECT answer, fence_reason, committed_bytes"
               " FROM ql_artifact_append(%s, %s, %s, %s, %s, %s, %s, %s, %s)")
_SQL_FINALIZE = ("SELECT answer, fence_reason, committed_bytes"
                 " FROM ql_artifact_finalize(%s, %s, %s, %s, %s, %s, %s, %s)")
_SQL_RUN = ("SELECT r.id, r.current_attempt_id, r.status, r.exit_code, r.reason, a.started_at_ms IS NOT NULL"
            " FROM ql_run r LEFT JOIN ql_run_attempt a ON a.id = r.current_attempt_id WHERE r.id = %s")
_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
_SQL_SWEEP = "SELECT chunks_deleted, artifacts_deleted FROM ql_artifact_sweep(%s, %s)"
_SQL_STATE = ("SELECT attempt_id, run_id, committed_bytes, max_bytes, status, total_bytes, sha256"
              " FROM ql_artifact WHERE attempt_id = %s")
#: The one chunk that holds byte ``offset`` (chunks never overlap: they are appended at the end).
_SQL_READ = ("SELECT byte_offset, substring(data FROM (%s - byte_offset + 1)::integer FOR %s)"
             " FROM ql_artifact_chunk WHERE attempt_id = %s AND byte_offset <= %s"
             " ORDER BY byte_offset DESC LIMIT 1")
#: The writer's read-back (fenced like its writes: a worker role may not SELECT the tables).
_SQL_PAGE = ("SELECT chunk_offset, chunk_length, chunk_data"
             " FROM ql_artifact_chunks(%s, %s, %s, %s, %s, %s, %s, %s)")


def _proof(proof: object, attempt_id: str) -> LeaseFence:
    if not isinstance(proof, LeaseFence):
        raise TypeError("the postgres artifact store takes a LeaseFence as proof")
    if proof.attempt_id != attempt_id:
        raise ValueError("the proof names another attempt")
    return proof


def _opened(attempt_id: str, row: tuple[Any, ...]) -> ArtifactState:
    """``ql_artifact_open``'s answer row as an :class:`ArtifactState`."""
    if row[0] != "ok":
        return ArtifactState(attempt_id, None, 0, 0, False, fence_reason=row[1] or "FENCED")
    return ArtifactState(attempt_id, None, int(row[2]), int(row[3]), row[4] == "final",
                         None if row[5] is None else int(row[5]), row[6])


class PostgresArtifactStore:
    """One connection to the control database (not shared between threads), and a second one, opened
    by the first :meth:`wait_for_change`, that only listens (``LISTEN ql_artifact``)."""

    name = STORE_NAME

    def __init__(self, dsn: str, *, call_timeout_s: float = 5.0, connect_timeout_s: int = 5) -> None:
        self._db = ControlDB.connect(dsn, lazy=True, connect_timeout_s=connect_timeout_s,
                                     statement_timeout_ms=int(max(1.0, call_timeout_s) * 1000),
                                     call_timeout_s=call_timeout_s)
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._listener: Any = None

    # -- plumbing ---------------------------------------------------------------------------------
    def _rows(self, operation: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._db._rows(operation, sql, params)
        except TransientError as exc:
            raise ArtifactStoreUnavailable(str(exc)) from None
        except ControlDBError as exc:
            if exc.sqlstate == "42501":  # insufficient_privilege: this role may not make the call
                raise ArtifactAccessDenied(str(exc)) from None
            raise ArtifactStoreError(str(exc)) from None

    def _many(self, operation: str, sql: str, params_seq: list[tuple[Any, ...]]) -> list[tuple[Any, ...]] | None:
        """Many calls of one writer function in one transaction and one round trip (pipelined,
        :meth:`ControlDB._many`): a row per call, in order. Each call is fenced on its own inside its
        function, exactly as alone, and every one is replay-safe (a lost answer is asked again).
        None when the batch failed for good (then nothing of it committed): the caller makes the
        calls one by one, so one bad call never holds the others back."""
        try:
            return self._db._many(operation, sql, params_seq)
        except TransientError as exc:
            raise ArtifactStoreUnavailable(str(exc)) from None
        except ControlDBError:
            return None

    def _one(self, operation: str, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
        rows = self._rows(operation, sql, params)
        if len(rows) != 1:
            raise ArtifactStoreError(f"artifact store: {operation} returned {len(rows)} rows")
        return rows[0]

    def close(self) -> None:
        self._close_listener()
        self._db.close()

    # -- wake-ups (ArtifactChangeWaiter) -------------------------------------------------------------
    def wait_for_change(self, attempt_id: str | None, timeout_s: float) -> bool:
        """Sleep until ``NOTIFY ql_artifact`` names ``attempt_id`` (a chunk committed, the artifact
        finalized: the trigger of revision 0006), or ``timeout_s`` passed. The first call (and the
        first after a lost connection) only starts listening and returns True at once."""
        timeout_s = max(0.0, float(timeout_s))
        conn = self._listener
        if conn is None or conn.closed or conn.broken:
            self._close_listener()
            try:
                self._listener = self._listen()
            except Exception:  # noqa: BLE001 - a wake-up only: the caller polls instead
                time.sleep(timeout_s)
                return False
            return True
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                for note in conn.notifies(timeout=left, stop_after=1):
                    if attempt_id is None or note.payload == attempt_id:
                        return True
        except Exception:  # noqa: BLE001 - the connection broke: listen again at the next call
            self._close_listener()
        return False

    def _listen(self) -> Any:
        from .pg_connections import conninfo_of, psycopg_module

        psycopg = psycopg_module()
        conn = psycopg.connect(conninfo_of(self._dsn), autocommit=True, connect_timeout=self._connect_timeout_s,
                               application_name="ql-log-follow", keepalives=1, keepalives_idle=10,
                               keepalives_interval=5, keepalives_count=3)
        try:
            conn.execute("LISTEN ql_artifact")
        except BaseException:
            conn.close()
            raise
        return conn

    def _close_listener(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    # -- writers (fenced) ---------------------------------------------------------------------------
    def open(self, attempt_id: str, proof: object, *, max_bytes: int) -> ArtifactState:
        fence = _proof(proof, attempt_id)
        return _opened(attempt_id, self._one("artifact_open", _SQL_OPEN, (*fence.params(), int(max_bytes))))

    def open_many(self, calls: list[tuple[str, object]], *, max_bytes: int) -> list[ArtifactState]:
        """:meth:`open` for many ``(attempt_id, proof)`` in one transaction and one round trip (the
        log shipper's round): a worker's per-call cost — a round trip, a commit, the client's and
        the backend's per-statement work — is most of what an open costs. Same answers as alone."""
        params = [(*_proof(proof, attempt_id).params(), int(max_bytes)) for attempt_id, proof in calls]
        rows = self._many("artifact_open", _SQL_OPEN, params) if len(calls) > 1 else None
        if rows is None:
            return [self.open(attempt_id, proof, max_bytes=max_bytes) for attempt_id, proof in calls]
        return [_opened(attempt_id, row) for (attempt_id, _proof_), row in zip(calls, rows)]

    def finalize_empty_many(self, calls: list[tuple[str, object]]) -> list[FinalizeResult]:
        """:meth:`finalize` of many empty logs (0 bytes, the empty file's SHA-256: nothing to read
        back, the database itself refuses unless it holds no byte) in one transaction and one round
        trip. Same answers as one by one."""
        params = [(*_proof(proof, attempt_id).params(), 0, _EMPTY_SHA256) for attempt_id, proof in calls]
        rows = self._many("artifact_finalize", _SQL_FINALIZE, params) if len(calls) > 1 else None
        if rows is None:
            return [self.finalize(attempt_id, proof, total_bytes=0, sha256=_EMPTY_SHA256) for attempt_id, proof in calls]
        return [FinalizeResult(FinalizeAnswer(row[0]), int(row[2] or 0), row[1]) for row in rows]

    def append(self, attempt_id: str, proof: object, offset: int, data: bytes, sha256: str) -> AppendResult:
        fence = _proof(proof, attempt_id)
        if not 1 <= len(data) <= MAX_CHUNK_BYTES:
            raise ValueError(f"a chunk is 1 to {MAX_CHUNK_BYTES} bytes")
        if offset < 0:
            raise ValueError("offset must be >= 0")
        row = self._one("artifact_append", _SQL_APPEND, (*fence.params(), int(offset), bytes(data), sha256))
        return AppendResult(AppendAnswer(row[0]), int(row[2] or 0), row[1])

    def finalize(self, attempt_id: str, proof: object, *, total_bytes: int, sha256: str) -> FinalizeResult:
        fence = _proof(proof, attempt_id)
        # The database checks length and coverage; the whole-file SHA-256 is checked here, against the
        # bytes the database holds (read back in bounded pages through the fenced ql_artifact_chunks,
        # so a least-privilege worker role can do it), never taken on the caller's word. Bytes that
        # do not cover [0, total) are left to the database's answer (mismatch, fenced, finalized).
        # An empty log with the empty file's SHA-256 has nothing to read back: the database itself
        # refuses to finalize 0 bytes unless it holds none (committed bytes, chunk count and their
        # sum), so the answer is the one the read-back would have led to — one call, not two, for
        # every quiet task. Any other empty finalize (a digest that is not the empty file's) is read
        # back as before.
        if total_bytes == 0 and sha256 == _EMPTY_SHA256:
            stored = None
        else:
            stored = self.stored_sha256(attempt_id, total_bytes, fence)
        if stored is not None and stored != sha256:
            return FinalizeResult(FinalizeAnswer.MISMATCH, total_bytes)
        row = self._one("artifact_finalize", _SQL_FINALIZE, (*fence.params(), int(total_bytes), sha256))
        return FinalizeResult(FinalizeAnswer(row[0]), int(row[2] or 0), row[1])

    # -- readers ------------------------------------------------------------------------------------
    def state(self, attempt_id: str) -> ArtifactState | None:
        rows = self._rows("artifact_state", _SQL_STATE, (attempt_id,))
        if not rows:
            return None
        r = rows[0]
        return ArtifactState(r[0], r[1], int(r[2]), int(r[3]), r[4] == "final",
                             None if r[5] is None else int(r[5]), r[6])

    def run_log(self, run_id: str) -> RunLogRef | None:
        rows = self._rows("artifact_run", _SQL_RUN, (run_id,))
        if not rows:
            return None
        r = rows[0]
        return RunLogRef(r[0], r[1], r[2], r[2] in _TERMINAL, r[3], r[4], bool(r[5]))

    def read(self, attempt_id: str, offset: int, limit: int = MAX_CHUNK_BYTES) -> bytes:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        limit = max(0, min(int(limit), MAX_CHUNK_BYTES))
        if limit == 0:
            return b""
        rows = self._rows("artifact_read", _SQL_READ, (int(offset), limit, attempt_id, int(offset)))
        if not rows or rows[0][1] is None:
            return b""
        return bytes(rows[0][1])

    def stored_sha256(self, attempt_id: str, total_bytes: int, proof: object) -> str | None:
        """SHA-256 of the stored bytes ``[0, total_bytes)``, read in pages of a few chunks (bounded
        memory) with the writer's proof; None when they are not exactly that: a hole, an overlap,
        too few or too many (or no proof: nothing is returned)."""
        fence = _proof(proof, attempt_id)
        digest = hashlib.sha256()
        at = 0
        while True:
            rows = self._rows("artifact_verify", _SQL_PAGE, (*fence.params(), at, READ_PAGE_CHUNKS))
            if not rows:
                break
            for offset, length, data in rows:
                if offset != at or len(data) != length:
                    return None
                digest.update(data)
                at += length
            del rows
        return digest.hexdigest() if at == total_bytes else None

    # -- control side -------------------------------------------------------------------------------
    def sweep(self, *, retention_s: float, limit: int) -> SweepResult:
        row = self._one("artifact_sweep", _SQL_SWEEP, (max(1, min(int(limit), 4096)),
                                                        int(max(0.0, retention_s) * 1000)))
        return SweepResult(int(row[0]), int(row[1]))


def make_artifact_store(context: RuntimeContext) -> PostgresArtifactStore:
    """The factory registered as ``postgres``: the node's control database, calls capped by
    ``control_call_timeout_s``."""
    from ql_core.errors import ConfigError

    url = context.config.database_url
    if not url.startswith("postgresql"):
        raise ConfigError('artifact_store = "postgres" needs database_url = "postgresql+psycopg://..." '
                          "(the control database)")
    from .settings import profile_of

    return PostgresArtifactStore(url, call_timeout_s=float(profile_of(context.config).control_call_timeout_s))
