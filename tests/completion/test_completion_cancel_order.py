"""Gate 7: both commit orders of cancel vs completion (ADR-0007 §2.7, DESIGN.md §2).

The transaction that commits first wins. A committed intent turns a later
completion into ``cancelled`` / ``timed_out`` (the real exit code is still
recorded); a cancel after the terminal commit is a no-op (no event, no
signal). And — better than the reference — a receipt whose ``finishedAtMs`` is
earlier than the intent's effective time keeps its own outcome and the intent
is recorded as moot.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.completion.completion_support import (
    assert_one_terminal,
    detach,
    dispatch_row,
    event_types,
    ql_json,
    receipt_path,
    reconcile,
    trigger_command,
    valid_receipt,
    wait_for,
)

from ql_core.cancellation import CancelRequest
from ql_core.clock import now_ms
from ql_core.consumer import ConsumeOutcome
from ql_core.ports import IdentityState
from ql_core.submit import create


def _identity(rt: Any, sub: Any) -> IdentityState:
    from tests.completion.completion_support import attempt_row

    return rt.executor.inspect(attempt_row(rt, sub.attempt_id)["handle"])


@pytest.fixture
def running(submit: Any, triggers: Any) -> Any:
    return lambda **kw: submit(trigger_command(triggers(), 0), **kw)


@pytest.fixture
def running_past_deadline(submit: Any, triggers: Any) -> Any:
    """A task that outlives its deadline: it ignores the TERM its launcher sends at the deadline
    (the KILL comes cancel_grace_s = 10 s later), so the receipt these tests plant decides."""
    def start(**kw: Any) -> Any:
        shell, flag, script = trigger_command(triggers(), 0)
        return submit([shell, flag, "trap '' TERM; " + script], **kw)
    return start


def _complete(rt: Any, sub: Any, **receipt: Any) -> Any:
    rt.receipts.publish(valid_receipt(sub, **receipt))
    return rt.consumer.consume(sub.attempt_id)


# -- (a) intent first ------------------------------------------------------------------------
def test_intent_first_then_a_receipt_finished_after_it_is_cancelled_with_the_real_exit_code(
        runtime: Any, running: Any) -> None:
    sub = running()
    assert runtime.canceller.request(sub.run_id, "user") is CancelRequest.REQUESTED
    requested_at = _cancel_time(runtime, sub)
    result = _complete(runtime, sub, exit_code=3, finished_at_ms=requested_at + 1)
    assert (result.outcome, result.status) == (ConsumeOutcome.APPLIED, "cancelled")
    events = assert_one_terminal(runtime, sub.run_id, "cancelled", 3)
    assert [e["type"] for e in events] == ["run.created", "attempt.spawned", "run.cancel_requested",
                                           "attempt.cancelled", "run.cancelled"]
    assert events[-1]["reason"] == "user"
    assert runtime.status(sub.run_id).attempts[0].exit_code == 3


def test_intent_first_boundary_equal_times_go_to_the_intent(runtime: Any, running: Any) -> None:
    sub = running()
    runtime.canceller.request(sub.run_id, "user")
    result = _complete(runtime, sub, exit_code=0, finished_at_ms=_cancel_time(runtime, sub))
    assert result.status == "cancelled"
    assert "run.cancel_moot" not in event_types(runtime, sub.run_id)


def test_intent_first_with_a_real_task_and_the_real_command(ql_env: dict[str, str], data_dir: Path,
                                                             runtime: Any, triggers: Any) -> None:
    trigger = triggers()
    rec = detach(ql_env, *trigger_command(trigger, 3))
    runtime.canceller.request(rec["run_id"], "user")  # committed; nothing dispatched yet
    trigger.touch()  # the task really ends after the intent, with exit code 3
    wait_for(lambda: receipt_path(data_dir, rec["attempt_id"]).exists(), what="the receipt")
    counts = reconcile(ql_env)
    assert counts["cancelled"] == 1
    assert_one_terminal(runtime, rec["run_id"], "cancelled", 3)
    # The dispatcher found the task already gone: no signal was needed.
    assert dispatch_row(runtime, rec["run_id"])["outcome"] == "already_exited"


# -- (b) completion first ------------------------------------------------------------------
def test_completion_first_then_cancel_is_a_no_op(runtime: Any, running: Any, ql_env: dict[str, str]) -> None:
    sub = running()
    assert _complete(runtime, sub, exit_code=0).status == "succeeded"
    before = runtime.events(sub.run_id)
    assert runtime.cancel(sub.run_id) is CancelRequest.ALREADY_TERMINAL
    assert ql_json(ql_env, "cancel", sub.run_id)["outcome"] == "already_terminal"
    assert runtime.events(sub.run_id) == before
    assert dispatch_row(runtime, sub.run_id) is None
    assert runtime.status(sub.run_id).cancel_reason is None
    # No signal: the (still running) process of the attempt is untouched.
    assert _identity(runtime, sub) is IdentityState.RUNNING
    assert_one_terminal(runtime, sub.run_id, "succeeded", 0)


# -- (c) finished before the intent: the intent is moot -----------------------------------
def test_a_bound_claim_defers_to_an_intent_seen_in_its_own_transaction(runtime: Any, running: Any) -> None:
    """A waiting host's reap is only an upper bound of the task's end: completed with ``bound=True``
    it writes nothing where an intent would apply — a committed cancel, or a deadline at or before
    the bound — and the launcher's precise receipt decides instead; with neither it applies."""
    from ql_core.completion import CompletionOutcome

    cancelled = running()
    runtime.canceller.request(cancelled.run_id, "user")
    due = running(timeout_s=600)
    for sub, finished in ((cancelled, None), (due, due.deadline_at_ms)):
        result = runtime.completion.complete(valid_receipt(sub, finished_at_ms=finished), executor=sub.executor,
                                             bound=True)
        assert result.outcome is CompletionOutcome.DEFERRED
        assert not runtime.status(sub.run_id).terminal
        assert not [t for t in event_types(runtime, sub.run_id) if t.startswith("attempt.") and t != "attempt.spawned"]
    plain = running(timeout_s=600)
    result = runtime.completion.complete(valid_receipt(plain, finished_at_ms=plain.deadline_at_ms - 1),
                                         executor=plain.executor, bound=True)
    assert (result.outcome, result.status) == (CompletionOutcome.APPLIED, "succeeded")


