"""At most three commits per task (DESIGN.md §3.6) and the receipt journal's life around them.

Commits are counted with the edge-sqlite store's statement trace on its real
connections and SQLite file; each COMMIT is listed with the statements that
changed data in its transaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.completion.completion_support import (
    CommitLog,
    assert_one_terminal,
    create_with_receipts,
    journal_row,
    plant,
    quarantine_path,
    receipt_path,
    reconcile,
    set_attempt,
    trigger_command,
    valid_receipt,
    write_config,
)

from tests.dbview import is_log_size_commit

from ql_core.completion import CompletionOutcome, CompletionRejection
from ql_core.paths import log_path
from ql_core.consumer import ConsumeOutcome
from ql_core.submit import create


@pytest.fixture
def commits(runtime: Any) -> Any:
    log = CommitLog(runtime)
    yield log
    log.close()


def _kinds(writes: list[list[str]]) -> list[str]:
    """Name each write commit by what it did."""
    names = []
    for statements in writes:
        if "INSERT ql_run" in statements and statements.count("INSERT ql_run_event") == 2:
            names.append("create+spawned")  # a standby launcher's handle is known before the run
        elif "INSERT ql_run" in statements:
            names.append("create")
        elif statements.count("INSERT ql_run_event") == 1 and "UPDATE ql_run_attempt" in statements:
            names.append("spawned")
        elif statements.count("INSERT ql_run_event") >= 2:
            names.append("terminal")
        elif is_log_size_commit(statements):
            # The log's final size, written right after the terminal commit without its own fsync
            # (synchronous=NORMAL: a size lost to a power cut is re-read from the file by the sizing
            # queue), so it is no durable commit of the task's life.
            names.append("log size")
        else:
            names.append("other: " + ", ".join(statements))
    return names


def test_the_terminal_transaction_carries_all_completion_bookkeeping(runtime: Any, submit: Any,
                                                                     commits: CommitLog) -> None:
    sub = submit(["sh", "-c", "exit 0"])
    observed = runtime.executor.wait(sub.task, 60)
    commits.commits.clear()
    runtime.complete_from_wait(sub, observed)  # consume → CompletionService → delete the receipt
    # One commit ends the attempt: run, attempt, two events, and the log's entry in the sizing queue
    # (no size was offered; a running log is not listed, revision 0020). The journal row's retention
    # clock is the terminal event's time (read through the store): no journal page in this commit.
    assert commits.writes == [["UPDATE ql_run_attempt", "UPDATE ql_run", "INSERT ql_run_event",
                               "INSERT ql_run_event", "UPDATE ql_log_artifact"]]
    assert [f.id for f in runtime.journal.ended_logs(runtime.node.node_id, unsized=True, limit=10)] == \
        [sub.log_artifact_id]
    entry = runtime.node.journal.journal_entry(sub.attempt_id)
    assert entry is not None and entry.terminal_seen_at_ms is not None
    assert not receipt_path(runtime.config.data_dir, sub.attempt_id).exists()


def test_a_task_lifecycle_is_two_write_commits_with_a_standby(runtime: Any, submit: Any, commits: CommitLog) -> None:
    """The default path: the create commit records the standby launcher's handle too, then the
    terminal commit — nothing else writes durably during submit + wait (the log's size follows,
    unsynced)."""
    view = runtime.wait(submit(["sh", "-c", "exit 0"]))
    assert view.status == "succeeded"
    assert _kinds(commits.writes) == ["create+spawned", "terminal", "log size"], commits.writes


def test_an_awaited_task_that_printed_nothing_is_two_commits_in_all(runtime: Any, submit: Any,
                                                                    commits: CommitLog) -> None:
    """``awaited`` (``rt.run``, ``ql run``): the host commits the end itself, and the log the task left
    empty has its size (0) recorded in that terminal commit — no commit of its own after it — and its
    file is gone after it."""
    sub = submit(["sh", "-c", "exit 0"], awaited=True)
    view = runtime.wait(sub)
    assert view.status == "succeeded"
    assert _kinds(commits.writes) == ["create+spawned", "terminal"], commits.writes
    # On the edge store the attempt's row says so, not the log's (revision 0020), in the one UPDATE
    # of it that the terminal commit makes anyway.
    assert "UPDATE ql_log_artifact" not in commits.writes[1]
    assert commits.writes[1].count("UPDATE ql_run_attempt") == 1
    assert runtime.journal.log_facts(sub.log_artifact_id).size_bytes == 0
    assert not log_path(runtime.config.data_dir, sub.log_artifact_id).exists()


def test_an_awaited_log_with_output_is_sized_after_the_terminal_commit(runtime: Any, submit: Any,
                                                                       commits: CommitLog) -> None:
    """Only an empty log's size rides in the terminal commit; one with output joins the sizing queue
    there (so a crash before its size cannot lose it), is cut to its quota and sized after it (its own
    unsynced commit), and kept."""
    sub = submit(["sh", "-c", "echo out"], awaited=True)
    view = runtime.wait(sub)
    assert view.status == "succeeded"
    assert _kinds(commits.writes) == ["create+spawned", "terminal", "log size"], commits.writes
    assert "UPDATE ql_log_artifact" in commits.writes[1]
    assert runtime.journal.ended_logs(runtime.node.node_id, unsized=True, limit=10) == []
    assert runtime.journal.log_facts(sub.log_artifact_id).size_bytes == 4
    assert log_path(runtime.config.data_dir, sub.log_artifact_id).read_bytes() == b"out\n"


def test_a_classic_task_lifecycle_is_three_write_commits(classic_runtime: Any, tasks: list[Any]) -> None:
    """DESIGN.md §3.6: create, spawned, terminal — nothing else writes durably during submit + wait."""
    log = CommitLog(classic_runtime)
    try:
        sub = classic_runtime.submit(["sh", "-c", "exit 0"])
        tasks.append(sub)
        view = classic_runtime.wait(sub)
    finally:
        log.close()
    assert view.status == "succeeded"
    assert _kinds(log.writes) == ["create", "spawned", "terminal", "log size"], log.writes


def test_consumed_rows_leave_with_the_next_create_and_never_before_their_receipt(
        runtime: Any, submit: Any, commits: CommitLog) -> None:
    first = submit(["sh", "-c", "exit 0"])
    runtime.wait(first)
    row = journal_row(runtime, first.attempt_id)
    assert row is not None and row["state"] == "pending"
    assert runtime.node.journal.journal_entry(first.attempt_id).terminal_seen_at_ms is not None  # the clock runs
    assert first.attempt_id in runtime.journal.noted()
    commits.commits.clear()
    second = submit(["sh", "-c", "exit 0"])
    create = commits.writes[0]
    assert create[0] == "DELETE ql_receipt_journal" and "INSERT ql_receipt_journal" in create  # same commit
    assert journal_row(runtime, first.attempt_id) is None
    assert journal_row(runtime, second.attempt_id)["state"] == "pending"
    assert runtime.journal.noted() == frozenset()
    runtime.wait(second)


def test_rows_of_other_processes_go_by_retention_only_once_their_receipt_is_missing(
        runtime: Any, ql_env: dict[str, str], data_dir: Path, tmp_path: Path) -> None:
    """A `ql reconcile` process consumes and exits: its note is lost, the row waits for retention."""
    sub = create(runtime.node)
    runtime.receipts.publish(valid_receipt(sub, exit_code=4))
    assert reconcile(ql_env)["applied"] == 1
    assert runtime.node.journal.journal_entry(sub.attempt_id).terminal_seen_at_ms is not None
    zero = write_config(tmp_path / "ql.toml", terminal_journal_retention_s=0.0)
    # A receipt shows up again (a replay): the row is not purged while it exists.
    runtime.receipts.publish(valid_receipt(sub, exit_code=4))
    counts = reconcile(ql_env, config=zero)
    assert (counts["already_terminal"], counts.get("journal_purged", 0)) == (1, 0)
    assert journal_row(runtime, sub.attempt_id) is not None
    counts = reconcile(ql_env, config=zero)
    assert counts.get("journal_purged") == 1 and journal_row(runtime, sub.attempt_id) is None
    assert_one_terminal(runtime, sub.run_id, "failed", 4)


def test_a_quarantined_row_survives_success_and_retention_purges_both(
        runtime: Any, submit: Any, triggers: Any, ql_env: dict[str, str], data_dir: Path, tmp_path: Path) -> None:
    sub = submit(trigger_command(triggers(), 7))
    plant(data_dir, sub.attempt_id, b"{ forged")
    assert reconcile(ql_env)["quarantined"] == 1
    assert runtime.consumer.consume(sub.attempt_id).outcome is ConsumeOutcome.MISSING
    runtime.receipts.publish(valid_receipt(sub, exit_code=7))
    assert runtime.consumer.consume(sub.attempt_id).outcome is ConsumeOutcome.APPLIED
    other = submit(["sh", "-c", "exit 0"])  # a create commit flushes noted rows — but not this one
    runtime.wait(other)
    assert journal_row(runtime, sub.attempt_id)["state"] == "quarantined"
    assert quarantine_path(data_dir, sub.attempt_id).exists()
    counts = reconcile(ql_env, config=write_config(tmp_path / "ql.toml", quarantine_retention_s=0.0))
    assert counts.get("quarantine_purged") == 1
    assert journal_row(runtime, sub.attempt_id) is None
    assert not quarantine_path(data_dir, sub.attempt_id).exists()
    assert_one_terminal(runtime, sub.run_id, "failed", 7)


def test_end_without_receipt_never_writes_a_second_terminal_event(runtime: Any) -> None:
    sub = create(runtime.node)
    runtime.receipts.publish(valid_receipt(sub, exit_code=2))
    assert runtime.consumer.consume(sub.attempt_id).outcome is ConsumeOutcome.APPLIED
    before = runtime.events(sub.run_id)
    # Corrupt the pair on purpose: the attempt looks active again while its run has ended.
    set_attempt(runtime, sub.attempt_id, status="running")
    result = runtime.completion.end_without_receipt(sub.attempt_id, status="lost", reason="TEST")
    assert (result.outcome, result.rejection) == (CompletionOutcome.REJECTED, CompletionRejection.INCONSISTENT_STATE)
    assert runtime.events(sub.run_id) == before


def test_a_replayed_claim_is_already_terminal_without_any_write(runtime: Any, commits: CommitLog) -> None:
    sub = create(runtime.node)
    claim = valid_receipt(sub, exit_code=0)
    assert runtime.completion.complete(claim).outcome is CompletionOutcome.APPLIED
    commits.commits.clear()
    for _ in range(3):
        result = runtime.completion.complete(claim)
        assert (result.outcome, result.late, result.events) == (CompletionOutcome.ALREADY_TERMINAL, False, ())
    assert commits.writes == []
    assert_one_terminal(runtime, sub.run_id, "succeeded", 0)


def test_a_true_claim_after_lost_is_recorded_once_and_changes_nothing(runtime: Any) -> None:
    sub = create(runtime.node)
    runtime.completion.end_without_receipt(sub.attempt_id, status="lost", reason="TEST")
    claim = valid_receipt(sub, exit_code=0)
    first = runtime.completion.complete(claim)
    assert (first.outcome, first.late) == (CompletionOutcome.ALREADY_TERMINAL, True)
    assert [e.type for e in first.events] == ["attempt.late_callback_ignored"]
    again = runtime.completion.complete(claim)
    assert (again.outcome, again.late, again.events) == (CompletionOutcome.ALREADY_TERMINAL, False, ())
    events = assert_one_terminal(runtime, sub.run_id, "lost", None)
    assert [e["type"] for e in events].count("attempt.late_callback_ignored") == 1


def test_a_replay_with_another_exit_code_is_not_consistent_and_is_quarantined(runtime: Any) -> None:
    sub = create(runtime.node)
    runtime.receipts.publish(valid_receipt(sub, exit_code=0))
    assert runtime.consumer.consume(sub.attempt_id).outcome is ConsumeOutcome.APPLIED
    before = runtime.events(sub.run_id)
    forged = valid_receipt(sub, exit_code=1)  # right token, right sequence, a different story
    runtime.receipts.publish(forged)
    result = runtime.consumer.consume(sub.attempt_id)
    assert (result.outcome, result.reason) == (ConsumeOutcome.QUARANTINED, "inconsistent_state")
    assert runtime.events(sub.run_id) == before
    assert quarantine_path(runtime.config.data_dir, sub.attempt_id).exists()
    assert_one_terminal(runtime, sub.run_id, "succeeded", 0)


def test_recovery_applies_a_page_of_receipts_in_one_commit(runtime: Any, commits: CommitLog, data_dir: Path) -> None:
    """One durable commit per recovery page, and no receipt removed before it."""
    page = runtime.profile.page_size
    subs = create_with_receipts(runtime, page)
    commits.commits.clear()
    counts = runtime.reconcile()
    assert counts["applied"] == page
    terminal = [w for w in commits.writes if w.count("INSERT ql_run_event") >= 2]
    assert len(terminal) == 1 and terminal[0].count("UPDATE ql_run_attempt") == page, commits.writes
    for i, sub in enumerate(subs):
        assert_one_terminal(runtime, sub.run_id, "succeeded" if i % 7 == 0 else "failed", i % 7)
        assert not receipt_path(data_dir, sub.attempt_id).exists()


def test_an_offered_log_size_rides_in_the_terminal_commit_until_withdrawn(runtime: Any, submit: Any,
                                                                          commits: CommitLog) -> None:
    """The edge store's ``TerminalLogSize``: an offered size is written by the attempt's terminal
    transition (whichever path ends it), nothing once withdrawn."""
    offered = submit(["sh", "-c", "exit 0"])
    runtime.journal.offer_log_size(offered.attempt_id, offered.log_artifact_id, 7)
    try:
        runtime.complete_from_wait(offered, runtime.executor.wait(offered.task, 60))
    finally:
        runtime.journal.withdraw_log_size(offered.attempt_id)
    assert runtime.journal.log_facts(offered.log_artifact_id).size_bytes == 7
    withdrawn = submit(["sh", "-c", "exit 0"])
    runtime.journal.offer_log_size(withdrawn.attempt_id, withdrawn.log_artifact_id, 7)
    runtime.journal.withdraw_log_size(withdrawn.attempt_id)
    commits.commits.clear()
    runtime.complete_from_wait(withdrawn, runtime.executor.wait(withdrawn.task, 60))
    assert runtime.journal.log_facts(withdrawn.log_artifact_id).size_bytes is None
    # Not sized by the terminal commit: queued by it (the sizing queue's entry, revision 0020).
    assert "UPDATE ql_log_artifact" in commits.writes[0]
    assert [f.id for f in runtime.journal.ended_logs(runtime.node.node_id, unsized=True, limit=10)] == \
        [withdrawn.log_artifact_id]


@pytest.mark.parametrize("command", [["sh", "-c", "exit 0"], ["sh", "-c", "echo out; exit 3"]], ids=["ok", "exit3"])
def test_the_waiting_host_returns_the_view_its_terminal_commit_left(runtime: Any, command: list[str],
                                                                   commits: CommitLog) -> None:
    """An awaited run's view comes from the rows the terminal transaction read and the change it wrote,
    not from a read after it: it must be exactly what the store holds."""
    view = runtime.run(command)
    assert view.terminal and view.status == ("succeeded" if command[-1] == "exit 0" else "failed")
    assert view == runtime.status(view.run_id)
    assert view.as_dict() == runtime.status(view.run_id).as_dict()
