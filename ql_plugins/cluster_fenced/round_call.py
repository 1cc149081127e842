"""One statement for a round of a worker's reports: starts, ``running`` reports and completions.

A control-loop round used to reach the control database up to four times after its claim: the
``start`` of the attempts it just claimed, the ``running`` reports of the attempts spawned since the
last round, the completions in the outbox (with their empty logs), each its own statement,
transaction and commit. For short tasks these are all due in the same round, and every transaction
costs the database a commit and the worker a round trip, whatever it carries. :func:`report_round`
makes them ONE statement — a ``UNION ALL`` of the batched functions (``ql_start_many``,
``ql_running_many``, ``ql_complete_many``, ``ql_artifact_empty_many``), each call still fenced on its
own inside its function — so they commit together or not at all, and every one of them is
replay-safe (a :class:`~.control_db.TransientError` may or may not have committed the lot).

The branches run in the order written (PostgreSQL's ``Append`` runs its children one after the
other, and each volatile function sees what the ones before it wrote): an attempt's ``running``
report is applied before its completion in the same statement, as it was a transaction earlier.
The rows share one shape — ``kind, ord`` then three text and four bigint columns — and each kind's
columns are put back into its own result type here. Needs revision 0016's functions (the caller
falls back to the separate calls when they are missing or not granted).

Since revision 0017 a completion may carry its attempt's spawn (``spawns``: the process start on the
database's clock, None for an attempt reported running already): the completions' branch is then
``ql_spawn_complete_many``, which makes the running transition (``attempt.spawned``) and the
completion together, so an attempt whose completion rides in this round needs no ``running`` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

from .control_db import ControlDB, ControlDBError
from .control_sql import FENCE_ARRAYS
from .pg_arrays import COMPLETE_TYPES, FENCE_TYPES, RUNNING_TYPES, BigintArray, array_columns
from .results import CompletionAnswer, CompletionResult, LeaseResult

if TYPE_CHECKING:
    from .control_db import Completion
    from .results import LeaseFence

__all__ = ["RoundAnswers", "report_round", "round_sql", "START", "RUNNING", "COMPLETE", "EMPTY"]

#: The kinds of call a round carries, in the order their branches run.
START, RUNNING, COMPLETE, EMPTY = 0, 1, 2, 3

_LEASE = ("ord, answer, reason, cancel_reason, NULL::text, lease_expires_at_ms, db_now_ms, cancel_requested_at_ms,"
          " deadline_at_ms")
_BRANCHES = {
    START: f"SELECT 0::integer AS kind, {_LEASE} FROM ql_start_many({FENCE_ARRAYS})",
    RUNNING: f"SELECT 1::integer, {_LEASE} FROM ql_running_many({FENCE_ARRAYS}, %b::bigint[])",
    COMPLETE: ("SELECT 2::integer, ord, answer, status, reason, fence_reason, NULL::bigint, db_now_ms, NULL::bigint,"
               f" NULL::bigint FROM ql_complete_many({FENCE_ARRAYS}, %b::integer[], %b::bigint[], %b::bigint[],"
               " %b::boolean[], %b::text[])"),
    EMPTY: ("SELECT 3::integer, ord, answer, NULL::text, NULL::text, fence_reason, NULL::bigint, NULL::bigint,"
            f" NULL::bigint, NULL::bigint FROM ql_artifact_empty_many({FENCE_ARRAYS}, %s::bigint)"),
}
#: The completions' branch when they carry their attempts' spawns (revision 0017).
_SPAWN_COMPLETE = _BRANCHES[COMPLETE].replace(" FROM ql_complete_many(", " FROM ql_spawn_complete_many(").replace(
    " %b::text[])", " %b::text[], %b::bigint[])")


@lru_cache(maxsize=None)
def round_sql(kinds: tuple[int, ...], with_spawns: bool = False) -> str:
    """The statement of a round carrying these kinds of call (at most 23 texts: each is prepared once);
    ``with_spawns``: its completions carry their spawns."""
    return " UNION ALL ".join(_SPAWN_COMPLETE if k == COMPLETE and with_spawns else _BRANCHES[k]
                              for k in sorted(kinds))


@dataclass
class RoundAnswers:
    """Each call's answer, in the order of its kind's calls; ``empties``: ``(answer, fence_reason)``."""

    starts: list[LeaseResult]
    runnings: list[LeaseResult]
    completions: list[CompletionResult]
    empties: list[tuple[str, str | None]]

    @property
    def db_now_ms(self) -> int | None:
        """The database's clock at the call (the session measures its offset from it)."""
        for res in (*self.starts, *self.runnings, *self.completions):
            if res.db_now_ms is not None:
                return res.db_now_ms
        return None


def report_round(db: ControlDB, *, starts: Sequence[LeaseFence] = (),
                 runnings: Sequence[tuple[LeaseFence, int]] = (),
                 completions: Sequence[tuple[LeaseFence, Completion]] = (),
                 empties: Sequence[LeaseFence] = (), max_bytes: int = 0,
                 spawns: Sequence[int | None] | None = None) -> RoundAnswers:
    """Every call of the round in ONE statement (one transaction, one round trip); see the module
    docstring (``spawns``: one per completion, revision 0017). Raises as
    :meth:`~.control_db.ControlDB.statement_rows` does: the caller makes the calls separately on a
    final error (one bad call never holds the others back)."""
    kinds: list[int] = []
    params: list[Any] = []
    if starts:
        kinds.append(START)
        params += array_columns([f.params() for f in starts], FENCE_TYPES)
    if runnings:
        kinds.append(RUNNING)
        params += array_columns([(*f.params(), started) for f, started in runnings], RUNNING_TYPES)
    if completions:
        kinds.append(COMPLETE)
        params += array_columns([c.params(f) for f, c in completions], COMPLETE_TYPES)
        if spawns is not None:
            if len(spawns) != len(completions):
                raise ValueError("one spawn (or None) per completion")
            params.append(BigintArray(spawns))
    if empties:
        kinds.append(EMPTY)
        params += [*array_columns([f.params() for f in empties], FENCE_TYPES), int(max_bytes)]
    answers = RoundAnswers([], [], [], [])
    if not kinds:
        return answers
    with_spawns = spawns is not None and bool(completions)
    rows = db.statement_rows("report_round", round_sql(tuple(kinds), with_spawns), params)
    by_kind: dict[int, list[tuple[Any, ...]]] = {k: [] for k in kinds}
    for row in rows:
        by_kind[row[0]].append(row[1:])
    expected = {START: len(starts), RUNNING: len(runnings), COMPLETE: len(completions), EMPTY: len(empties)}
    for kind, got in by_kind.items():
        if sorted(r[0] for r in got) != list(range(1, expected[kind] + 1)):
            raise ControlDBError("report_round", "unexpected rows")
        got.sort(key=lambda r: r[0])
    for kind, into in ((START, answers.starts), (RUNNING, answers.runnings)):
        for _ord, answer, reason, cancel, _t, expires, now, cancel_at, deadline in by_kind.get(kind, ()):
            into.append(ControlDB.lease_result((answer, reason, expires, now, cancel, cancel_at, deadline)))
    for _ord, answer, status, reason, fence_reason, _b, now, _b3, _b4 in by_kind.get(COMPLETE, ()):
        answers.completions.append(CompletionResult(CompletionAnswer(answer), status, reason, fence_reason, now))
    for _ord, answer, _t1, _t2, fence_reason, *_rest in by_kind.get(EMPTY, ()):
        answers.empties.append((answer, fence_reason))
    return answers
