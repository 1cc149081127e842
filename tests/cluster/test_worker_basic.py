"""`ql worker` and `ql control` as a user runs them: real processes, real tasks, the real `ql` command."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest

from tests.cluster.worker_support import Harness, trigger_command, wait_for

pytestmark = pytest.mark.postgres


def test_a_run_queued_on_the_control_side_runs_on_a_worker(harness: Harness) -> None:
    harness.start_control()
    harness.start_worker("a")
    out = harness.ql("--json", "run", "--", "sh", "-c", "echo out; exit 7")
    assert out.returncode == 7, (out.stderr, harness.logs())
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    run_id = lines[-1]["run_id"]
    assert (lines[-1]["status"], lines[-1]["exit_code"]) == ("failed", 7)
    assert harness.event_types(run_id) == ["run.created", "attempt.claimed", "attempt.spawned", "attempt.failed",
                                           "run.failed"]
    (attempt,) = harness.attempts(run_id)
    assert (attempt["runtime_owner"], attempt["exit_code"], attempt["executor"]) == ("a", 7, "local")
    # The worker mirrored the attempt with the same ids; its log stayed on the worker.
    local = harness.local_attempt("a", attempt["id"])
    assert local is not None and (local["run_id"], local["exit_code"], local["status"]) == (run_id, 7, "failed")
    assert local["log_artifact_id"] == attempt["log_artifact_id"]
    from ql_core.paths import log_path

    log = log_path(harness.worker_dir("a"), attempt["log_artifact_id"])
    assert log.read_bytes() == b"out\n"
    (row,) = harness.lease_rows("a")
    assert (row["state"], row["answer"], row["kind"], row["lease_token"]) == ("answered", "applied", "complete", None)


def test_quick_tasks_each_reach_the_control_plane_spawned_before_they_end(harness: Harness) -> None:
    # `true` ends within a control round trip: its completion is in the outbox while the round's
    # running reports are still on the wire. It must not be sent ahead of its own running report
    # (a completion is accepted from 'starting' too, and the run would lack attempt.spawned).
    harness.start_control()
    harness.start_worker("a", slots=4)
    from ql_plugins.cluster_fenced import ControlDB
    from ql_plugins.cluster_fenced.control_db import SUBMIT_BATCH, QueuedSubmit
    from ql_plugins.cluster_fenced.sealing import SpecKeyRing, encode_spec, load_key_file
    from ql_core.ids import new_id

    ring = SpecKeyRing(load_key_file(harness.key_file))
    runs = [new_id() for _ in range(200)]
    with ControlDB.connect(harness.dsn) as db:  # at once, as a burst: every slot busy, every round full
        for i in range(0, len(runs), SUBMIT_BATCH):
            db.submit_many([QueuedSubmit(run_id, ring.seal(run_id, encode_spec(["true"], False, None, None), 1))
                            for run_id in runs[i:i + SUBMIT_BATCH]])
    for run_id in runs:
        harness.wait_status(run_id)
    for run_id in runs:
        assert harness.event_types(run_id) == ["run.created", "attempt.claimed", "attempt.spawned",
                                               "attempt.succeeded", "run.succeeded"], (run_id, harness.logs())


def test_detach_then_status_events_and_list_from_the_control_side(harness: Harness) -> None:
    harness.start_worker("a")
    out = harness.ql("--json", "run", "--detach", "--", "true")
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout.splitlines()[0])["run_id"]
    harness.wait_status(run_id)
    status = json.loads(harness.ql("--json", "status", run_id).stdout)
    assert (status["status"], status["exit_code"], len(status["attempts"])) == ("succeeded", 0, 1)
    events = [json.loads(line) for line in harness.ql("--json", "events", run_id).stdout.splitlines()]
    assert [e["type"] for e in events][-2:] == ["attempt.succeeded", "run.succeeded"]
    listed = [json.loads(line) for line in harness.ql("--json", "list").stdout.splitlines()]
    assert [r["run_id"] for r in listed] == [run_id]


def test_timeout_and_cancel_are_intents_the_lease_holder_learns(harness: Harness) -> None:
    harness.start_control()
    harness.start_worker("a")
    out = harness.ql("run", "--timeout", "1", "--", "sleep", "60")
    assert out.returncode == 124, (out.stderr, harness.logs())
    run_id = harness.control.list_runs()[0].run_id
    types = harness.event_types(run_id)
    assert types.index("run.cancel_requested") < types.index("run.timed_out")
    assert harness.run_row(run_id)["reason"] == "timeout"

    run_id = harness.submit(["sleep", "60"])
    harness.wait_attempt(run_id, ("running",))
    out = harness.ql("cancel", run_id)
    assert out.returncode == 0 and "requested" in out.stdout
    row = harness.wait_status(run_id, timeout=30)
    assert (row["status"], row["reason"]) == ("cancelled", "user")
    assert row["exit_code"] in (143, None)


def test_a_queued_run_is_cancelled_at_once_without_a_worker(harness: Harness) -> None:
    run_id = harness.submit(["true"])
    out = harness.ql("--json", "cancel", run_id)
    assert out.returncode == 0
    assert harness.status(run_id) == "cancelled"
    assert harness.event_types(run_id) == ["run.created", "run.cancel_requested", "run.cancelled"]


def test_drain_finish_lets_the_running_attempt_complete(harness: Harness, tmp_path) -> None:
    trigger = tmp_path / "go"
    worker = harness.start_worker("a", drain="finish", drain_timeout_s=60)
    run_id = harness.submit(trigger_command(trigger, 3))
    harness.wait_attempt(run_id, ("running",))
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in worker.log.read_text(), what="the drain to begin")
    # Queued once the drain began: never claimed by this worker. (Submitted right after the signal
    # instead, it could meet a claim the loop had begun before it handled the TERM — on a loaded
    # machine, a claim in flight then took it, and the drain rightly finished it.)
    later = harness.submit(["true"])
    assert worker.alive() and harness.status(run_id) == "running"
    trigger.touch()
    assert worker.wait(60) == 0, harness.logs()
    row = harness.run_row(run_id)
    assert (row["status"], row["exit_code"]) == ("failed", 3)
    assert harness.status(later) == "queued"
    assert harness.sql.execute("SELECT status FROM ql_worker WHERE id = 'a'").fetchone()["status"] == "stopped"


def test_drain_hand_back_stops_the_attempt_and_its_retry_runs_elsewhere(harness: Harness, tmp_path) -> None:
    trigger = tmp_path / "go"
    harness.start_control()
    worker = harness.start_worker("a", drain="hand_back")
    run_id = harness.submit(trigger_command(trigger, 0), retries=1)
    first = harness.wait_attempt(run_id, ("running",))
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, harness.logs()
    attempts = harness.attempts(run_id)
    assert (attempts[0]["status"], attempts[0]["reason"]) == ("lost", "WORKER_DRAINED")
    assert harness.status(run_id) == "queued"
    harness.start_worker("b")
    trigger.touch()
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0)
    second = harness.attempts(run_id)[1]
    assert (second["runtime_owner"], second["attempt_no"]) == ("b", 2) and second["id"] != first["id"]


def test_a_second_worker_on_the_same_data_dir_is_refused(harness: Harness) -> None:
    first = harness.start_worker("a")
    wait_for(lambda: "slots" in first.log.read_text(), what="the first worker to register")
    second = harness.start_worker("a-again", data_dir=harness.worker_dir("a"))
    assert second.wait(30) == 1
    assert "another ql worker runs on" in second.log.read_text()
    assert first.alive()


@pytest.mark.parametrize("plugin_line, fragment", [
    ('worker_id = "no spaces allowed"', "worker_id must be"),
    ("slots = 0", "slots must be"),
    ('drain = "later"', "drain must be"),
    ("colour = 3", "has no setting 'colour'"),
    ("slot = 3", "did you mean 'slots'"),
])
def test_worker_settings_are_one_line_config_errors(harness: Harness, plugin_line: str, fragment: str) -> None:
    config = harness.write_config(harness.root / "bad.toml", profile="cluster-worker",
                                  data_dir=harness.worker_dir("bad"))
    # write_config ends with the [plugin.cluster-fenced] table (it always names the spec key file).
    config.write_text(config.read_text() + plugin_line + "\n")
    out = harness.ql("worker", env={"QL_CONFIG": str(config)}, timeout=30)
    assert out.returncode == 2 and fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_lease_numbers_that_cannot_work_are_refused(harness: Harness) -> None:
    config = harness.write_config(harness.root / "bad.toml", profile="cluster-worker",
                                  data_dir=harness.worker_dir("bad"), limits={"fence_margin_s": 2.0})
    out = harness.ql("worker", env={"QL_CONFIG": str(config)}, timeout=30)
    assert out.returncode == 2 and "fence_margin_s" in out.stderr, out.stderr


def test_a_worker_runs_only_what_it_claims(harness: Harness, tmp_path: Path) -> None:
    """`ql run` on a worker is a wrong-role use: exit 2, one line naming the role and the fix, and
    nothing started or recorded (no standby task, no local run)."""
    config = harness.write_config(harness.root / "w.toml", profile="cluster-worker", data_dir=harness.worker_dir("a"))
    marker = tmp_path / "ran"
    out = harness.ql("run", "--", "touch", str(marker), env={"QL_CONFIG": str(config)}, timeout=30)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "cluster worker" in lines[0] and "runs only what it claims" in lines[0] and "control node" in lines[0]
    assert not marker.exists() and harness.local_rows("a", "SELECT id FROM ql_run") == []


def test_ql_run_env_reaches_a_cluster_task_sealed_and_on_top_of_the_workers_environment(harness: Harness) -> None:
    """`ql run --env K=V --env K` on the control node: the task on the worker sees both, and still
    the worker's own environment (PATH); the values are in no event, log line or output."""
    harness.start_worker("a")
    secret, copied = "s3cr3t-by-env-option", "copied-from-the-submitter"
    script = ('test "$QL_T_SECRET" = s3cr3t-by-env-option && test "$QL_T_COPIED" = copied-from-the-submitter '
              '&& test -n "$PATH" && test -n "$QL_CONFIG"')  # the worker's own variables are still there
    out = harness.ql("--json", "run", "--detach", "--env", f"QL_T_SECRET={secret}", "--env", "QL_T_COPIED",
                     "--", "sh", "-c", script, env={"QL_T_COPIED": copied})
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["run_id"]
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0), harness.logs()
    texts = [out.stdout, out.stderr, json.dumps(harness.events(run_id), default=str)]
    texts += [p.log.read_text() for p in harness.procs]
    assert not any(secret in t or copied in t for t in texts)


def test_tokens_and_task_specs_stay_private(harness: Harness) -> None:
    harness.start_worker("a")
    secret = "s3cr3t-value-for-the-env"
    run_id = harness.submit(["sh", "-c", 'test "$QL_SECRET" = s3cr3t-value-for-the-env'], env={
        "QL_SECRET": secret, "PATH": os.environ["PATH"]})
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0)
    data_dir = harness.worker_dir("a")
    assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(data_dir / "worker.db").st_mode) == 0o600
    # The spec is erased from the control database once the run ended, and is in no event or log line.
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0
    texts = [json.dumps(harness.events(run_id), default=str)] + [p.log.read_text() for p in harness.procs]
    assert not any(secret in t for t in texts)
    # The worker keeps no spec at all; its token is erased with the final answer (which the worker
    # records after the control database committed it: wait for that, not for the run's status).
    (lease,) = wait_for(lambda: [r for r in harness.lease_rows("a") if r["state"] == "answered"],
                        what="the final answer recorded locally", diagnose=harness.logs)
    assert lease["lease_token"] is None and secret not in json.dumps(lease)
