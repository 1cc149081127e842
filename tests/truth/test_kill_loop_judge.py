"""The kill loop's judge catches what it is there to catch (fast: facts written by hand).

A loop that finds nothing proves something only if its judge would have said so: each rule is shown
breaking on facts that break it, and staying quiet on the true verdicts next to them (a deadline
enforced on time, a kill the loop made, a cancel it asked for).
"""

from __future__ import annotations

import dataclasses

import pytest

from .kill_loop_judge import RunFacts, judge
from .kill_loop_tasks import Asked, Marks, parse_name


def _facts(**changes: object) -> RunFacts:
    """A task asked ``exit 0`` after 0.2 s with a 3 s deadline that did just that."""
    base = RunFacts(run_id="r", asked=Asked(0, 0.2, 3.0, "k"), status="succeeded", exit_code=0, reason=None,
                    events=["run.created", "attempt.spawned", "attempt.succeeded", "run.succeeded"],
                    marks=Marks(start=100.0, end=100.2), start_boot_s=99.99)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


TIMED_OUT = ["run.created", "attempt.spawned", "run.cancel_requested", "attempt.timed_out", "run.timed_out"]
LONG_SHORT = Asked(0, 1.5, 0.1, "k")  # a 1.5 s task with a 0.1 s deadline


@pytest.mark.parametrize(("changes", "rule"), [
    ({"events": ["run.created", "run.succeeded", "run.failed"]}, "not exactly one terminal event"),
    ({"asked": Asked(1, 0.2, 3.0, "k")}, "false success"),
    ({"killed": "group"}, "false success"),
    ({"exit_code": 7}, "wrong exit code"),
    ({"asked": Asked(0, 0.2, 0.0, "k"), "status": "timed_out", "events": TIMED_OUT}, "timed out without a deadline"),
    ({"status": "cancelled", "exit_code": None}, "cancelled without a cancel"),
    ({"asked": LONG_SHORT, "marks": Marks(start=100.0, term=100.1)}, "outlived its deadline"),
    ({"status": "lost", "exit_code": None, "reason": "WHATEVER", "marks": Marks()}, "lost for an unexpected reason"),
    ({"events": ["run.created", "run.succeeded", "attempt.late_callback_ignored"]}, "a true receipt lost the race"),
    ({"receipt_left": True}, "receipt left behind"),
    ({"status": "failed", "exit_code": None, "reason": "SPAWN_FAILED"}, "failed as never run"),
    # The deadline rules, on the boot clock.
    ({"status": "timed_out", "events": TIMED_OUT}, "finished before its deadline, yet timed_out"),
    ({"status": "timed_out", "exit_code": 143, "events": TIMED_OUT, "marks": Marks(start=100.0, term=101.0)},
     "TERMed before its deadline"),
    ({"asked": Asked(0, 0.2, 0.0, "k"), "status": "failed", "exit_code": 143, "marks": Marks(start=100.0, term=100.1)},
     "TERMed before its deadline"),
    ({"asked": LONG_SHORT, "status": "timed_out", "events": TIMED_OUT, "marks": Marks(start=100.0, end=101.5)},
     "deadline enforced late"),
    ({"status": "lost", "exit_code": None, "reason": "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"},
     "ran to its end untouched, yet not its own outcome"),
    ({"status": "lost", "exit_code": None, "reason": "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT",
      "marks": Marks(start=100.0)}, "started untouched, yet lost"),
    ({"host_saw": [("timed_out", 0)]}, "a waiting host was told timed_out/0"),
    ({"ql_run_exits": [124]}, "ql run exited 124, not 0"),
])
def test_each_rule_breaks_on_facts_that_break_it(changes: dict, rule: str) -> None:
    found = judge(_facts(**changes))
    assert any(rule in line for line in found), found


@pytest.mark.parametrize("changes", [
    {},
    # Timed out at its deadline, by the launcher's TERM (143) or its KILL (no mark).
    {"asked": Asked(0, 0.8, 0.1, "k"), "status": "timed_out", "exit_code": 143, "events": TIMED_OUT,
     "marks": Marks(start=100.0, term=100.1)},
    {"asked": Asked(0, 0.8, 0.1, "k"), "status": "timed_out", "exit_code": None, "events": TIMED_OUT,
     "marks": Marks(start=100.0)},
    # A task that finished after its deadline (1.5 s task, 0.1 s deadline, late by less than the slack).
    {"asked": LONG_SHORT, "status": "timed_out", "events": TIMED_OUT, "marks": Marks(start=100.0, end=100.9)},
    # Its launcher killed by the loop: the deadline is then recovery's, whenever it looks.
    {"asked": LONG_SHORT, "status": "timed_out", "events": TIMED_OUT, "marks": Marks(start=100.0, end=101.5),
     "killed": "launcher"},
    # Killed before its receipt: lost, or nothing ran at all.
    {"status": "lost", "exit_code": None, "reason": "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT", "killed": "group",
     "marks": Marks(start=100.0)},
    {"status": "failed", "exit_code": None, "reason": "SPAWN_FAILED", "killed": "group", "marks": Marks()},
    # A cancel the loop asked for, which TERMed it.
    {"status": "cancelled", "exit_code": 143, "reason": "user", "cancel_asked": True,
     "marks": Marks(start=100.0, term=100.1)},
    # A waiting host told the truth; `ql run` exiting with the task's code, or 124 for a timeout.
    {"host_saw": [("succeeded", 0)], "ql_run_exits": [0]},
    {"asked": Asked(3, 0.8, 0.1, "k"), "status": "timed_out", "exit_code": 143, "events": TIMED_OUT,
     "marks": Marks(start=100.0, term=100.1), "ql_run_exits": [124]},
])
def test_true_verdicts_pass(changes: dict) -> None:
    assert judge(_facts(**changes)) == []


def test_a_run_name_says_what_was_asked() -> None:
    asked = Asked(42, 0.4, 0.1, "h3-5")
    assert parse_name(asked.name) == asked
