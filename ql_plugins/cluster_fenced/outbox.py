"""What a worker submits for an attempt that ended locally, and the database clock it is stated in.

The payload is derived from the worker's *local* terminal attempt row — the row that the local
CompletionService committed from the receipt (or the live wait, or recovery) — never from the
local verdict: the control plane decides the outcome itself, with its own intents
(``docs/cluster.md``, "What each answer means"). It is computed once and stored in the outbox row
with its ``completion_digest``, so every replay is byte-identical and an exact replay after a lost
COMMIT answer is recognised (``already_completed``).

Times are translated to the database clock with the offset measured on the worker's own calls
(:class:`DbClock`) and rounded *up* for the finish (``finishedAtMs`` stays an upper bound); the
database clamps them again (later than db now + 5 min → db now; never before the attempt's start).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .results import completion_digest

if TYPE_CHECKING:
    from ql_core.records import AttemptRecord, DispatchRecord

    from .worker_tables import LeaseRow

__all__ = ["Payload", "DbClock", "build_payload", "signalled_by", "NEVER_STARTED", "DRAINED", "FENCED", "SELF_FENCED", "WORKER_FENCED",
           "REASON_PATTERN"]

#: The database's pattern for an end reason.
REASON_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,79}")
#: Local reason of an attempt that provably never started (its host died before releasing it:
#: ql_core.never_started) — the command never ran.
NEVER_STARTED = "RECOVERY_NEVER_STARTED"
#: stop reasons: the worker stopped the task itself.
DRAINED = "WORKER_DRAINED"
#: The database told the worker its lease is gone (or its generation was replaced): permanent.
FENCED = "FENCED"
#: The worker's own lease deadline passed without a renewal: it stopped the task itself.
SELF_FENCED = "SELF_FENCED"
#: Reason of the ``lost`` report for a task the worker stopped when it fenced itself.
WORKER_FENCED = "WORKER_FENCED"


@dataclass(frozen=True, slots=True)
class Payload:
    """``complete`` (exit code, times in db clock, signalled, digest) or ``lost`` / ``released``."""

    kind: str
    exit_code: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    signalled: bool = False
    reason: str | None = None
    digest: str | None = None


class DbClock:
    """The offset between this worker's wall clock and the control database's.

    Every answer carries ``db_now_ms``; the call was sent at local ``sent`` and answered at local
    ``answered``, so ``db − local`` lies in ``[db_now − answered, db_now − sent]``. The latest
    measurement wins (wall clocks step).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._low: int | None = None
        self._high: int | None = None

    def observe(self, sent_ms: int, answered_ms: int, db_now_ms: int | None) -> None:
        if db_now_ms is None:
            return
        with self._lock:
            self._low, self._high = db_now_ms - answered_ms, db_now_ms - sent_ms

    @property
    def known(self) -> bool:
        return self._high is not None

    def to_db(self, local_ms: int | None, *, upper: bool) -> int | None:
        """``local_ms`` on the database clock: an upper bound (finish) or a lower bound (start)."""
        if local_ms is None:
            return None
        with self._lock:
            offset = self._high if upper else self._low
        return local_ms if offset is None else local_ms + offset

    def to_local(self, db_ms: int | None) -> int | None:
        """A database time on this worker's wall clock (the earliest it can be here)."""
        if db_ms is None:
            return None
        with self._lock:
            offset = self._high
        return db_ms if offset is None else db_ms - offset


def _reason(value: str | None) -> str | None:
    return value if value is not None and REASON_PATTERN.fullmatch(value) else None


def signalled_by(dispatch: DispatchRecord | None, attempt_id: str) -> bool:
    """Did ql signal this attempt for an intent the control plane delivered? (Only those make local
    dispatch records; the database counts it only if it delivered the intent to this lease.) The
    journal kernel's ``Snapshot.signalled``, from a dispatch read on its own."""
    return dispatch is not None and dispatch.attempt_id == attempt_id and dispatch.term_sent_at_ms is not None


def build_payload(attempt: AttemptRecord, signalled: bool, row: LeaseRow, clock: DbClock) -> Payload:
    """The outbox payload of a locally ended attempt (see the module docstring); ``signalled``:
    :func:`signalled_by` of the run's dispatch."""
    stopped_at = row.stopped_at_ms
    beat_the_stop = (stopped_at is not None and attempt.finished_at_ms is not None
                     and attempt.finished_at_ms < stopped_at)
    if row.stop_reason == DRAINED and not beat_the_stop:
        # Handed back on drain: the worker stopped it. Its exit status is ours, not the task's.
        return Payload("lost", reason=DRAINED)
    if row.stop_reason == SELF_FENCED and not beat_the_stop and not signalled:
        # The worker stopped it on its own deadline: the exit status is ours, and the lease may even
        # still be live at the database (a renewal that arrived late): report the truth, "lost".
        return Payload("lost", reason=WORKER_FENCED)
    if attempt.exit_code is not None:
        started = clock.to_db(attempt.started_at_ms, upper=False)
        finished = clock.to_db(attempt.finished_at_ms, upper=True)
        assert finished is not None
        return Payload("complete", exit_code=attempt.exit_code, started_at_ms=started, finished_at_ms=finished,
                       signalled=signalled,
                       digest=completion_digest(attempt.id, exit_code=attempt.exit_code, started_at_ms=started,
                                                finished_at_ms=finished, signalled=signalled))
    if attempt.reason == NEVER_STARTED:
        return Payload("released")  # provably never started: back to the queue, no retry consumed
    if attempt.status in ("cancelled", "timed_out"):
        # Exited without a receipt after ql signalled it for the intent: the intent decides.
        return Payload("lost", signalled=signalled)
    return Payload("lost", reason=_reason(attempt.reason), signalled=signalled)