def test_receipt_finished_before_the_cancel_keeps_its_outcome(runtime: Any, running: Any) -> None:
    sub = running()
    runtime.canceller.request(sub.run_id, "user")
    requested_at = _cancel_time(runtime, sub)
    result = _complete(runtime, sub, exit_code=3, finished_at_ms=requested_at - 1)
    assert result.status == "failed"
    events = assert_one_terminal(runtime, sub.run_id, "failed", 3)
    assert [e["type"] for e in events] == ["run.created", "attempt.spawned", "run.cancel_requested",
                                           "run.cancel_moot", "attempt.failed", "run.failed"]
    assert events[3]["reason"] == "user"
    assert runtime.status(sub.run_id).reason is None


def test_receipt_finished_before_the_deadline_keeps_its_outcome_despite_a_later_timeout_intent(
        runtime: Any, running_past_deadline: Any) -> None:
    sub = running_past_deadline(timeout_s=0.2)
    wait_for(lambda: now_ms() > sub.deadline_at_ms, what="the deadline to pass")
    runtime.canceller.request(sub.run_id, "timeout")
    result = _complete(runtime, sub, exit_code=0, finished_at_ms=sub.deadline_at_ms - 1)
    assert result.status == "succeeded"
    events = assert_one_terminal(runtime, sub.run_id, "succeeded", 0)
    assert "run.cancel_moot" in [e["type"] for e in events]


