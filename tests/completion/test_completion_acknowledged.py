"""Acknowledged completion through the runtime: a waiting host commits the status it reaped and only
then tells the task's publisher to publish nothing.

Every step a host can die at (the ``wait.*`` crash points) is in test_completion_crashpoints.py;
here: a real SIGKILL of a waiting host before the task ended, a task trying to forge its status, a
host that stops waiting, a commit that fails, and the cost (two commits with a standby launcher,
three the classic way, and no receipt written).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.completion.completion_support import (
    CommitLog,
    assert_one_terminal,
    attempt_row,
    event_types,
    journal_row,
    receipt_path,
    reconcile,
    trigger_command,
    wait_for,
)

from ql_core.ports import IdentityState

HOST = textwrap.dedent(
    """
    import json, sys
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    data_dir, command = sys.argv[1], json.loads(sys.argv[2])
    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    sub = rt.submit(command, awaited=True)
    print(json.dumps({"run_id": sub.run_id, "attempt_id": sub.attempt_id}), flush=True)
    rt.wait(sub)
    """
)


def test_a_waiting_host_killed_while_its_task_runs_loses_nothing(
        runtime: Any, data_dir: Path, triggers: Any, ql_env: dict[str, str], tmp_path: Path) -> None:
    """Before the report: the host dies with SIGKILL while the task runs; the task ends later, its
    publisher finds the channel closed and publishes; recovery applies the true status."""
    trigger = triggers()
    script = tmp_path / "host.py"
    script.write_text(HOST)
    host = subprocess.Popen([sys.executable, str(script), str(data_dir), json.dumps(trigger_command(trigger, 7))],
                            stdout=subprocess.PIPE, text=True)
    try:
        ids = json.loads(host.stdout.readline())  # type: ignore[union-attr]
    finally:
        host.kill()
        host.wait(30)
        host.stdout.close()  # type: ignore[union-attr]
    assert host.returncode == -signal.SIGKILL
    assert runtime.status(ids["run_id"]).status == "running"
    trigger.touch()
    wait_for(lambda: receipt_path(data_dir, ids["attempt_id"]).exists(), what="the receipt")
    assert reconcile(ql_env)["applied"] == 1
    assert_one_terminal(runtime, ids["run_id"], "failed", 7)


FORGER = textwrap.dedent(
    """
    import os, sys
    # Everything a same-user task could try to tell the waiting host: a status and an "ok", into
    # every socket of its launcher and of the host it can find.
    for pid in (os.getppid(), int(sys.argv[1])):
        for name in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{name}"
            try:
                if os.readlink(path).startswith("socket:"):
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b"s0\\nok\\n")
                    print("reached", path)
            except OSError as exc:
                print("refused", exc.errno)
    sys.exit(7)
    """
)


def test_a_task_cannot_forge_the_status_its_host_commits(runtime: Any, data_dir: Path, tmp_path: Path) -> None:
    forger = tmp_path / "forger.py"
    forger.write_text(FORGER)
    view = runtime.run([sys.executable, str(forger), str(os.getpid())])
    assert (view.status, view.exit_code) == ("failed", 7)
    log = runtime.log_path(view.run_id).read_text()
    assert "reached" not in log and "refused" in log, log
    assert "attempt.receipt_rejected" not in event_types(runtime, view.run_id)


def test_a_host_that_stops_waiting_leaves_the_receipt_to_the_task(runtime: Any, data_dir: Path,
                                                                   triggers: Any) -> None:
    trigger = triggers()
    sub = runtime.submit(trigger_command(trigger, 5), awaited=True)
    runtime.detach(sub)
    runtime.detach(sub)  # idempotent
    trigger.touch()
    wait_for(lambda: receipt_path(data_dir, sub.attempt_id).exists(), what="the task's own receipt")
    sub.task.live.process.wait(30)
    view = runtime.wait(sub.run_id)  # re-attached: completes from the receipt
    assert (view.status, view.exit_code) == ("failed", 5)


def test_a_commit_that_fails_leaves_the_receipt_to_the_task(runtime: Any, data_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The host reaped the status but could not commit it: it never acknowledges, so the held
    receipt is published and the run still ends with its true status."""
    sub = runtime.submit(["sh", "-c", "exit 6"], awaited=True)

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError("disk I/O error")

    monkeypatch.setattr(runtime.completion, "complete", refuse)
    with pytest.raises(OSError):
        runtime.wait(sub)
    monkeypatch.undo()
    assert runtime.status(sub.run_id).status == "running"
    wait_for(lambda: receipt_path(data_dir, sub.attempt_id).exists(), what="the unacknowledged receipt")
    view = runtime.wait(sub.run_id)
    assert (view.status, view.exit_code) == ("failed", 6)


@pytest.mark.parametrize("path", ["standby", "classic"])
def test_the_acknowledged_path_is_two_or_three_commits_and_writes_no_receipt(
        request: pytest.FixtureRequest, path: str, data_dir: Path) -> None:
    runtime = request.getfixturevalue("runtime" if path == "standby" else "classic_runtime")
    log = CommitLog(runtime)
    try:
        view = runtime.run(["sh", "-c", "exit 0"])
    finally:
        log.close()
    assert view.status == "succeeded"
    # The log's size follows the terminal commit unsynced (tests/completion/test_completion_lifecycle.py).
    assert len(log.durable_writes) == (2 if path == "standby" else 3), log.writes
    attempt_id = view.attempts[0].attempt_id
    handle = attempt_row(runtime, attempt_id)["handle"]
    wait_for(lambda: runtime.executor.inspect(handle) is IdentityState.EXITED, what="the publisher to leave")
    assert not receipt_path(data_dir, attempt_id).exists()
    assert list((data_dir / "receipts").rglob("*.tmp")) == []
    assert journal_row(runtime, attempt_id)["state"] == "pending"  # noted: leaves with the next create
    assert attempt_id in runtime.journal.noted()


def test_a_command_exiting_125_is_its_own_status(runtime: Any) -> None:
    view = runtime.run(["sh", "-c", "exit 125"])
    assert (view.status, view.exit_code) == ("failed", 125)
    assert "attempt.observation_lost" not in event_types(runtime, view.run_id)


def test_a_killed_launcher_is_no_status(runtime: Any, triggers: Any) -> None:
    """The launcher itself dies (SIGKILL to its pid alone): no byte, no publisher, no status —
    the command runs on in its group and, without a receipt, its run ends lost, never a guess."""
    trigger = triggers()
    sub = runtime.submit(trigger_command(trigger, 0), awaited=True)
    os.kill(sub.task.live.process.pid, signal.SIGKILL)
    observed = runtime.executor.wait(sub.task, 30)
    assert observed.exit_code is None and not observed.held_receipt
    trigger.touch()
    runtime.complete_from_wait(sub, observed)
    view = wait_for(lambda: (v := runtime.status(sub.run_id)).terminal and v or
                    (runtime.settle(runtime.status(sub.run_id)) and None), what="the run to end")
    assert (view.status, view.exit_code) == ("lost", None)
