"""Every crash point of the protocol (ADR-0007 §6 gates 2 and 3, DESIGN.md §8).

A waiting ``ql run`` completes through acknowledged completion (its task's
receipt is held back until the host committed the status it reaped), so the
``[run]`` host meets ``completion.before_commit`` and the ``wait.*`` points;
the receipt consumer's points are met by ``ql reconcile``.

Each case makes a real ``ql`` process (or a small Python publisher) die with
``os._exit`` exactly at one named step, checks what must hold at that instant
(above all: no receipt deleted before its commit, no terminal state without
its commit), then restarts with plain ``ql reconcile`` and checks the end:
exactly one ``run.<terminal>`` and one ``attempt.<terminal>`` event, the true
outcome and exit code, and a journal that still indexes every receipt that
exists.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from tests.completion.completion_support import (
    assert_not_terminal,
    assert_one_terminal,
    attempt_row,
    host_gone,
    detach,
    dispatch_row,
    event_types,
    journal_row,
    only_run_id,
    plant,
    ql,
    ql_crash,
    quarantine_path,
    receipt_bytes,
    receipt_path,
    reconcile,
    temp_files,
    trigger_command,
    valid_receipt,
    wait_for,
    write_config,
)

from ql_core.crashpoints import CRASH_EXIT_CODE, CRASH_POINTS
from ql_core.ports import IdentityState
from tests.conftest import classic_env

LOST_REASON = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"


@dataclass
class Ctx:
    env: dict[str, str]
    data_dir: Path
    rt: Any
    trigger: Callable[[], Path]
    submit: Callable[..., Any]
    tmp_path: Path

    def receipt(self, attempt_id: str) -> Path:
        return receipt_path(self.data_dir, attempt_id)

    def handle(self, attempt_id: str) -> str | None:
        return attempt_row(self.rt, attempt_id)["handle"]

    def identity(self, attempt_id: str) -> IdentityState:
        return self.rt.executor.inspect(self.handle(attempt_id))


def finished_detached(c: Ctx, exit_code: int = 7) -> tuple[str, str]:
    """A detached task that ended and published its receipt, which nobody has consumed."""
    rec = detach(c.env, "sh", "-c", f"exit {exit_code}")
    wait_for(lambda: c.receipt(rec["attempt_id"]).exists(), what="the launcher's receipt")
    return rec["run_id"], rec["attempt_id"]


def host_crashes_at(c: Ctx, point: str, host: str) -> tuple[str, str]:
    """A task ending with exit 7 whose completing host (`ql reconcile` or `ql run`) dies at ``point``.

    A `ql run` host awaits its task: the receipt is held back by the launcher's publisher until the
    host acknowledges, and published when the host dies without having done so."""
    if host == "reconcile":
        run_id, attempt_id = finished_detached(c)
        ql_crash(c.env, point, "reconcile")
    else:
        ql_crash(c.env, point, "run", "--", "sh", "-c", "exit 7")
        run_id = only_run_id(c.rt)
        attempt_id = c.rt.status(run_id).attempts[0].attempt_id
    return run_id, attempt_id


def assert_journal_consistent(c: Ctx, attempt_id: str) -> None:
    """A receipt that exists is always indexed; a row is only ever pending or quarantined."""
    row = journal_row(c.rt, attempt_id)
    if c.receipt(attempt_id).exists():
        assert row is not None, "a receipt exists but its journal row is gone"
    if row is not None:
        assert row["state"] in ("pending", "quarantined")


# -- the cases -------------------------------------------------------------------------
def case_create_before_commit(c: Ctx) -> None:
    marker = c.tmp_path / "spawned"
    # Under a subreaper: the dead host's standby launcher is reparented to it (not to init), so
    # only this host's own processes count, whatever other suites run on the machine.
    ql_crash(c.env, "create.before_commit", "run", "--", "sh", "-c", f'touch "{marker}"', subreaper=True)
    # Nothing was persisted, so nothing was spawned: not even the log file was opened.
    assert c.rt.list_runs() == []
    assert [p for p in (c.data_dir / "logs").rglob("*") if p.is_file()] == []
    assert [p for p in (c.data_dir / "receipts").rglob("*") if p.is_file()] == []
    # The standby launcher the host had ready (it holds nothing of a run) went with its host:
    # ql_crash's subreaper saw every process the host started exit (else its exit code is 97).
    counts = reconcile(c.env)
    assert counts["attempts_checked"] == 0
    assert not any(counts[k] for k in ("applied", "already_terminal", "quarantined", "lost", "blocked"))
    assert c.rt.list_runs() == [] and not marker.exists()
    # The database is intact: the same command now runs to completion.
    out = ql(c.env, "run", "--", "sh", "-c", f'touch "{marker}"')
    assert out.returncode == 0, out.stderr
    assert marker.exists()
    assert_one_terminal(c.rt, only_run_id(c.rt), "succeeded", 0)


def case_spawn_after_log_created(c: Ctx) -> None:
    """Classic path: the host dies between creating the log and forking: no process ever existed.
    Recovery proves it from the dead host's identity at once (it used to leave the run queued for
    ever)."""
    marker = c.tmp_path / "ran"
    ql_crash(classic_env(c.env, c.tmp_path), "spawn.after_log_created", "run", "--", "sh", "-c", f'touch "{marker}"')
    run_id = only_run_id(c.rt)
    assert reconcile(c.env)["lost"] == 1
    assert_one_terminal(c.rt, run_id, "lost", None)
    assert c.rt.status(run_id).reason == "RECOVERY_NEVER_STARTED"
    assert not marker.exists()


def case_spawn_after_log_created_standby(c: Ctx) -> None:
    """Standby path: the create commit already holds the standby launcher's handle when the host
    dies before handing it the run. The launcher reads EOF and exits having run nothing; recovery
    finds it gone without a receipt: ``lost`` (the never-started proof needs the classic path's
    second commit), and nothing ran or claims to have."""
    marker = c.tmp_path / "ran"
    ql_crash(c.env, "spawn.after_log_created", "run", "--", "sh", "-c", f'touch "{marker}"; exit 0')
    run_id = only_run_id(c.rt)
    attempt_id = c.rt.status(run_id).attempts[0].attempt_id
    row = attempt_row(c.rt, attempt_id)
    assert row["status"] == "running" and row["handle"] is not None  # one commit held run and handle
    wait_for(lambda: c.identity(attempt_id) is IdentityState.EXITED, what="the standby to read EOF and exit")
    assert reconcile(c.env)["lost"] == 1
    assert_one_terminal(c.rt, run_id, "lost", None)
    assert c.rt.status(run_id).reason == LOST_REASON
    assert event_types(c.rt, run_id) == ["run.created", "attempt.spawned", "attempt.lost", "run.lost"]
    assert not marker.exists() and not c.receipt(attempt_id).exists()  # the command never ran


def case_spawn_before_handle_commit(c: Ctx) -> None:
    """Classic path: the host dies after spawning, before the handle commit: the held command never
    runs, and recovery proves it from the dead host's identity — no timer, no guess, no orphaned
    task."""
    marker = c.tmp_path / "ran"
    ql_crash(classic_env(c.env, c.tmp_path), "spawn.before_handle_commit", "run", "--", "sh", "-c",
             f'touch "{marker}"; exit 7')
    run_id = only_run_id(c.rt)
    attempt_id = c.rt.status(run_id).attempts[0].attempt_id
    row = attempt_row(c.rt, attempt_id)
    assert (row["status"], row["handle"]) == ("starting", None)
    assert c.rt.journal.attempt(attempt_id).host_handle is not None  # SQLite: in its run's row (0019)
    counts = reconcile(c.env)
    assert (counts["lost"], counts["applied"], counts["blocked"]) == (1, 0, 0)
    assert_one_terminal(c.rt, run_id, "lost", None)
    assert c.rt.status(run_id).reason == "RECOVERY_NEVER_STARTED"
    assert event_types(c.rt, run_id) == ["run.created", "attempt.lost", "run.lost"]
    assert not marker.exists() and not c.receipt(attempt_id).exists()  # the command never ran


def case_start_after_hand_over(c: Ctx) -> None:
    """Standby path: the host dies right after handing the launcher its run. The command runs to
    its end; its held receipt is published because no acknowledgement can come; recovery applies
    the true status — exactly one terminal event."""
    marker = c.tmp_path / "ran"
    ql_crash(c.env, "start.after_hand_over", "run", "--", "sh", "-c", f'touch "{marker}"; exit 7')
    run_id = only_run_id(c.rt)
    attempt_id = c.rt.status(run_id).attempts[0].attempt_id
    wait_for(lambda: c.receipt(attempt_id).exists(), what="the receipt of the orphaned task")
    assert marker.exists()
    assert reconcile(c.env)["applied"] == 1
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert event_types(c.rt, run_id) == ["run.created", "attempt.spawned", "attempt.failed", "run.failed"]


PUBLISHER = """
import sys
from ql_core.receipts import FileReceiptStore, parse_receipt
FileReceiptStore(sys.argv[1]).publish(parse_receipt(sys.stdin.buffer.read()))
"""


def python_publish(c: Ctx, payload: bytes, crash: str) -> None:
    env = dict(c.env, QL_CRASH_POINT=crash)
    out = subprocess.run([sys.executable, "-c", PUBLISHER, str(c.data_dir / "receipts")], input=payload,
                         env=env, capture_output=True, timeout=60)
    assert out.returncode == CRASH_EXIT_CODE, out.stderr


def case_receipt_publish_after_temp(c: Ctx) -> None:
    trigger = c.trigger()
    sub = c.submit(trigger_command(trigger, 7))
    python_publish(c, receipt_bytes(sub, exit_code=7), "receipt.publish.after_temp")
    temps = temp_files(c.data_dir, sub.attempt_id)
    assert len(temps) == 1 and not c.receipt(sub.attempt_id).exists()
    # A temp file is not a receipt: the task is still running and nobody touches the temp.
    counts = reconcile(c.env)
    assert (counts["applied"], counts["quarantined"], counts["still_running"]) == (0, 0, 1)
    assert_not_terminal(c.rt, sub.run_id)
    assert temp_files(c.data_dir, sub.attempt_id) == temps
    trigger.touch()
    sub.task.live.process.wait(timeout=60)
    assert reconcile(c.env)["applied"] == 1
    assert_one_terminal(c.rt, sub.run_id, "failed", 7)
    assert temp_files(c.data_dir, sub.attempt_id) == temps  # orphans belong to `ql audit receipts`


def case_receipt_publish_after_link(c: Ctx) -> None:
    trigger = c.trigger()
    sub = c.submit(trigger_command(trigger, 7))
    host_gone(c.rt, sub.attempt_id)  # nobody waits: a receipt of the live launcher is not deferred
    python_publish(c, receipt_bytes(sub, exit_code=7), "receipt.publish.after_link")
    temps = temp_files(c.data_dir, sub.attempt_id)
    assert len(temps) == 1 and c.receipt(sub.attempt_id).exists()
    assert reconcile(c.env)["applied"] == 1
    assert_one_terminal(c.rt, sub.run_id, "failed", 7)
    assert not c.receipt(sub.attempt_id).exists()
    # The launcher's own receipt arrives after the commit: replayed as already_terminal, no 2nd event.
    trigger.touch()
    sub.task.live.process.wait(timeout=60)
    assert c.receipt(sub.attempt_id).exists()
    counts = reconcile(c.env)
    assert (counts["applied"], counts["already_terminal"]) == (0, 1)
    assert not c.receipt(sub.attempt_id).exists()
    assert_one_terminal(c.rt, sub.run_id, "failed", 7)


def case_completion_before_commit(c: Ctx, host: str) -> None:
    run_id, attempt_id = host_crashes_at(c, "completion.before_commit", host)
    # Rolled back: still running, receipt and journal row untouched. (A `ql run` host held the
    # receipt back: its publisher saw the host's channel close and publishes it now.)
    assert_not_terminal(c.rt, run_id)
    wait_for(lambda: c.receipt(attempt_id).exists(), what="the receipt")
    assert journal_row(c.rt, attempt_id)["state"] == "pending"
    assert reconcile(c.env)["applied"] == 1
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert not c.receipt(attempt_id).exists()


def case_completion_before_commit_lost(c: Ctx) -> None:
    rec = detach(c.env, *trigger_command(c.trigger(), 7))
    run_id, attempt_id = rec["run_id"], rec["attempt_id"]
    # The whole launcher group dies without a receipt (identity re-verified before the signal).
    assert str(c.rt.executor.signal(c.handle(attempt_id), signal.SIGKILL)) == "signalled"
    wait_for(lambda: c.identity(attempt_id) is IdentityState.EXITED, what="the task to exit")
    ql_crash(c.env, "completion.before_commit", "reconcile")
    assert_not_terminal(c.rt, run_id)
    assert reconcile(c.env)["lost"] == 1
    events = assert_one_terminal(c.rt, run_id, "lost", None)
    assert events[-1]["reason"] == LOST_REASON
    assert reconcile(c.env)["lost"] == 0


def case_completion_before_commit_late(c: Ctx) -> None:
    sub = c.submit(trigger_command(c.trigger(), 7))
    os.killpg(sub.task.live.process.pid, signal.SIGKILL)  # our own child, not reaped yet: its pid is ours
    sub.task.live.process.wait(timeout=30)
    assert reconcile(c.env)["lost"] == 1
    # A true receipt surfaces after `lost` was committed: recorded once, never changes the outcome.
    c.rt.receipts.publish(valid_receipt(sub, exit_code=7))
    ql_crash(c.env, "completion.before_commit", "reconcile")
    assert "attempt.late_callback_ignored" not in event_types(c.rt, sub.run_id)
    assert c.receipt(sub.attempt_id).exists()
    assert reconcile(c.env)["already_terminal"] == 1
    events = assert_one_terminal(c.rt, sub.run_id, "lost", None)
    assert [e["type"] for e in events].count("attempt.late_callback_ignored") == 1
    assert not c.receipt(sub.attempt_id).exists()


def case_consumer_after_commit(c: Ctx, host: str) -> None:
    run_id, attempt_id = host_crashes_at(c, "consumer.after_commit", host)
    # Committed, not yet cleaned: the receipt is still there and still indexed.
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert c.receipt(attempt_id).exists()
    assert journal_row(c.rt, attempt_id)["state"] == "pending"
    counts = reconcile(c.env)
    assert (counts["applied"], counts["already_terminal"]) == (0, 1)
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert not c.receipt(attempt_id).exists()


def case_consumer_after_delete(c: Ctx, host: str) -> None:
    run_id, attempt_id = host_crashes_at(c, "consumer.after_delete", host)
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert not c.receipt(attempt_id).exists()
    row = journal_row(c.rt, attempt_id)
    assert row is not None  # the clock started by the terminal commit (its event's time, read through the store):
    assert c.rt.node.journal.journal_entry(attempt_id).terminal_seen_at_ms is not None
    counts = reconcile(c.env)
    assert counts["applied"] == counts["already_terminal"] == 0
    assert journal_row(c.rt, attempt_id) is not None  # kept for the retention window
    counts = reconcile(c.env, config=write_config(c.tmp_path / "ql.toml", terminal_journal_retention_s=0.0))
    assert counts.get("journal_purged") == 1 and journal_row(c.rt, attempt_id) is None
    assert_one_terminal(c.rt, run_id, "failed", 7)


def case_wait_after_exit(c: Ctx) -> None:
    """`ql run` reaped the held task's status and died before committing anything: the publisher
    reads EOF and publishes the true receipt, which recovery applies."""
    run_id, attempt_id = host_crashes_at(c, "wait.after_exit", "run")
    assert_not_terminal(c.rt, run_id)
    wait_for(lambda: c.receipt(attempt_id).exists(), what="the held receipt, published on EOF")
    assert journal_row(c.rt, attempt_id)["state"] == "pending"
    assert reconcile(c.env)["applied"] == 1
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert not c.receipt(attempt_id).exists()


def case_wait_before_ack(c: Ctx) -> None:
    """Committed, not acknowledged: the publisher still publishes; the receipt is replayed as
    already_terminal and removed, never a second terminal event."""
    run_id, attempt_id = host_crashes_at(c, "wait.before_ack", "run")
    assert_one_terminal(c.rt, run_id, "failed", 7)
    wait_for(lambda: c.receipt(attempt_id).exists(), what="the unacknowledged receipt")
    assert journal_row(c.rt, attempt_id)["state"] == "pending"
    counts = reconcile(c.env)
    assert (counts["applied"], counts["already_terminal"]) == (0, 1)
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert not c.receipt(attempt_id).exists()


def case_wait_after_ack(c: Ctx) -> None:
    """Committed and acknowledged, the host dies before noting it: no receipt ever appears, and
    the journal row goes by retention once its receipt is (provably) missing."""
    run_id, attempt_id = host_crashes_at(c, "wait.after_ack", "run")
    assert_one_terminal(c.rt, run_id, "failed", 7)
    wait_for(lambda: c.identity(attempt_id) is IdentityState.EXITED, what="the publisher to leave")
    assert not c.receipt(attempt_id).exists() and temp_files(c.data_dir, attempt_id) == []
    counts = reconcile(c.env)
    assert not any(counts[k] for k in ("applied", "already_terminal", "quarantined", "lost"))
    counts = reconcile(c.env, config=write_config(c.tmp_path / "ql.toml", terminal_journal_retention_s=0.0))
    assert counts.get("journal_purged") == 1 and journal_row(c.rt, attempt_id) is None
    assert_one_terminal(c.rt, run_id, "failed", 7)


def _forged_task(c: Ctx) -> tuple[Path, str, str, bytes]:
    trigger = c.trigger()
    rec = detach(c.env, *trigger_command(trigger, 7))
    forged = b'{"schemaVersion":1,"runId":"'  # half-written
    plant(c.data_dir, rec["attempt_id"], forged)
    return trigger, rec["run_id"], rec["attempt_id"], forged


def _then_the_true_end(c: Ctx, trigger: Path, run_id: str, attempt_id: str, forged: bytes) -> None:
    assert not c.receipt(attempt_id).exists()
    assert quarantine_path(c.data_dir, attempt_id).read_bytes() == forged
    assert_not_terminal(c.rt, run_id)
    trigger.touch()
    wait_for(lambda: c.receipt(attempt_id).exists(), what="the launcher's receipt")
    assert reconcile(c.env)["applied"] == 1
    assert_one_terminal(c.rt, run_id, "failed", 7)
    # The quarantined copy stays on its retention clock, indexed by its journal row.
    assert journal_row(c.rt, attempt_id)["state"] == "quarantined"
    assert quarantine_path(c.data_dir, attempt_id).exists()


def case_consumer_quarantine_after_journal(c: Ctx) -> None:
    trigger, run_id, attempt_id, forged = _forged_task(c)
    ql_crash(c.env, "consumer.quarantine.after_journal", "reconcile")
    row = journal_row(c.rt, attempt_id)
    assert (row["state"], row["quarantine_reason"]) == ("quarantined", "codec:invalid_json")
    assert c.receipt(attempt_id).read_bytes() == forged
    assert not quarantine_path(c.data_dir, attempt_id).exists()
    assert_not_terminal(c.rt, run_id)
    counts = reconcile(c.env)
    assert (counts["quarantined"], counts["still_running"], counts["applied"]) == (1, 1, 0)
    _then_the_true_end(c, trigger, run_id, attempt_id, forged)


def case_receipt_quarantine_after_link(c: Ctx) -> None:
    trigger, run_id, attempt_id, forged = _forged_task(c)
    ql_crash(c.env, "receipt.quarantine.after_link", "reconcile")
    assert journal_row(c.rt, attempt_id)["state"] == "quarantined"
    assert c.receipt(attempt_id).samefile(quarantine_path(c.data_dir, attempt_id))
    assert_not_terminal(c.rt, run_id)
    counts = reconcile(c.env)
    assert (counts["quarantined"], counts["still_running"], counts["applied"]) == (1, 1, 0)
    _then_the_true_end(c, trigger, run_id, attempt_id, forged)


def _reconcile_until_terminal(c: Ctx, run_id: str) -> None:
    wait_for(lambda: reconcile(c.env) is not None and c.rt.status(run_id).terminal,
             what="the cancelled task to end")


def case_cancel_after_intent(c: Ctx) -> None:
    rec = detach(c.env, *trigger_command(c.trigger(), 0))
    run_id, attempt_id = rec["run_id"], rec["attempt_id"]
    ql_crash(c.env, "cancel.after_intent", "cancel", run_id)
    view = c.rt.status(run_id)
    assert (view.status, view.cancel_reason) == ("running", "user")
    assert dispatch_row(c.rt, run_id)["term_sent_at_ms"] is None
    assert c.identity(attempt_id) is IdentityState.RUNNING  # intent only: nothing was signalled
    _reconcile_until_terminal(c, run_id)
    events = assert_one_terminal(c.rt, run_id, "cancelled")
    types = [e["type"] for e in events]
    assert types.index("run.cancel_requested") < types.index("attempt.cancelled")
    assert c.rt.status(run_id).exit_code in (143, None)  # TERM's real status, or none if no receipt


def case_cancel_after_signal(c: Ctx) -> None:
    rec = detach(c.env, *trigger_command(c.trigger(), 0))
    run_id, attempt_id = rec["run_id"], rec["attempt_id"]
    ql_crash(c.env, "cancel.after_signal", "cancel", run_id)
    record = dispatch_row(c.rt, run_id)
    assert record["state"] == "pending" and record["lease_owner"] is not None  # outcome never committed
    wait_for(lambda: c.identity(attempt_id) is IdentityState.EXITED, what="TERM to end the task")
    _reconcile_until_terminal(c, run_id)
    assert_one_terminal(c.rt, run_id, "cancelled")
    assert c.rt.status(run_id).exit_code in (143, None)


CASES: dict[str, Callable[[Ctx], None]] = {
    "create.before_commit": case_create_before_commit,
    "spawn.after_log_created": case_spawn_after_log_created,
    "spawn.after_log_created[standby]": case_spawn_after_log_created_standby,
    "spawn.before_handle_commit": case_spawn_before_handle_commit,
    "start.after_hand_over": case_start_after_hand_over,
    "receipt.publish.after_temp": case_receipt_publish_after_temp,
    "receipt.publish.after_link": case_receipt_publish_after_link,
    "wait.after_exit": case_wait_after_exit,
    "completion.before_commit[reconcile]": lambda c: case_completion_before_commit(c, "reconcile"),
    "completion.before_commit[run]": lambda c: case_completion_before_commit(c, "run"),
    "completion.before_commit[lost]": case_completion_before_commit_lost,
    "completion.before_commit[late]": case_completion_before_commit_late,
    "wait.before_ack": case_wait_before_ack,
    "wait.after_ack": case_wait_after_ack,
    "consumer.after_commit[reconcile]": lambda c: case_consumer_after_commit(c, "reconcile"),
    "consumer.after_delete[reconcile]": lambda c: case_consumer_after_delete(c, "reconcile"),
    "consumer.quarantine.after_journal": case_consumer_quarantine_after_journal,
    "receipt.quarantine.after_link": case_receipt_quarantine_after_link,
    "cancel.after_intent": case_cancel_after_intent,
    "cancel.after_signal": case_cancel_after_signal,
}


def test_every_crash_point_has_a_case() -> None:
    # worker.* points are the cluster worker's steps: tests/cluster/test_worker_faults.py kills there;
    # ship.* the worker's log shipper's: tests/cluster/test_log_shipping.py.
    assert {name.split("[")[0] for name in CASES} == {p for p in CRASH_POINTS
                                                      if not p.startswith(("worker.", "ship."))}


def test_every_crash_point_in_the_code_is_declared() -> None:
    root = Path(__file__).resolve().parents[2]
    used: set[str] = set()
    for package in ("ql_core", "ql_executors", "ql_plugins"):
        for source in (root / package).rglob("*.py"):
            # crashpoint("name") where it is hit; crash_point="name" where a store hits it for core.
            used |= set(re.findall(r'crash_?point(?:\(|=)"([^"]+)"', source.read_text()))
    assert used == set(CRASH_POINTS)


@pytest.mark.parametrize("case", list(CASES))
def test_crash_point(case: str, ql_env: dict[str, str], data_dir: Path, runtime: Any, triggers: Any,
                     submit: Any, tmp_path: Path) -> None:
    c = Ctx(env=ql_env, data_dir=data_dir, rt=runtime, trigger=triggers, submit=submit, tmp_path=tmp_path)
    CASES[case](c)
    for view in runtime.list_runs():
        for attempt in view.attempts:
            assert_journal_consistent(c, attempt.attempt_id)


def test_receipt_left_after_commit_is_replayed_when_the_row_is_quarantined(
        ql_env: dict[str, str], data_dir: Path, runtime: Any, triggers: Any, submit: Any, tmp_path: Path) -> None:
    c = Ctx(env=ql_env, data_dir=data_dir, rt=runtime, trigger=triggers, submit=submit, tmp_path=tmp_path)
    trigger, run_id, attempt_id, _forged = _forged_task(c)
    assert reconcile(c.env)["quarantined"] == 1
    trigger.touch()
    wait_for(lambda: c.receipt(attempt_id).exists(), what="the launcher's receipt")
    ql_crash(c.env, "consumer.after_commit", "reconcile")
    assert_one_terminal(c.rt, run_id, "failed", 7)
    assert c.receipt(attempt_id).exists()
    assert reconcile(c.env)["already_terminal"] == 1
    assert not c.receipt(attempt_id).exists()
