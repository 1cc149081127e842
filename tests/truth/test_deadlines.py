"""A persisted deadline is honoured on every path, even when the task ends shortly after it.

`ql run --timeout 1.2 -- sleep 1.8` used to end `succeeded` (exit 0): the waiting host looked at the
deadline once a second and the outcome mapping consulted it only once a timeout intent was
committed. The deadline is itself the intent (ADR-0007 §2.7): a task that finished after it is
`timed_out` (124, as `timeout(1)` gives), whichever transaction commits first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import json_lines, run_ql

BOUND_S = 60


def _status(ql_env: dict[str, str], run_id: str) -> dict:
    out = run_ql(["--json", "status", run_id], ql_env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def test_ql_run_stops_a_task_at_its_deadline_not_at_its_own_end(ql_env: dict[str, str]) -> None:
    out = run_ql(["--json", "run", "--timeout", "1.2", "--", "sleep", "4"], ql_env, timeout=BOUND_S)
    assert out.returncode == 124, (out.returncode, out.stderr)
    # The precise timer fired: the task was ended by the TERM (128 + 15), it did not run to its own end
    # (exit 0, 2.8 s after the deadline). The evidence is the exit code, not the wall clock, which a
    # loaded machine stretches.
    final = json_lines(out.stdout)[-1]
    assert (final["status"], final["exit_code"]) == ("timed_out", 143), final


def test_a_task_that_ignores_term_and_exits_0_after_its_deadline_is_timed_out(ql_env: dict[str, str]) -> None:
    script = "trap '' TERM; sleep 1.0; exit 0"
    out = run_ql(["--json", "run", "--timeout", "0.4", "--", "sh", "-c", script], ql_env, timeout=BOUND_S)
    assert out.returncode == 124, out.stderr
    final = json_lines(out.stdout)[-1]
    assert (final["status"], final["exit_code"]) == ("timed_out", 0)


def test_a_task_done_before_its_deadline_keeps_its_own_outcome(ql_env: dict[str, str]) -> None:
    assert run_ql(["run", "--timeout", "30", "--", "sh", "-c", "exit 3"], ql_env).returncode == 3


def test_recovery_applies_the_deadline_though_nobody_signalled(ql_env: dict[str, str], data_dir: Path) -> None:
    """No host waits and no intent was committed before the task ended after its deadline. (The
    launcher TERMs the group at the deadline itself: the task ignores TERM so that it still ends on
    its own, 0, within the KILL's grace.)"""
    rec = json_lines(run_ql(["--json", "run", "--detach", "--timeout", "0.3", "--", "sh", "-c",
                             "trap '' TERM; sleep 0.8"], ql_env).stdout)[0]
    receipt = data_dir / "receipts" / rec["attempt_id"][-2:] / f"{rec['attempt_id']}.json"
    deadline = time.monotonic() + BOUND_S
    while not receipt.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert json.loads(receipt.read_text())["exitCode"] == 0
    counts = json_lines(run_ql(["--json", "reconcile"], ql_env).stdout)[0]
    assert counts["timed_out"] == 1
    view = _status(ql_env, rec["run_id"])
    assert (view["status"], view["exit_code"], view["reason"]) == ("timed_out", 0, "timeout")


def test_a_follower_enforces_the_deadline(ql_env: dict[str, str]) -> None:
    """`ql logs -f` on a detached run past its deadline commits the intent and stops the task."""
    rec = json_lines(run_ql(["--json", "run", "--detach", "--timeout", "0.5", "--", "sleep", "30"],
                            ql_env).stdout)[0]
    started = time.monotonic()
    out = run_ql(["logs", "--follow", rec["run_id"]], ql_env, timeout=BOUND_S)
    assert out.returncode == 124, out.stderr  # --follow exits with the run's status: timed out
    assert time.monotonic() - started < 20
    view = _status(ql_env, rec["run_id"])
    assert (view["status"], view["reason"]) == ("timed_out", "timeout")
