"""Outcome rules: how a run ends, decided from facts only (DESIGN.md §2; ADR-0007 §2.5, §2.7).

Pure functions, no I/O: every path that ends an attempt (the waiting host,
receipt recovery, a follower, a cluster completion) asks the same questions
here, so the same facts always give the same verdict.

Rules, in order:

1. **Intents.** A committed user/policy/shutdown cancel is an intent effective
   at ``cancel_requested_at_ms``. The deadline is itself an intent, effective
   at ``deadline_at_ms``, persisted before spawn — whether or not a timeout
   cancel was committed yet (so a task that ends after its deadline is
   ``timed_out``, as ``timeout(1)`` users expect: 124). A committed ``timeout``
   cancel without a deadline is effective at its request time.
2. **Once ql has signalled the attempt** for a committed intent, that intent
   decides: the end of a task we killed is never reported as its own failure,
   and a verdict must not depend on two clocks agreeing.
3. Otherwise the intents the task did not beat — effective time ≤ its
   ``finished_at_ms`` (an upper bound of the true end) — apply, the earliest
   first (a tie goes to the committed cancel). None applies: the task's own
   outcome stands (exit 0 ``succeeded``, anything else ``failed``), and a
   committed cancel intent it beat is recorded *moot*.
4. **No receipt** (the process exited and nothing proves how): ``lost`` — or
   the committed intent's state when ql signalled it (we know why it ended).

Times from a receipt are clamped before they are compared: never before the
attempt's committed start, never after "now" (a receipt read now describes an
end that already happened; a clock running ahead cannot push it past a
deadline it did not miss). Deadlines and finish times are durations from the
committed start: a launcher writes ``finishedAtMs`` as the start + the time
elapsed on the boot clock, and "now" is the start + the elapsed time too when
the executor can measure it — so no wall clock of any host decides a verdict.
"""

from __future__ import annotations

from .value_class import value_class

__all__ = [
    "Verdict",
    "natural_status",
    "decide_outcome",
    "decide_without_receipt",
    "decide_never_ran",
    "clamp_times",
    "LOST_REASON",
    "TIMEOUT_REASON",
]

#: ``reason`` of an attempt whose process exited without a receipt.
LOST_REASON = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
TIMEOUT_REASON = "timeout"


@value_class()  # as @dataclass(frozen=True, slots=True), without its import-time code generation
class Verdict:
    """How an attempt (and its run) ends; ``moot`` names a committed cancel reason the task beat."""

    __slots__ = ("status", "reason", "moot")
    status: str
    reason: str | None
    moot: str | None

    def __init__(self, status: str, reason: str | None, moot: str | None = None) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "reason", reason)
        _set(self, "moot", moot)


def natural_status(exit_code: int) -> str:
    """The task's own outcome: exit 0 succeeded, anything else failed."""
    return "succeeded" if exit_code == 0 else "failed"


def _intent_status(cancel_reason: str) -> str:
    return "timed_out" if cancel_reason == TIMEOUT_REASON else "cancelled"


def decide_outcome(*, exit_code: int, finished_at_ms: int, deadline_at_ms: int | None,
                   cancel_reason: str | None, cancel_requested_at_ms: int | None,
                   signalled: bool) -> Verdict:
    """The verdict for a completion with ``exit_code`` that finished at (or before) ``finished_at_ms``."""
    if cancel_reason is not None and signalled:
        return Verdict(_intent_status(cancel_reason), cancel_reason)
    # (effective time, tie rank, status, reason): the committed cancel wins a tie with the deadline.
    intents: list[tuple[int, int, str, str]] = []
    if cancel_reason is not None and cancel_reason != TIMEOUT_REASON and cancel_requested_at_ms is not None:
        intents.append((cancel_requested_at_ms, 0, "cancelled", cancel_reason))
    if deadline_at_ms is not None:
        intents.append((deadline_at_ms, 1, "timed_out", TIMEOUT_REASON))
    elif cancel_reason == TIMEOUT_REASON and cancel_requested_at_ms is not None:
        intents.append((cancel_requested_at_ms, 0, "timed_out", TIMEOUT_REASON))
    applicable = sorted(i for i in intents if i[0] <= finished_at_ms)
    if applicable:
        _at, _rank, status, reason = applicable[0]
        return Verdict(status, reason)
    return Verdict(natural_status(exit_code), None, moot=cancel_reason)


def decide_without_receipt(*, cancel_reason: str | None, signalled: bool, lost_reason: str = LOST_REASON) -> Verdict:
    """The process exited and nothing proves how: lost, unless ql signalled it for a committed intent."""
    if cancel_reason is not None and signalled:
        return Verdict(_intent_status(cancel_reason), cancel_reason)
    return Verdict("lost", lost_reason)


def decide_never_ran(*, cancel_reason: str | None, signalled: bool, reason: str) -> Verdict:
    """Nothing ran (the task's start failed and nothing was handed over): ``failed`` — unless ql had
    signalled it for a committed intent, which is then why it could not start (a cancel that
    reached a standby launcher before its run did)."""
    if cancel_reason is not None and signalled:
        return Verdict(_intent_status(cancel_reason), cancel_reason)
    return Verdict("failed", reason)


def clamp_times(*, started_at_ms: int, finished_at_ms: int, created_at_ms: int,
                committed_started_at_ms: int | None, now_ms: int,
                elapsed_ms: int | None = None) -> tuple[int, int]:
    """(started, finished) of a claim, bounded by what is known: created ≤ started ≤ finished ≤ now.

    "Now" is on the start's clock when the executor can measure the attempt's duration on a clock
    that does not step (``elapsed_ms``: the boot clock, same boot): the committed start + that
    duration — the time base the launcher wrote ``finishedAtMs`` in. Otherwise ``now_ms`` (the
    store's wall clock) caps, and only when it is not before the attempt's own committed times (a
    store clock behind them proves nothing).
    """
    floor = max(created_at_ms, committed_started_at_ms or 0)
    started = max(started_at_ms, created_at_ms)
    finished = max(finished_at_ms, floor, started)
    if elapsed_ms is not None and committed_started_at_ms is not None:
        cap = max(committed_started_at_ms + elapsed_ms, floor)
        return min(started, cap), min(finished, cap)
    if now_ms >= floor:
        started = min(started, now_ms)
        finished = min(finished, now_ms)
    return started, finished
