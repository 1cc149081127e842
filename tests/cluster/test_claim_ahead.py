"""Claiming ahead (docs/cluster.md, "Claiming ahead"): a worker of short tasks holds runs beyond its
slots, each waiting for a slot; a run that waits too long, a drain, a cancel and a SIGKILL of the
worker each end such a run without a spawn and without losing it. Real workers, real tasks.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.worker_support import Harness, trigger_command, wait_for

pytestmark = pytest.mark.postgres

#: One slot and one run ahead; the wait for a slot long enough that nothing is handed back unasked.
AHEAD = {"claim_ahead": 1, "claim_ahead_wait_s": 60.0}


def _short_task_first(harness: Harness) -> None:
    """A worker claims ahead only after a task of its own ran short: give it two (the first of a
    worker's life may be slow on a loaded machine)."""
    for _ in range(2):
        run_id = harness.submit(["true"])
        assert harness.wait_status(run_id)["status"] == "succeeded"


def _waiting_ahead(harness: Harness, worker: str, run_id: str) -> dict[str, Any]:
    """Wait until ``run_id`` is claimed and started by ``worker`` but not spawned: its lease
    ``starting``, no local attempt (the local create comes when it has a slot)."""
    def waiting() -> dict[str, Any] | None:
        rows = harness.attempts(run_id)
        if not rows:
            return None
        lease = harness.lease(rows[-1]["id"])
        if lease is None or lease["status"] != "starting" or lease["worker_id"] != worker:
            return None
        return rows[-1] if harness.local_attempt(worker, rows[-1]["id"]) is None else None

    return wait_for(waiting, what=f"run {run_id} to wait ahead on worker {worker}", diagnose=harness.logs)


def _long_task(harness: Harness, tmp_path: Path) -> tuple[str, Path]:
    trigger = tmp_path / "go"
    run_id = harness.submit(trigger_command(trigger))
    harness.wait_attempt(run_id, ("running",))
    return run_id, trigger


def test_a_run_claimed_ahead_starts_when_the_slot_frees(harness: Harness, tmp_path: Path) -> None:
    harness.start_control()
    harness.start_worker("a", slots=1, plugin=AHEAD)
    _short_task_first(harness)
    long_run, trigger = _long_task(harness, tmp_path)
    ahead = harness.submit(["sh", "-c", "echo ahead"])
    attempt = _waiting_ahead(harness, "a", ahead)
    # The slot is the long task's: the run waits (started at the control plane, not spawned).
    assert harness.run_row(ahead)["status"] == "running" and attempt["status"] == "starting"
    queued = harness.submit(["true"])  # beyond the slot and the one ahead: stays in the queue
    time.sleep(1.0)  # ten claim intervals
    assert harness.status(queued) == "queued"
    trigger.touch()
    for run_id in (long_run, ahead, queued):
        assert harness.wait_status(run_id)["status"] == "succeeded", harness.logs()
    assert harness.event_types(ahead) == ["run.created", "attempt.claimed", "attempt.spawned",
                                          "attempt.succeeded", "run.succeeded"]
    (only,) = harness.attempts(ahead)
    assert only["id"] == attempt["id"]


def test_a_run_that_waits_too_long_for_a_slot_goes_back_to_the_queue(harness: Harness, tmp_path: Path) -> None:
    harness.start_control()
    worker = harness.start_worker("a", slots=1, plugin={"claim_ahead": 1, "claim_ahead_wait_s": 0.3})
    _short_task_first(harness)
    long_run, trigger = _long_task(harness, tmp_path)
    ahead = harness.submit(["true"])  # no retries: a handed-back run must not use one
    first = _waiting_ahead(harness, "a", ahead)
    wait_for(lambda: harness.status(ahead) == "queued", what="the run handed back", diagnose=harness.logs)
    assert harness.lease(first["id"])["end_reason"] == "released"
    # The worker stopped claiming ahead: the run stays queued while the only slot is busy.
    time.sleep(1.0)  # ten claim intervals
    assert harness.status(ahead) == "queued" and len(harness.attempts(ahead)) == 1
    assert harness.local_attempt("a", first["id"]) is None  # never spawned here
    trigger.touch()
    assert harness.wait_status(long_run)["status"] == "succeeded"
    row = harness.wait_status(ahead)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0), harness.logs()
    assert len(harness.attempts(ahead)) == 2
    assert "found no free slot within 0.3s: handed back to the queue" in worker.log.read_text()


def test_a_drain_hands_back_the_runs_waiting_ahead_at_once(harness: Harness, tmp_path: Path) -> None:
    harness.start_control()
    worker = harness.start_worker("a", slots=1, plugin=AHEAD, drain_timeout_s=30.0)
    _short_task_first(harness)
    long_run, trigger = _long_task(harness, tmp_path)
    ahead = harness.submit(["true"])
    first = _waiting_ahead(harness, "a", ahead)
    worker.signal(signal.SIGTERM)
    wait_for(lambda: harness.status(ahead) == "queued", what="the waiting run handed back by the drain",
             diagnose=harness.logs)
    assert worker.alive()  # still draining: its running task finishes first
    trigger.touch()
    assert worker.wait(30) == 0, harness.logs()
    assert harness.wait_status(long_run)["status"] == "succeeded"
    assert harness.local_attempt("a", first["id"]) is None
    harness.start_worker("b", slots=1)
    row = harness.wait_status(ahead)
    assert (row["status"], len(harness.attempts(ahead))) == ("succeeded", 2), harness.logs()


def test_a_cancel_ends_a_run_waiting_ahead_without_a_spawn(harness: Harness, tmp_path: Path) -> None:
    harness.start_control()
    harness.start_worker("a", slots=1, plugin=AHEAD)
    _short_task_first(harness)
    long_run, trigger = _long_task(harness, tmp_path)
    ahead = harness.submit(["true"])
    first = _waiting_ahead(harness, "a", ahead)
    out = harness.ql("cancel", ahead)
    assert out.returncode == 0, out.stderr
    row = harness.wait_status(ahead)
    assert row["status"] == "cancelled", harness.logs()
    assert "attempt.spawned" not in harness.event_types(ahead)
    assert harness.local_attempt("a", first["id"]) is None
    trigger.touch()
    assert harness.wait_status(long_run)["status"] == "succeeded"


def test_a_worker_killed_while_a_run_waits_ahead_releases_it_when_it_restarts(harness: Harness,
                                                                             tmp_path: Path) -> None:
    harness.start_control()
    worker = harness.start_worker("a", slots=1, plugin=AHEAD)
    _short_task_first(harness)
    long_run, _trigger = _long_task(harness, tmp_path)
    ahead = harness.submit(["true"])
    first = _waiting_ahead(harness, "a", ahead)
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    harness.start_worker("a", slots=1, plugin=AHEAD)  # same id and data dir: it adopts what it left
    row = wait_for(lambda: (lambda lease: lease if lease["status"] == "ended" else None)(harness.lease(first["id"])),
                   what="the waiting run's lease to end", diagnose=harness.logs)
    assert row["end_reason"] == "released", harness.logs()  # never launched: not lost
    # The task that ran on without its worker is stopped by the restart and ends lost (no receipt
    # proves its end: docs/cluster.md, a worker restart); the run that only waited is not.
    assert harness.wait_status(long_run)["status"] == "lost", harness.logs()
    done = harness.wait_status(ahead)
    assert (done["status"], len(harness.attempts(ahead))) == ("succeeded", 2), harness.logs()