# -- (d) timeout intent + a late successful receipt --------------------------------------
def test_timeout_intent_then_a_late_success_is_timed_out(runtime: Any, running_past_deadline: Any) -> None:
    sub = running_past_deadline(timeout_s=0.2)
    wait_for(lambda: now_ms() > sub.deadline_at_ms, what="the deadline to pass")
    runtime.canceller.request(sub.run_id, "timeout")
    result = _complete(runtime, sub, exit_code=0, finished_at_ms=sub.deadline_at_ms + 1)
    assert result.status == "timed_out"
    events = assert_one_terminal(runtime, sub.run_id, "timed_out", 0)
    assert events[-1]["reason"] == "timeout"
    assert "run.cancel_moot" not in [e["type"] for e in events]


def test_timeout_intent_committed_by_recovery_then_a_late_success(runtime: Any, running_past_deadline: Any,
                                                                  ql_env: dict[str, str]) -> None:
    """The persisted deadline, not an in-memory timer: `ql reconcile` commits the intent first."""
    sub = running_past_deadline(timeout_s=0.2)
    # The launcher is gone (and reaped) before its receipt is looked at: neither deferred (a live
    # launcher beside its live host) nor checked against the status the TERM would have given it.
    os.killpg(sub.task.live.process.pid, signal.SIGKILL)
    sub.task.live.process.wait(timeout=60)
    wait_for(lambda: now_ms() > sub.deadline_at_ms, what="the deadline to pass")
    # Publish the success first, finished after the deadline: the reconcile round commits the
    # timeout intent (step 1) before it reads any receipt (step 3), whatever the scan order.
    runtime.receipts.publish(valid_receipt(sub, exit_code=0, finished_at_ms=now_ms() + 1))
    counts = reconcile(ql_env)
    assert counts["timed_out"] == 1
    assert_one_terminal(runtime, sub.run_id, "timed_out", 0)


# -- both orders, raced for real -----------------------------------------------------------
def _cancel_time(rt: Any, sub: Any) -> int:
    value = rt.journal.run(sub.run_id).cancel_requested_at_ms
    assert value is not None
    return value


def race_cancel_and_completion(rt: Any, n: int) -> dict[str, int]:
    """For n attempts, a cancel and a completion (finished far after any intent) race in two threads.

    Attempts are created through the runtime's own create path (no process is needed: the race is
    between two transactions). Returns how often each side won.
    """
    subs = [create(rt.node) for _ in range(n)]
    for sub in subs:
        rt.receipts.publish(valid_receipt(sub, exit_code=0, finished_at_ms=now_ms() + 3_600_000))
    wins = {"cancel": 0, "completion": 0}
    for sub in subs:
        barrier = threading.Barrier(2)
        out: dict[str, Any] = {}

        def cancel() -> None:
            barrier.wait()
            out["cancel"] = rt.canceller.request(sub.run_id, "user")

        def complete() -> None:
            barrier.wait()
            out["complete"] = rt.consumer.consume(sub.attempt_id)

        threads = [threading.Thread(target=cancel), threading.Thread(target=complete)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert out["complete"].outcome is ConsumeOutcome.APPLIED
        types = [e.type for e in rt.events(sub.run_id)]
        if out["cancel"] is CancelRequest.REQUESTED:
            # The intent committed first: the completion converged to it.
            assert types.index("run.cancel_requested") < types.index("run.cancelled")
            assert_one_terminal(rt, sub.run_id, "cancelled", 0)
            wins["cancel"] += 1
        else:
            # The completion committed first: the cancel was a no-op, no event at all.
            assert out["cancel"] is CancelRequest.ALREADY_TERMINAL
            assert "run.cancel_requested" not in types
            assert dispatch_row(rt, sub.run_id) is None
            assert_one_terminal(rt, sub.run_id, "succeeded", 0)
            wins["completion"] += 1
    return wins


def test_cancel_and_completion_raced_for_real(runtime: Any) -> None:
    wins = race_cancel_and_completion(runtime, 30)
    assert sum(wins.values()) == 30
