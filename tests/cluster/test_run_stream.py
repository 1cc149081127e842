"""`ql run` and `ql logs -f` on the control node follow a task that runs on a worker like a local one.

Real `ql control` and `ql worker` processes, real PostgreSQL: the output streams from the chunks the
worker ships while the task runs; the exit codes are the local ones (the task's own, 124, 130, 75),
and a run that ended `lost`, `cancelled` or `timed_out` gets one line on stderr saying so."""

from __future__ import annotations

import signal
import time
from urllib.parse import urlsplit

import pytest

from tests.cluster.proxy import Proxy
from tests.cluster.log_support import Client, streamed
from tests.cluster.worker_support import Harness, wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def roomy_leases(harness: Harness) -> None:
    """Leases long enough that a loaded machine does not make a worker fence itself before its task
    printed its first line (these tests follow a task; they are not about renewal under load)."""
    harness.limits.update(run_lease_s=10.0, fence_margin_s=2.0, session_lease_s=12.0, heartbeat_interval_s=1.0)


def test_ql_run_on_the_control_node_streams_the_task_while_it_runs_and_exits_with_its_code(harness: Harness) -> None:
    trigger = harness.root / "go"
    script = (f'echo "first line"; i=0; while [ ! -e "{trigger}" ] && [ $i -lt 2400 ]; do sleep 0.05; '
              f'i=$((i+1)); done; echo "second line"; exit 3')
    with streamed(harness, "run", script=script, first=b"first line\n") as s:
        assert harness.status(s.run_id) == "running"  # it streamed while the task ran on the worker
        trigger.touch()
        rc, out, err = s.client.finish()
    assert rc == 3, err
    assert out == b"first line\nsecond line\n"
    assert "ended" not in err and "not finalized" not in err, err  # failed with a code: no verdict line


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_run_that_timed_out_or_was_cancelled_says_so_and_exits_like_locally(harness: Harness, how: str) -> None:
    args = ["run", "--timeout", "2"] if how == "timeout" else ["run"]
    with streamed(harness, *args, follow=True) as s:
        if how == "cancel":
            assert harness.ql("cancel", s.run_id).returncode == 0
        (rc, out, err), (frc, fout, ferr) = s.finish()
    run_id = s.run_id
    status, code = ("timed_out", 124) if how == "timeout" else ("cancelled", 130)
    assert harness.status(run_id) == status
    assert (rc, out) == (code, b"started\n"), err
    assert f"ql: run {run_id} ended {status}" in err
    assert (frc, fout) == (code, b"started\n"), ferr
    assert f"ql: run {run_id} {status}" in ferr


def test_a_follower_of_a_run_whose_worker_died_says_it_ended_lost_and_exits_75(harness: Harness) -> None:
    """The worker is SIGKILLed and never comes back: its lease expires, `ql control` ends the run
    `lost`; `ql run` and `ql logs -f` on the control node say so and exit 75 — neither waits for a
    log its dead worker will never finalize longer than their bound."""
    harness.limits["log_follow_unfinalized_s"] = 3.0
    with streamed(harness, "run", follow=True) as s:
        s.worker.signal(signal.SIGKILL)
        s.worker.wait()
        (rc, out, err), (frc, fout, ferr) = s.finish()
    run_id = s.run_id
    assert harness.status(run_id) == "lost"
    assert (rc, out) == (75, b"started\n"), err
    assert f"ql: run {run_id} ended lost" in err
    assert "has not finalized the log" in err, err
    assert (frc, fout) == (75, b"started\n"), ferr
    assert f"ql: run {run_id} lost" in ferr


def test_ql_run_with_retries_streams_the_attempt_that_runs_again(harness: Harness) -> None:
    """A lost attempt of a run with retries: `ql run` says so and streams the new attempt from its start."""
    marker = harness.root / "ran-once"
    script = (f'if [ -e "{marker}" ]; then echo "second attempt"; exit 0; fi; touch "{marker}"; '
              f'echo "first attempt"; sleep 60')
    with streamed(harness, "run", "--retries", "1", script=script, first=b"first attempt\n") as s:
        s.worker.signal(signal.SIGKILL)
        s.worker.wait()
        harness.start_worker("b")
        rc, out, err = s.client.finish()
    assert rc == 0, err
    assert out == b"first attempt\nsecond attempt\n"
    assert "was lost; the run runs again as attempt" in err, err


def test_a_worker_restarted_while_followed_stops_the_old_task_and_the_followers_say_lost(harness: Harness) -> None:
    """The example's story: the worker is SIGKILLed and started again at once (same data dir). The
    restarted worker stops the task its previous process left running; the run ends `lost`, and
    `ql run` and `ql logs -f` on the control node say so and exit 75 — not 0 without a word."""
    with streamed(harness, "run", follow=True) as s:
        s.worker.signal(signal.SIGKILL)
        s.worker.wait()
        harness.start_worker("a-restarted", worker_id="a", data_dir=harness.worker_dir("a"))
        (rc, out, err), (frc, fout, ferr) = s.finish()
    run_id = s.run_id
    assert harness.status(run_id) == "lost"
    assert (rc, out) == (75, b"started\n"), err
    assert f"ql: run {run_id} ended lost" in err
    assert (frc, fout) == (75, b"started\n"), ferr
    assert f"ql: run {run_id} lost" in ferr


def test_ql_run_streams_on_after_the_control_database_was_away(harness: Harness) -> None:
    """`ql run`'s connection to the control database is cut off (a partition, then every connection
    dropped): the stream resumes at the byte it had reached — no gap, no repeated line."""
    parts = urlsplit(harness.dsn)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        harness.start_control()
        harness.start_worker("a")
        config = harness.write_config(harness.root / "control-proxied.toml", profile="cluster-control",
                                      data_dir=harness.root / "control-data",
                                      database_url=harness.proxied_url(proxy.port))
        script = 'i=1; while [ $i -le 60 ]; do echo "line $i"; i=$((i+1)); sleep 0.1; done'
        client = Client(harness, ["run", "--", "sh", "-c", script], config=config)
        try:
            wait_for(lambda: b"line 1\n" in bytes(client.out), what="the first line", diagnose=harness.logs)
            proxy.partition()
            time.sleep(2.0)
            proxy.heal()
            rc, out, err = client.finish()
        finally:
            client.close()
    finally:
        proxy.close()
    assert rc == 0, err
    assert out == b"".join(b"line %d\n" % i for i in range(1, 61))


def test_ctrl_c_on_a_streaming_ql_run_cancels_the_run_on_its_worker(harness: Harness) -> None:
    """SIGINT while `ql run` sleeps on the store's notification: the cancel intent is committed, the
    worker stops the task, `ql run` says so and exits 130, as locally."""
    with streamed(harness, "run") as s:
        s.client.proc.send_signal(signal.SIGINT)
        rc, out, err = s.client.finish()
    run_id = s.run_id
    assert harness.status(run_id) == "cancelled"
    assert (rc, out) == (130, b"started\n"), err
    assert f"ql: cancelling run {run_id}" in err and f"ql: run {run_id} ended cancelled" in err, err
