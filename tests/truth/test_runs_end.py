"""Every run ends — from proof, never from a timer — and a same-user forgery never beats kernel truth.

- a receipt slot that cannot hold a receipt (a directory, a symlinked shard) is reported and the
  attempt still ends through its identity (it used to be retried for ever);
- a slow host is never overtaken: recovery leaves a ``starting`` attempt alone while its host lives,
  and ends it only once the host is provably gone (tasks are held until their handle is committed);
- the status the waiting host reaped decides over a disagreeing receipt, which is quarantined with
  an audit event;
- a launcher killed alone leaves its command running in its process group: cancel still reaches it,
  `ql run` keeps waiting, says what happened, and `lost` comes only once the group is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ql_core.submit import create, start
from ql_core.testing.executor import wait_until
from tests import dbview
from tests.conftest import QL, json_lines, release_host, run_ql

BOUND_S = 60


def _wait(predicate, what: str):  # type: ignore[no-untyped-def]
    return wait_until(predicate, what, BOUND_S, interval=0.02)


# -- a receipt slot that cannot hold a receipt ---------------------------------------------------
@pytest.mark.parametrize("plant", ["directory", "symlinked shard"])
def test_an_unusable_receipt_slot_is_reported_and_the_run_still_ends(open_rt, data_dir: Path, tmp_path: Path,
                                                                    plant: str) -> None:
    rt = open_rt(publish_grace_ms=0)
    go = tmp_path / "go"
    sub = rt.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; exit 5'])
    shard = data_dir / "receipts" / sub.attempt_id[-2:]
    if plant == "directory":
        (shard / f"{sub.attempt_id}.json").mkdir()
    else:
        elsewhere = tmp_path / "elsewhere"
        shard.rename(elsewhere)
        shard.symlink_to(elsewhere)
    go.touch()
    sub.task.live.process.wait(BOUND_S)  # the launcher could not publish; this host "died" before it waited
    counts = rt.reconcile()
    assert counts.get("receipt_unusable", 0) >= 1 and counts["lost"] == 1
    view = rt.status(sub.run_id)
    assert (view.status, view.reason) == ("lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT")
    assert rt.reconcile()["lost"] == 0  # one terminal state, and the next round is quiet


# -- never started: proven from the host, never guessed by a timer --------------------------------
def test_a_slow_host_is_never_overtaken_by_recovery(open_rt, ql_env: dict[str, str], data_dir: Path,
                                                     tmp_path: Path) -> None:
    rt = open_rt()
    sub = create(rt.node)  # this process is the host, between create and spawn
    dbview.update(rt, "ql_run_attempt", sub.attempt_id, created_at_ms=int(time.time() * 1000) - 3_600_000)
    counts = json_lines(run_ql(["--json", "reconcile"], ql_env).stdout)[0]
    assert counts["lost"] == 0 and counts["blocked"] == 0 and counts.get("still_starting") == 1
    # ...and the slow host then spawns it normally: it runs and ends with its own code.
    marker = tmp_path / "ran"
    done = start(rt.node, sub, ("sh", "-c", f'touch "{marker}"; exit 6'))
    view = rt.wait(done)
    assert (view.status, view.exit_code) == ("failed", 6) and marker.exists()


# -- kernel truth beats a forged receipt ---------------------------------------------------------------
def test_a_forged_receipt_never_overrides_what_the_waiting_host_reaped(open_rt, data_dir: Path,
                                                                       tmp_path: Path) -> None:
    """A same-user task read the token (here: the test has it) and published `exit 0` first."""
    from ql_core.clock import now_ms_ceil
    from ql_core.receipts import Receipt

    rt = open_rt()
    go = tmp_path / "go"
    sub = rt.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; exit 1'])
    forged = Receipt(schema_version=1, run_id=sub.run_id, attempt_id=sub.attempt_id, callback_sequence=1,
                     token=sub.token, started_at_ms=sub.started_at_ms, finished_at_ms=now_ms_ceil(), exit_code=0)
    rt.receipts.publish(forged)
    go.touch()
    view = rt.wait(sub)
    assert (view.status, view.exit_code) == ("failed", 1)
    events = [(e.type, e.reason) for e in rt.events(sub.run_id)]
    assert ("attempt.receipt_rejected", "DISAGREES_WITH_OBSERVED_EXIT") in events
    row = dbview.row(rt, "ql_receipt_journal", sub.attempt_id)
    assert row is not None and row.quarantine_reason == "disagrees_with_observed_exit"
    assert rt.receipts.quarantined_exists(sub.attempt_id)


# -- a launcher killed alone: its command stays in reach ----------------------------------------------
def _launcher_pid(ql_env: dict[str, str], run_id: str) -> int:
    def handle() -> dict | None:
        view = json.loads(run_ql(["--json", "status", run_id], ql_env).stdout.splitlines()[0])
        attempt = view["attempts"][0]
        return attempt if attempt["status"] == "running" else None

    attempt = _wait(handle, "the attempt to run")
    rows = dbview.rows(ql_env["QL_DATA_DIR"] and f"sqlite:///{ql_env['QL_DATA_DIR']}/ql.db",
                       "SELECT handle FROM ql_run_attempt WHERE id = ?", (attempt["attempt_id"],))
    return int(json.loads(rows[0]["handle"])["pid"])


def test_ql_run_keeps_waiting_for_a_command_that_outlives_its_killed_launcher(ql_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    go = tmp_path / "go"
    host = subprocess.Popen(QL + ["--json", "run", "--", "sh", "-c",
                                  f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 3'],
                            env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = json.loads(host.stdout.readline())["run_id"]  # type: ignore[union-attr]
        os.kill(_launcher_pid(ql_env, run_id), signal.SIGKILL)  # the launcher alone, not its group
        time.sleep(0.5)
        assert host.poll() is None  # ql run did not declare anything while the command runs
        view = json.loads(run_ql(["--json", "status", run_id], ql_env).stdout.splitlines()[0])
        assert view["status"] == "running"
        go.touch()
        stdout, stderr = host.communicate(timeout=BOUND_S)
    finally:
        release_host(host, go)
    assert host.returncode == 75  # nothing proves how the command ended: lost, never a guess
    final = json_lines(stdout)[-1]
    assert final["status"] == "lost"
    events = json_lines(run_ql(["--json", "events", run_id], ql_env).stdout)
    assert {"type": "attempt.observation_lost", "reason": "LAUNCHER_KILLED_BY_SIGNAL_9"}.items() <= \
        next(e for e in events if e["type"] == "attempt.observation_lost").items()


def test_cancel_still_reaches_a_command_whose_launcher_was_killed(ql_env: dict[str, str]) -> None:
    rec = json_lines(run_ql(["--json", "run", "--detach", "--", "sh", "-c",
                             "echo ready; while :; do sleep 0.05; done"], ql_env).stdout)[0]
    os.kill(_launcher_pid(ql_env, rec["run_id"]), signal.SIGKILL)
    counts = json_lines(run_ql(["--json", "reconcile"], ql_env).stdout)[0]
    assert counts["still_running"] == 1 and counts["lost"] == 0  # the group still runs: not lost
    assert run_ql(["cancel", rec["run_id"]], ql_env).returncode == 0

    def ended() -> dict | None:
        run_ql(["reconcile"], ql_env)
        view = json.loads(run_ql(["--json", "status", rec["run_id"]], ql_env).stdout.splitlines()[0])
        return view if view["status"] not in ("queued", "running") else None

    view = _wait(ended, "the run to end")
    assert (view["status"], view["reason"]) == ("cancelled", "user")
