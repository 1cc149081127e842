"""The kill loop's judge: every run's verdict against what it was asked and what was done to it.

Pure: :func:`judge` takes the facts of one ended run — its row and events, the marks its task left on
the boot clock (``kill_loop_tasks``), what the loop did to it, what its waiting hosts were told — and
returns the rules it broke. Boot-clock facts bound the committed start from both sides: the start
recorded in the attempt's handle is at or before it (a standby's handle is stamped just before the
create commit), the task's own start mark after it. So each rule below holds whatever any process's
wall clock said, however loaded the machine:

- exactly one ``run.<terminal>`` event;
- never a false success: ``succeeded`` only for exit code 0, never for a task killed before its
  receipt existed;
- a recorded exit code is the task's true one (or ≥ 128 for a run ql stopped);
- ``timed_out`` only with a deadline; ``cancelled`` only if a cancel was asked; a run whose deadline
  is far below its duration never keeps its own outcome; ``failed`` without an exit code (nothing
  ran) only for a task that never started because the loop killed its launcher first;
- ``lost`` only with a recovery reason; no true receipt loses the race to another verdict; no
  receipt is left behind;
- a task that finished before its deadline never ends ``timed_out`` (its result existed first);
- a deadline is never enforced early: no TERM reaches a task before its deadline unless a cancel
  was asked;
- a deadline is never enforced late: a task never sleeps out its whole duration more than
  :data:`LATE_SLACK_S` past its deadline while its launcher lives;
- a task that ran to its end untouched (not killed, no cancel, before any deadline) ends with its
  own outcome and exit code; a task that started untouched never ends ``lost`` (its launcher lived
  to publish the result);
- what a waiting host was told (``Runtime.wait``, ``ql run``'s last line and exit status) is how the
  run ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .kill_loop_tasks import Asked, Marks

__all__ = ["END_MARGIN_S", "LATE_SLACK_S", "RunFacts", "judge"]

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
LOST_REASONS = ("RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT", "RECOVERY_NEVER_STARTED")
#: /proc/uptime's resolution: a mark is up to this much earlier than the moment it records.
MARK_RES_S = 0.01
#: Slack for the launcher's boot-clock timer against a mark (ms rounding of the recorded start).
EARLY_EPS_S = 0.02
#: A task whose end mark is this far before its deadline finished before it: its exit follows the
#: mark by one shell builtin, so only a machine stalled this long could make the exit itself late.
END_MARGIN_S = 0.5
#: How late a launcher may enforce a deadline (its timer's wake-up and TERM on a loaded machine).
LATE_SLACK_S = 1.0
#: What ``ql run`` exits with for a run that did not end with its own outcome (DESIGN.md §7).
QL_RUN_EXIT = {"timed_out": 124, "cancelled": 130, "lost": 75}


@dataclass
class RunFacts:
    """One ended run and everything the loop knows about it."""

    run_id: str
    asked: Asked
    status: str
    exit_code: int | None
    reason: str | None
    events: list[str]
    marks: Marks
    #: The attempt's start on the boot clock as its handle records it (at or before the committed
    #: start); None without a handle.
    start_boot_s: float | None
    #: What the loop SIGKILLed of this run's attempt: "group" or "launcher".
    killed: str | None = None
    #: A receipt was there once the killed launcher was dead (published before the kill).
    published_before_kill: bool = False
    cancel_asked: bool = False
    receipt_left: bool = False
    #: (status, exit code) each waiting host was told.
    host_saw: list[tuple[str, int | None]] = field(default_factory=list)
    #: Exit statuses of foreground `ql run` processes of this run that ended on their own.
    ql_run_exits: list[int] = field(default_factory=list)
    #: What else happened to its host (a clock, a freeze): for the reader of a violation only.
    context: str = ""

    def where(self) -> str:
        return (f"run {self.run_id} {self.asked.name} -> {self.status}/{self.exit_code}/{self.reason} "
                f"killed={self.killed} cancel={self.cancel_asked} marks={self.marks} start_boot={self.start_boot_s} "
                f"events={','.join(self.events)} {self.context}")


def _before_deadline(f: RunFacts, at: float, margin: float) -> bool:
    """``at`` (a mark) is more than ``margin`` before the deadline, for sure (True only with a deadline
    and a recorded start)."""
    return (f.asked.timeout > 0 and f.start_boot_s is not None
            and at + MARK_RES_S < f.start_boot_s + f.asked.timeout - margin)


def judge(f: RunFacts) -> list[str]:
    """The rules ``f`` broke (each a line naming the rule and the run)."""
    out: list[str] = []
    code, duration, timeout = f.asked.code, f.asked.duration, f.asked.timeout
    marks = f.marks
    where = f.where()
    if sum(1 for t in f.events if t.startswith("run.") and t[4:] in TERMINAL) != 1:
        out.append(f"not exactly one terminal event: {where}")
    if f.status == "succeeded" and (code != 0 or (f.killed and not f.published_before_kill)):
        out.append(f"false success: {where}")
    if f.exit_code is not None and f.exit_code != code and not (
            f.status in ("cancelled", "timed_out") and f.exit_code >= 128):
        out.append(f"wrong exit code: {where}")
    if f.status == "timed_out" and timeout == 0:
        out.append(f"timed out without a deadline: {where}")
    if f.status == "cancelled" and not f.cancel_asked:
        out.append(f"cancelled without a cancel: {where}")
    if f.status in ("succeeded", "failed") and f.exit_code is not None and timeout and timeout < duration:
        out.append(f"outlived its deadline yet kept its own outcome: {where}")
    if f.status == "failed" and f.exit_code is None and (marks.start is not None or f.killed is None):
        # "Nothing ran" (its launcher was gone before the hand-over): only a kill of ours does that.
        out.append(f"failed as never run, yet it ran or nothing stopped it: {where}")
    if f.status == "lost" and f.reason not in LOST_REASONS:
        out.append(f"lost for an unexpected reason: {where}")
    if "attempt.late_callback_ignored" in f.events:
        out.append(f"a true receipt lost the race to another verdict: {where}")
    if f.receipt_left:
        out.append(f"receipt left behind: {where}")

    # Deadlines, judged on the boot clock.
    finished_in_time = (marks.end is not None and marks.term is None
                        and _before_deadline(f, marks.end, END_MARGIN_S))
    if f.status == "timed_out" and finished_in_time:
        out.append(f"finished before its deadline, yet timed_out: {where}")
    if marks.term is not None and not f.cancel_asked and (timeout == 0 or _before_deadline(f, marks.term, EARLY_EPS_S)):
        out.append(f"TERMed before its deadline without a cancel: {where}")
    if (timeout > 0 and marks.start is not None and marks.end is not None and f.killed != "launcher"
            and marks.end > marks.start + MARK_RES_S + timeout + LATE_SLACK_S):
        out.append(f"deadline enforced late (slept out its duration past it): {where}")

    untouched = f.killed is None and not f.cancel_asked
    if (untouched and marks.end is not None and marks.term is None
            and (timeout == 0 or _before_deadline(f, marks.end, END_MARGIN_S))
            and (f.status not in ("succeeded", "failed") or f.exit_code != code)):
        out.append(f"ran to its end untouched, yet not its own outcome: {where}")
    if untouched and marks.start is not None and f.status == "lost":
        out.append(f"started untouched, yet lost: {where}")

    for seen in f.host_saw:
        if seen != (f.status, f.exit_code):
            out.append(f"a waiting host was told {seen[0]}/{seen[1]}: {where}")
    expected = QL_RUN_EXIT.get(f.status, f.exit_code if f.exit_code is not None else 1)
    for rc in f.ql_run_exits:
        if rc != expected:
            out.append(f"ql run exited {rc}, not {expected}: {where}")
    return out
