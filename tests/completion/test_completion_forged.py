"""Gate 4: every malformed or forged receipt fails closed (ADR-0007 §2.4, §2.5, §6 gate 4).

Each case plants a bad file where a running task's receipt belongs (the task
is real: a launcher waiting on a trigger file), runs the real ``ql reconcile``
and checks that the run did not change at all (no event, still running), that
the file was quarantined byte for byte with its decision persisted in the
journal first — or left alone when it is not a receipt — and that a valid
receipt published afterwards still completes the attempt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from tests.completion.completion_support import (
    assert_not_terminal,
    host_gone,
    assert_one_terminal,
    journal_row,
    plant,
    quarantine_path,
    receipt_bytes,
    receipt_path,
    reconcile,
    set_attempt,
    temp_files,
    trigger_command,
    valid_receipt,
    write_config,
)

from ql_core.consumer import ConsumeOutcome
from ql_core.ids import new_id


def wire(sub: Any, **overrides: Any) -> bytes:
    """Receipt JSON built by hand (so values the codec would refuse to serialize can be planted)."""
    r = valid_receipt(sub, exit_code=7)
    doc = {"schemaVersion": 1, "runId": r.run_id, "attemptId": r.attempt_id,
           "callbackSequence": r.callback_sequence, "token": r.token, "startedAtMs": r.started_at_ms,
           "finishedAtMs": r.finished_at_ms, "exitCode": r.exit_code}
    doc.update(overrides)
    return json.dumps(doc, separators=(",", ":")).encode()


def _oversized(sub: Any) -> bytes:
    body = receipt_bytes(sub, exit_code=7)
    return body[:-1] + b" " * (4097 - len(body)) + b"}"  # valid JSON; only its size is wrong


#: kind -> (payload builder, journal quarantine_reason)
CODEC_AND_CLAIM_KINDS: dict[str, tuple[Callable[[Any], bytes], str]] = {
    "half_written": (lambda sub: receipt_bytes(sub, exit_code=7)[:60], "codec:invalid_json"),
    "empty": (lambda sub: b"", "codec:invalid_json"),
    "oversized": (_oversized, "codec:oversized"),
    "unknown_field": (lambda sub: receipt_bytes(sub, exit_code=7)[:-1] + b',"cmd":"rm -rf /"}',
                      "codec:unknown_key"),
    "duplicate_key": (lambda sub: receipt_bytes(sub, exit_code=7)[:-1] + b',"exitCode":0}',
                      "codec:duplicate_key"),
    "float_exit_code": (lambda sub: wire(sub, exitCode=0.0), "codec:wrong_type"),
    "zero_sequence": (lambda sub: wire(sub, callbackSequence=0), "codec:invalid_sequence"),
    "attempt_id_mismatch": (lambda sub: receipt_bytes(sub, exit_code=7, attempt_id=new_id()), "codec:id_mismatch"),
    "wrong_token": (lambda sub: receipt_bytes(sub, exit_code=0, token="A" * 43), "wrong_token"),
    "token_of_another_attempt": (lambda sub: receipt_bytes(sub, exit_code=0, token=sub.other_token), "wrong_token"),
    "wrong_sequence": (lambda sub: receipt_bytes(sub, exit_code=0, callback_sequence=2), "wrong_sequence"),
    "wrong_run": (lambda sub: receipt_bytes(sub, exit_code=0, run_id=new_id()), "wrong_run"),
}


class _Sub:
    """A submission plus the token of a second, unrelated attempt (for cross-attempt replay)."""

    def __init__(self, sub: Any, other_token: str) -> None:
        self.__dict__.update(vars(sub))
        self.other_token = other_token


@pytest.fixture
def running(submit: Any, triggers: Any) -> Callable[[], Any]:
    def start() -> Any:
        return submit(trigger_command(triggers(), 7))

    return start


def _valid_receipt_then_completes(rt: Any, env: dict[str, str], sub: Any) -> None:
    host_gone(rt, sub.attempt_id)  # else the receipt of a live launcher beside its live host waits
    rt.receipts.publish(valid_receipt(sub, exit_code=7))
    counts = reconcile(env)
    assert (counts["applied"], counts["quarantined"]) == (1, 0)
    assert_one_terminal(rt, sub.run_id, "failed", 7)
    assert not receipt_path(rt.config.data_dir, sub.attempt_id).exists()


@pytest.mark.parametrize("kind", list(CODEC_AND_CLAIM_KINDS))
def test_bad_receipt_is_quarantined_and_the_run_unchanged(kind: str, runtime: Any, running: Any,
                                                          ql_env: dict[str, str], data_dir: Path) -> None:
    sub, other = running(), running()
    build, reason = CODEC_AND_CLAIM_KINDS[kind]
    payload = build(_Sub(sub, other.token))
    plant(data_dir, sub.attempt_id, payload)
    before = runtime.events(sub.run_id)

    counts = reconcile(ql_env)
    assert (counts["quarantined"], counts["applied"], counts["lost"]) == (1, 0, 0)
    assert counts["still_running"] == 2  # identity, not the bad file, decides: both tasks still run
    assert runtime.events(sub.run_id) == before
    assert_not_terminal(runtime, sub.run_id)
    row = journal_row(runtime, sub.attempt_id)
    assert (row["state"], row["quarantine_reason"]) == ("quarantined", reason)
    assert not receipt_path(data_dir, sub.attempt_id).exists()
    assert quarantine_path(data_dir, sub.attempt_id).read_bytes() == payload  # moved, never repaired
    assert (quarantine_path(data_dir, sub.attempt_id).stat().st_mode & 0o777) == 0o600
    assert (quarantine_path(data_dir, sub.attempt_id).parent.stat().st_mode & 0o777) == 0o700
    assert_not_terminal(runtime, other.run_id)  # the other attempt's token was not spent

    _valid_receipt_then_completes(runtime, ql_env, sub)


def test_temp_file_alone_is_not_a_receipt(runtime: Any, running: Any, ql_env: dict[str, str],
                                          data_dir: Path) -> None:
    sub = running()
    temp = plant(data_dir, sub.attempt_id, receipt_bytes(sub, exit_code=0), name=f".{sub.attempt_id}.x1.tmp")
    before = runtime.events(sub.run_id)
    counts = reconcile(ql_env)
    assert (counts["quarantined"], counts["applied"], counts["still_running"]) == (0, 0, 1)
    assert runtime.events(sub.run_id) == before
    assert journal_row(runtime, sub.attempt_id)["state"] == "pending"
    assert temp_files(data_dir, sub.attempt_id) == [temp]  # left alone: `ql audit receipts` owns orphans
    _valid_receipt_then_completes(runtime, ql_env, sub)
    assert temp_files(data_dir, sub.attempt_id) == [temp]


def test_symlink_to_a_valid_receipt_is_rejected(runtime: Any, running: Any, ql_env: dict[str, str],
                                                data_dir: Path, tmp_path: Path) -> None:
    sub = running()
    elsewhere = tmp_path / "valid.json"
    elsewhere.write_bytes(receipt_bytes(sub, exit_code=0))
    link = receipt_path(data_dir, sub.attempt_id)
    link.symlink_to(elsewhere)
    counts = reconcile(ql_env)
    assert (counts["quarantined"], counts["applied"]) == (1, 0)
    assert_not_terminal(runtime, sub.run_id)
    assert journal_row(runtime, sub.attempt_id)["quarantine_reason"] == "codec:not_regular_file"
    moved = quarantine_path(data_dir, sub.attempt_id)
    assert moved.is_symlink() and os.readlink(moved) == str(elsewhere)  # the link itself, not its target
    assert elsewhere.exists()
    _valid_receipt_then_completes(runtime, ql_env, sub)


def test_wrong_owner_is_left_to_its_owner_and_rejected_if_consumed(runtime: Any, running: Any,
                                                                   ql_env: dict[str, str], data_dir: Path) -> None:
    sub = running()
    set_attempt(runtime, sub.attempt_id, runtime_owner="another-node")
    payload = receipt_bytes(sub, exit_code=0)
    plant(data_dir, sub.attempt_id, payload)
    before = runtime.events(sub.run_id)
    # This node's recovery pages only its own attempts: it neither applies nor moves the file.
    counts = reconcile(ql_env)
    assert (counts["applied"], counts["quarantined"], counts["attempts_checked"]) == (0, 0, 0)
    assert receipt_path(data_dir, sub.attempt_id).read_bytes() == payload
    assert runtime.events(sub.run_id) == before
    # Fed to the consumer anyway, the CompletionService refuses it before any write.
    result = runtime.consumer.consume(sub.attempt_id)
    assert (result.outcome, result.reason) == (ConsumeOutcome.QUARANTINED, "wrong_owner")
    assert runtime.events(sub.run_id) == before
    assert_not_terminal(runtime, sub.run_id)
    assert quarantine_path(data_dir, sub.attempt_id).read_bytes() == payload
    set_attempt(runtime, sub.attempt_id, runtime_owner=runtime.node_id)
    _valid_receipt_then_completes(runtime, ql_env, sub)


def test_an_attempt_of_an_executor_not_installed_here_is_quarantined(runtime: Any, running: Any, ql_env: dict[str, str],
                                            data_dir: Path) -> None:
    sub = running()
    set_attempt(runtime, sub.attempt_id, executor="docker")
    payload = receipt_bytes(sub, exit_code=0)
    plant(data_dir, sub.attempt_id, payload)
    before = runtime.events(sub.run_id)
    counts = reconcile(ql_env)
    assert (counts["applied"], counts["quarantined"]) == (0, 1)
    # Nothing here can verify that executor's handle either: blocked, never signalled, never guessed.
    assert runtime.events(sub.run_id) == before + [runtime.events(sub.run_id)[-1]]
    assert runtime.events(sub.run_id)[-1].type == "attempt.blocked"
    assert_not_terminal(runtime, sub.run_id)
    assert journal_row(runtime, sub.attempt_id)["quarantine_reason"] == "wrong_executor"
    assert quarantine_path(data_dir, sub.attempt_id).read_bytes() == payload
    set_attempt(runtime, sub.attempt_id, executor="local")
    _valid_receipt_then_completes(runtime, ql_env, sub)


def test_forged_receipt_after_the_end_changes_nothing(runtime: Any, submit: Any, ql_env: dict[str, str],
                                                      data_dir: Path) -> None:
    sub = submit(["sh", "-c", "exit 3"])
    assert runtime.wait(sub).status == "failed"
    before = runtime.events(sub.run_id)
    plant(data_dir, sub.attempt_id, receipt_bytes(sub, exit_code=0, token="B" * 43))
    counts = reconcile(ql_env)
    assert (counts["quarantined"], counts["applied"], counts["already_terminal"]) == (1, 0, 0)
    assert runtime.events(sub.run_id) == before
    # The true receipt replayed (same sequence) is already_terminal: no event, and cleaned.
    runtime.receipts.publish(valid_receipt(sub, exit_code=3))
    assert runtime.consumer.consume(sub.attempt_id).outcome is ConsumeOutcome.ALREADY_TERMINAL
    assert runtime.events(sub.run_id) == before
    assert not receipt_path(data_dir, sub.attempt_id).exists()
    assert_one_terminal(runtime, sub.run_id, "failed", 3)


def _second_forgery(runtime: Any, submit: Any, triggers: Any, ql_env: dict[str, str],
                    data_dir: Path) -> tuple[Any, bytes, bytes]:
    trigger = triggers()
    sub = submit(trigger_command(trigger, 7))
    first, second = b"first forgery", b"second forgery"
    plant(data_dir, sub.attempt_id, first)
    assert reconcile(ql_env)["quarantined"] == 1
    quarantined_at = journal_row(runtime, sub.attempt_id)["updated_at_ms"]
    plant(data_dir, sub.attempt_id, second)
    counts = reconcile(ql_env)
    # Rejected again; the slot is taken, so the file stays put and the earlier evidence is intact.
    assert (counts["quarantined"], counts["still_running"], counts.get("retry", 0)) == (1, 1, 0)
    assert quarantine_path(data_dir, sub.attempt_id).read_bytes() == first
    assert receipt_path(data_dir, sub.attempt_id).read_bytes() == second
    row = journal_row(runtime, sub.attempt_id)
    assert (row["state"], row["updated_at_ms"]) == ("quarantined", quarantined_at)  # its clock runs on
    result = runtime.consumer.consume(sub.attempt_id)
    assert (result.outcome, result.kept_in_place) == (ConsumeOutcome.QUARANTINED, True)
    assert_not_terminal(runtime, sub.run_id)
    # The task ends; its launcher cannot publish over the forgery, so nothing proves the exit code:
    # recovery concludes `lost` (never a guess, never a run stuck in `running`).
    trigger.touch()
    sub.task.live.process.wait(timeout=60)
    counts = reconcile(ql_env)
    assert counts["lost"] == 1
    assert_one_terminal(runtime, sub.run_id, "lost", None)
    assert receipt_path(data_dir, sub.attempt_id).read_bytes() == second
    return sub, first, second


def test_second_forgery_never_overwrites_the_quarantine_and_never_wedges_the_run(
        runtime: Any, submit: Any, triggers: Any, ql_env: dict[str, str], data_dir: Path) -> None:
    _second_forgery(runtime, submit, triggers, ql_env, data_dir)


def test_after_its_window_the_earlier_copy_goes_and_the_second_forgery_takes_the_slot(
        runtime: Any, submit: Any, triggers: Any, ql_env: dict[str, str], data_dir: Path, tmp_path: Path) -> None:
    sub, _first, second = _second_forgery(runtime, submit, triggers, ql_env, data_dir)
    config = write_config(tmp_path / "ql.toml", quarantine_retention_s=0.0)
    assert reconcile(ql_env, config=config).get("quarantine_purged") == 1
    # The second file is never deleted blindly: it took the freed slot, or it waits (unregistered,
    # for `ql audit receipts`) where it was.
    kept = [p.read_bytes() for p in (quarantine_path(data_dir, sub.attempt_id), receipt_path(data_dir, sub.attempt_id))
            if p.exists()]
    assert kept == [second]
    assert_one_terminal(runtime, sub.run_id, "lost", None)
