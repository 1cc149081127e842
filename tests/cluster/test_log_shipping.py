"""Cluster logs end to end: real `ql worker`/`ql control` processes, real PostgreSQL, real faults.

In every case the bytes in the artifact store end up equal to the worker's local log (SHA-256),
contiguous from byte 0 — nothing lost, nothing duplicated."""

from __future__ import annotations

import signal

import pytest

from tests.cluster.log_support import (
    artifact,
    assert_shipped_equals_local,
    bulk_command,
    shipped,
    writer_command,
)
from tests.cluster.worker_support import Harness, wait_for

pytestmark = pytest.mark.postgres


def test_a_task_log_is_shipped_while_it_runs_and_finalized_after(harness: Harness) -> None:
    harness.start_worker("a")
    run_id = harness.submit(writer_command(30_000, pause_every=3000, pause_s=0.3))
    attempt = harness.wait_attempt(run_id)
    # Shipped while running: committed bytes appear before the run ends.
    wait_for(lambda: (lambda a: a is not None and a["committed_bytes"] > 0 and a["status"] == "open")(
        artifact(harness, attempt["id"])) and harness.status(run_id) == "running",
        what="bytes shipped while the task runs", diagnose=harness.logs)
    assert harness.wait_status(run_id)["status"] == "succeeded"
    data = assert_shipped_equals_local(harness, "a", attempt["id"])
    assert len(data) == 30_000 * 100
    (row,) = harness.local_rows("a", "SELECT state, lease_token FROM ql_log_ship")
    assert row == {"state": "final", "lease_token": None}  # the token is gone once acknowledged


def test_kill_9_of_the_worker_mid_shipping_then_restart_resumes(harness: Harness) -> None:
    harness.start_control()  # the sweeper ends the run whose lease the killed worker lost
    harness.start_worker("a", limits={"log_max_bytes": 256 << 20})
    run_id = harness.submit(bulk_command(48, pieces=24, pause_s=0.1))
    attempt = harness.wait_attempt(run_id)
    wait_for(lambda: (artifact(harness, attempt["id"]) or {}).get("committed_bytes", 0) >= 4 << 20,
             what="some MiB shipped", diagnose=harness.logs)
    worker = harness.procs[-1]
    worker.signal(signal.SIGKILL)
    worker.wait()
    harness.start_worker("a", limits={"log_max_bytes": 256 << 20})
    harness.wait_status(run_id)
    assert_shipped_equals_local(harness, "a", attempt["id"])
