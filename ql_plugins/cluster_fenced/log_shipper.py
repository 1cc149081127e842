"""The worker's log shipper: each attempt's local log, shipped to the artifact store in chunks.

One daemon thread per ``ql worker`` (``ql-worker-logs``), with its own store connection; it never
holds a lock the control loop or a runner needs, so shipping never delays a task, a lease renewal
or a completion — a database that is down only delays the shipping (capped backoff).

What it does, per attempt this worker claimed (table ``ql_log_ship`` in ``worker.db``):

1. **open** the artifact (quota: the profile's ``log_max_bytes``) once its local log has a byte
   (not before: a task that prints nothing never costs an open); the store answers its committed
   offset — where shipping resumes after any crash, restart or lost connection. Nothing about
   progress is trusted from local state: the store's offset is the truth.
2. **ship** new bytes of the local log while the task runs: when at least ``ship_batch_bytes``
   (256 KiB) wait, or ``ship_interval_s`` (1 s) passed since the last chunk. The local file is read
   in slices of at most 1 MiB (``os.pread`` at the committed offset; never the whole file), each
   slice one chunk with its SHA-256. Answers: ``appended``/``duplicate`` advance, ``gap``/
   ``conflict`` resynchronise to the store's offset (a lost answer), ``corrupt`` re-reads.
3. **finalize** once the local attempt is terminal and its log is final (cut to its quota): the
   rest is shipped, then the total length and the whole-file SHA-256 of the local bytes
   (re-read in 1 MiB slices) are sent; the store checks both against what it holds.
4. **delete** the local copy only after the store acknowledged the finalize and the attempt ended
   more than ``shipped_log_keep_s`` ago. The local log retention skips a log still ``shipping``
   (:meth:`~.worker_store.WorkerJournal.ended_logs`), so a worker cut off from the database keeps it.

An attempt that ended with an empty log, never opened here, is not this thread's while its
completion is in the outbox: the completion records the log as finalized and empty in its own
statement (:meth:`LogShipper.empty_final_logs`, ``ql_artifact_empty_many``, revision 0016). Once the
completion is answered, a log it did not record is finalized here as before.

Steps 1 and 3 are batched per round where the store can (``open_many``, ``finalize_empty_many``:
one transaction and one round trip for the round's new attempts, and for its empty logs of ended
attempts); a woken shipper waits :data:`COALESCE_S` first, so that attempts ending together share
the calls.

Proof: the lease identity of the attempt (lease generation + token, persisted here at claim time)
plus this process's live worker session (see :mod:`.artifact_store`). The token is erased from the
row once the finalize is acknowledged.

Local files are opened without blocking and without following links (``O_NOFOLLOW|O_NONBLOCK``,
then ``fstat`` must say regular file), like every other log access. Privacy: no chunk content, no
command, no environment ever reaches a log line — only attempt ids, offsets, sizes and answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ql_core.clock import now_ms
from ql_core.crashpoints import crashpoint
from ql_core.log import logger
from ql_core.ports.artifact_store import (
    MAX_CHUNK_BYTES,
    AppendAnswer,
    ArtifactStore,
    ArtifactStoreUnavailable,
    FinalizeAnswer,
)
from ql_core.states import RUN_TERMINAL

from .results import LeaseFence, WorkerFence
from .ship_table import SHIP_PAGE, ShipRow, ShipTable, open_ship_table

if TYPE_CHECKING:
    from ql_core.node import Node

__all__ = ["LogShipper", "ShipTable", "ShipRow", "SHIP_PAGE", "local_log_sha256", "open_ship_table"]

#: Bytes one attempt may ship per round before the next attempt's turn (fairness, not a limit).
_ROUND_BYTES = 16 * MAX_CHUNK_BYTES
#: How long a woken shipper waits before its round, for the other attempts that end meanwhile: a
#: log is finalized that much later, and a busy worker's round batches several attempts' calls.
COALESCE_S = 0.05
#: SHA-256 of zero bytes: an empty log's whole-file digest.
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
#: Fence reasons that can never turn into a yes for this attempt: stop trying, keep the local log.
_PERMANENT = frozenset({"NO_LEASE", "WRONG_WORKER", "STALE_LEASE_GENERATION", "WRONG_TOKEN"})

def _open_local(data_dir: Path, log_id: str) -> int | None:
    """The local log, read-only: no link followed, never blocking, a regular file (else UnsafePathError)."""
    from ql_core.logs import open_log_for_reading

    return open_log_for_reading(data_dir, log_id)


def local_log_sha256(fd: int, total: int) -> str:
    """SHA-256 of ``[0, total)`` of an open file, read in slices of at most 1 MiB."""
    digest = hashlib.sha256()
    at = 0
    while at < total:
        piece = os.pread(fd, min(MAX_CHUNK_BYTES, total - at), at)
        if not piece:
            break
        digest.update(piece)
        at += len(piece)
    if at != total:
        raise OSError("the local log is shorter than its recorded size")
    return digest.hexdigest()


@dataclass
class _Progress:
    """In memory only (the store's committed offset is the truth; reopened after a restart)."""

    committed: int = 0
    max_bytes: int = 0
    last_ship: float = 0.0
    corrupt: int = 0


class LogShipper:
    """The ``ql-worker-logs`` thread (see the module docstring)."""

    def __init__(self, node: Node, table: ShipTable, make_store: Callable[[], ArtifactStore], *,
                 worker_id: str, fence: Callable[[], WorkerFence | None], profile: Any) -> None:
        self.node = node
        self.table = table
        self._make_store = make_store
        self._store: ArtifactStore | None = None
        self.worker_id = worker_id
        self._fence = fence
        self.profile = profile
        self.interval_s = float(profile.ship_interval_s)
        self.batch_bytes = int(profile.ship_batch_bytes)
        self.max_bytes = int(profile.log_max_bytes)
        self.keep_ms = int(float(profile.shipped_log_keep_s) * 1000)
        self._progress: dict[str, _Progress] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self.counts: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ql-worker-logs", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None

    def wake(self) -> None:
        self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait (bounded) until no ended attempt's log is left unfinalized; True when none is."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while time.monotonic() < deadline:
            self._idle.clear()
            self._wake.set()
            if self._idle.wait(min(1.0, max(0.0, deadline - time.monotonic()))) and not self._ended_pending():
                return True
        return not self._ended_pending()

    def _ended_pending(self) -> bool:
        for row in self.table.by_state("shipping"):
            attempt = self.node.journal.attempt(row.attempt_id)
            if attempt is not None and attempt.status in RUN_TERMINAL:
                return True
        return False

    def track(self, rows: list[tuple[str, str, str, int, str]]) -> None:
        """Called by the control loop right after a claim was recorded (before anything spawns)."""
        self.table.track(rows)
        self._wake.set()

    # -- empty logs carried by the completions (control loop thread) ----------------------------------
    def empty_final_logs(self, attempt_ids: list[str]) -> dict[str, ShipRow]:
        """Of these attempts (ended locally: each has its completion in the outbox), those whose log
        can be recorded with their completion (``ControlDB.complete_many_with_empty_logs``) instead of
        by this shipper: still ``shipping``, never opened by this process, and the local log empty
        (or already dropped as empty) — final, since the attempt's terminal commit is done, exactly
        what :meth:`_ship` would finalize as empty. Anything else (bytes, an error reading the
        file) is left to the shipper."""
        out: dict[str, ShipRow] = {}
        for i in range(0, len(attempt_ids), SHIP_PAGE):
            for row in self.table.shipping_among(attempt_ids[i:i + SHIP_PAGE]):
                if row.attempt_id in self._progress or row.lease_token is None:
                    continue
                try:
                    if self._ended_size(row.log_id) == 0:
                        out[row.attempt_id] = row
                except Exception:  # noqa: BLE001 - an unreadable/unsafe file: the shipper's, as before
                    continue
        return out

    def carried(self, answers: list[tuple[ShipRow, str]]) -> list[str]:
        """The store's answers to the empty logs recorded with their completions. Returns the
        attempts acknowledged (``finalized``/``already_finalized``), whose rows the caller marks
        ``final`` (:meth:`ShipTable.finalized_in`) in the commit that records the completions'
        answers; any other answer leaves the log to this shipper, as before (woken for it)."""
        acked = [row.attempt_id for row, answer in answers if answer in ("finalized", "already_finalized")]
        for attempt_id in acked:
            self._progress.pop(attempt_id, None)
        self._count("finalized_with_completion", len(acked))
        if len(acked) < len(answers):
            self._wake.set()
        return acked

    def _ended_size(self, log_id: str) -> int:
        """An ended attempt's log size: the one its runner recorded (an empty log's 0 is written in
        the attempt's terminal commit, a sized log's after it) — no open, no walk of the log's
        directories, no fstat; the file itself only while no size is recorded yet."""
        facts = self.node.journal.log_facts(log_id)
        if facts is not None and facts.size_bytes is not None:
            return int(facts.size_bytes)
        return self._local_size(log_id)

    def _local_size(self, log_id: str) -> int:
        fd = _open_local(self.node.config.data_dir, log_id)
        if fd is None:
            return 0
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    # -- the loop --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = self.interval_s
            try:
                if time.monotonic() >= self._retry_at:
                    wait = self._round()
                    self._backoff = 0.0
                else:
                    wait = self._retry_at - time.monotonic()
            except ArtifactStoreUnavailable:
                # The database is away: only shipping waits (tasks, renewals, completions go on).
                self._backoff = min(30.0, max(0.25, self._backoff * 2))
                self._retry_at = time.monotonic() + self._backoff
                self._count("unavailable")
                wait = self._backoff
            except Exception as exc:  # noqa: BLE001 - type only: never a value that could hold data
                # A final store error (a schema mismatch, a bug) or the local disk: say so, back off
                # (capped) instead of repeating the same failure every second.
                self._backoff = min(30.0, max(1.0, self._backoff * 2))
                self._retry_at = time.monotonic() + self._backoff
                logger.error("log shipping round failed ({}); retried in {:g}s", type(exc).__name__, self._backoff)
                wait = self._backoff
            self._idle.set()
            if self._wake.wait(max(0.01, wait)) and not self._stop.is_set():
                # Woken (an attempt ended): let the attempts ending in the same moment join this
                # round, whose opens and empty finalizes go in one batch each (see _round).
                self._stop.wait(COALESCE_S)
            self._wake.clear()

    def store(self) -> ArtifactStore:
        if self._store is None:
            self._store = self._make_store()
        return self._store

    def _round(self) -> float:
        """One pass over the pending attempts; returns how long to sleep.

        The round's calls are batched where a store can (``open_many``, ``finalize_empty_many``:
        one transaction and one round trip each): the artifacts of every attempt first seen this
        round are opened together, and the empty logs of attempts that ended are finalized
        together — a quiet task's log then costs a share of two calls, not two calls of its own
        (each call's round trip, commit and per-statement work are most of what it costs)."""
        fence = self._fence()
        if fence is None:
            return self.interval_s  # not registered (yet): no proof to show
        next_due = self.interval_s
        rows = []
        for row in self.table.by_state("shipping"):
            attempt = self.node.journal.attempt(row.attempt_id)
            if attempt is None:
                lease = self._lease_state(row.attempt_id)
                if lease in (None, "answered"):
                    self.table.forget(row.attempt_id)  # never spawned here: no log exists or ever will
                continue
            if row.lease_token is None:
                self.table.abandon(row.attempt_id, "NO_TOKEN")
                continue
            if self._nothing_to_open(row, attempt):
                continue
            rows.append((row, attempt))
        opened = self._open_new([row for row, _attempt in rows], fence)
        empty: list[tuple[ShipRow, LeaseFence]] = []
        for row, attempt in rows:
            if self._stop.is_set():
                break
            due = self._ship(row, fence, attempt, opened.get(row.attempt_id), empty)
            next_due = min(next_due, due)
        if empty and not self._stop.is_set():
            self._finalize_empty(empty)
        self._delete_shipped()
        return next_due

    def _nothing_to_open(self, row: ShipRow, attempt: Any) -> bool:
        """An attempt whose artifact is not open here and whose local log is empty: nothing to do
        yet. While it runs, its artifact is opened with its first byte (a task that prints later
        still ships from byte 0; a quiet one never costs an open). Once it ended, and while its
        completion is in the outbox, the completion records the empty log
        (:meth:`empty_final_logs`) in its own transaction — no open and no finalize of ours. Once the
        completion is answered, a log it did not record (an older control database, a refusal, a
        crash in between) is this shipper's again, as before."""
        if row.attempt_id in self._progress:
            return False
        if attempt.status in RUN_TERMINAL and self._lease_state(row.attempt_id) != "outbox":
            # The outbox row is written in the attempt's terminal commit itself (.worker_local), so
            # an ended attempt outside the outbox has its completion answered already (or its
            # payload was deferred: a data dir of an earlier release, a payload that could not be
            # built). An answered completion that carried the empty log made this ship row
            # ``final`` in the answers' commit — after this round read it ``shipping``: read again.
            again = self.table.get(row.attempt_id)
            return again is None or again.state != "shipping"
        try:
            if attempt.status in RUN_TERMINAL:
                return self._ended_size(row.log_id) == 0  # in the outbox: its completion's
            return self._local_size(row.log_id) == 0
        except Exception:  # noqa: BLE001 - an unreadable/unsafe file: opened (or refused) as before
            return False

    def _open_new(self, rows: list[ShipRow], fence: WorkerFence) -> dict[str, Any]:
        """The artifacts of the attempts not opened yet in this process, opened in one batch when
        the store can (else :meth:`_ship` opens each)."""
        new = [row for row in rows if row.attempt_id not in self._progress]
        store = self.store()
        open_many = getattr(store, "open_many", None)
        if len(new) < 2 or open_many is None:
            return {}
        states = open_many([(row.attempt_id, self._proof(row, fence)) for row in new], max_bytes=self.max_bytes)
        return {row.attempt_id: state for row, state in zip(new, states)}

    def _finalize_empty(self, empty: list[tuple[ShipRow, LeaseFence]]) -> None:
        """Finalize the round's empty logs of ended attempts (one batch when the store can)."""
        store = self.store()
        many = getattr(store, "finalize_empty_many", None)
        if len(empty) > 1 and many is not None:
            results = many([(row.attempt_id, proof) for row, proof in empty])
        else:
            results = [store.finalize(row.attempt_id, proof, total_bytes=0, sha256=_EMPTY_SHA256)
                       for row, proof in empty]
        crashpoint("ship.after_finalize")
        for (row, _proof), result in zip(empty, results):
            self._finalize_answer(row, result, 0)

    def _proof(self, row: ShipRow, fence: WorkerFence) -> LeaseFence:
        assert row.lease_token is not None
        return LeaseFence(self.worker_id, fence.generation, fence.session, row.attempt_id, row.lease_generation,
                          row.lease_token)

    def _ship(self, row: ShipRow, fence: WorkerFence, attempt: Any, state: Any = None,
              empty: list[tuple[ShipRow, LeaseFence]] | None = None) -> float:
        """Ship (and maybe finalize) one attempt's log; returns when it wants to be looked at again.
        ``state``: its artifact's answer to an open of this round's batch; ``empty``: where an
        ended attempt's empty log goes to be finalized with the round's others (else at once)."""
        proof = self._proof(row, fence)
        store = self.store()
        progress = self._progress.get(row.attempt_id)
        if progress is None:
            if state is None:
                state = store.open(row.attempt_id, proof, max_bytes=self.max_bytes)
            if state.fenced:
                return self._fenced(row, state.fence_reason or "FENCED")
            if state.finalized:
                self._acknowledged(row, state.total_bytes or 0)
                return self.interval_s
            progress = self._progress[row.attempt_id] = _Progress(state.committed_bytes, state.max_bytes)
            if state.committed_bytes:
                logger.info("attempt {}: log shipping resumes at byte {}", row.attempt_id, state.committed_bytes)
        ended = attempt.status in RUN_TERMINAL
        if ended:
            from ql_core.logs import finalize_log

            # Cut to the quota first: the local bytes are then final and the SHA is of exactly them.
            finalize_log(self.node, row.log_id)
        fd = _open_local(self.node.config.data_dir, row.log_id)
        try:
            size = 0 if fd is None else os.fstat(fd).st_size
            size = min(size, progress.max_bytes, self.max_bytes)
            pending = size - progress.committed
            now = time.monotonic()
            if pending > 0 and (ended or pending >= self.batch_bytes or now - progress.last_ship >= self.interval_s):
                assert fd is not None
                if not self._send(row, proof, progress, fd, size):
                    return self.interval_s
            if not ended:
                if size - progress.committed >= self.batch_bytes:
                    return 0.0
                return max(0.0, self.interval_s - (time.monotonic() - progress.last_ship))
            if progress.committed < size:
                return 0.0  # more to send first (its round budget ran out)
            if size == 0 and empty is not None:
                empty.append((row, proof))  # finalized with the round's other empty logs
                return self.interval_s
            sha = local_log_sha256(fd, size) if fd is not None else hashlib.sha256(b"").hexdigest()
        finally:
            if fd is not None:
                os.close(fd)
        result = store.finalize(row.attempt_id, proof, total_bytes=size, sha256=sha)
        crashpoint("ship.after_finalize")
        return self._finalize_answer(row, result, size)

    def _finalize_answer(self, row: ShipRow, result: Any, size: int) -> float:
        if result.acknowledged:
            self._acknowledged(row, size)
        elif result.answer is FinalizeAnswer.FENCED:
            return self._fenced(row, result.fence_reason or "FENCED")
        else:
            # The stored bytes differ from the local file (they cannot be rewritten): keep the local
            # log for good, say so once; the reader sees an artifact that never finalizes.
            logger.error("attempt {}: shipped log does not match the local log ({} bytes committed, {} local); "
                         "the local log is kept", row.attempt_id, result.committed_bytes, size)
            self.table.abandon(row.attempt_id, "MISMATCH")
            self._progress.pop(row.attempt_id, None)
        return self.interval_s

    def _send(self, row: ShipRow, proof: LeaseFence, progress: _Progress, fd: int, size: int) -> bool:
        """Send chunks from the committed offset up to ``size`` (at most a round's budget)."""
        store = self.store()
        budget = _ROUND_BYTES
        while progress.committed < size and budget > 0:
            at = progress.committed
            piece = os.pread(fd, min(MAX_CHUNK_BYTES, size - at), at)
            if not piece:
                return True  # the file shrank (cut to its quota): the next round sees the new size
            sha = hashlib.sha256(piece).hexdigest()
            result = self._append(store, row, proof, at, piece, sha)
            crashpoint("ship.after_append")
            answer = result.answer
            if answer in (AppendAnswer.APPENDED, AppendAnswer.DUPLICATE, AppendAnswer.GAP, AppendAnswer.CONFLICT):
                # duplicate/gap/conflict: our idea of the end was stale (a lost answer, a restart):
                # the store's committed offset is the truth.
                if answer is not AppendAnswer.APPENDED:
                    self._count(f"append_{answer}")
                progress.committed = result.committed_bytes
                progress.last_ship = time.monotonic()
                budget -= len(piece)
                self._count("bytes", len(piece))
            elif answer is AppendAnswer.CORRUPT:
                # Never expected from a faithful read: re-read next time; say so without any byte.
                progress.corrupt += 1
                self._count("append_corrupt")
                logger.warning("attempt {}: chunk at byte {} refused as corrupt; it is read again",
                               row.attempt_id, at)
                return False
            elif answer is AppendAnswer.QUOTA:
                progress.max_bytes = progress.committed  # nothing more fits
                return True
            elif answer is AppendAnswer.FINALIZED:
                self._acknowledged(row, result.committed_bytes)
                return False
            else:
                self._fenced(row, result.fence_reason or "FENCED")
                return False
            del piece
        return True

    def _append(self, store: ArtifactStore, row: ShipRow, proof: LeaseFence, at: int, piece: bytes,
                sha: str) -> Any:
        return store.append(row.attempt_id, proof, at, piece, sha)

    def _acknowledged(self, row: ShipRow, total: int) -> None:
        self.table.finalized(row.attempt_id, total)
        self._progress.pop(row.attempt_id, None)
        self._count("finalized")
        logger.info("attempt {}: log shipped and finalized ({} bytes)", row.attempt_id, total)

    def _fenced(self, row: ShipRow, reason: str) -> float:
        self._progress.pop(row.attempt_id, None)
        if reason in _PERMANENT or reason == "NOT_OPENED":
            if reason != "NOT_OPENED":
                logger.warning("attempt {}: the artifact store refuses its log ({}); the local log is kept",
                               row.attempt_id, reason)
                self.table.abandon(row.attempt_id, reason)
            return self.interval_s
        # This process's session is stale or lapsed: the control loop re-establishes it (or exits).
        self._count("fenced_session")
        return max(self.interval_s, 1.0)

    def _lease_state(self, attempt_id: str) -> str | None:
        leases = getattr(self.node.journal, "leases", None)
        if leases is None:
            return None
        row = leases.get(attempt_id)
        return None if row is None else str(row.state)

    def _delete_shipped(self) -> None:
        """Local copies of acknowledged logs, once the keep time passed (bounded page)."""
        from ql_core.log_retention import delete_log

        cutoff = now_ms() - self.keep_ms
        for row in self.table.due_deletions(cutoff):
            facts = self.node.journal.log_facts(row.log_id)
            try:
                if facts is not None and not facts.deleted:
                    delete_log(self.node, facts, now_ms())
                self.table.forget(row.attempt_id)
                self._count("local_deleted")
            except Exception as exc:  # noqa: BLE001 - retried next round
                logger.warning("attempt {}: shipped local log not deleted ({})", row.attempt_id, type(exc).__name__)
