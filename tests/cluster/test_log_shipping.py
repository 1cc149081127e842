"""Cluster logs end to end: real `ql worker`/`ql control` processes, real PostgreSQL, real faults.

In every case the bytes in the artifact store end up equal to the worker's local log (SHA-256),
contiguous from byte 0 — nothing lost, nothing duplicated."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from ql_core.paths import log_path
from tests.cluster.log_support import (
    Client,
    artifact,
    assert_shipped_equals_local,
    bulk_command,
    rss_kib,
    sha,
    shipped,
    wait_finalized,
    writer_command,
)
from tests.cluster.proxy import Proxy
from tests.cluster.worker_support import QL, Harness, wait_for

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


BIG = {"log_max_bytes": 512 << 20}


SHIP_CRASH_POINTS = ("ship.after_append", "ship.after_finalize")


def test_every_shipping_crash_point_has_a_case() -> None:
    from ql_core.crashpoints import CRASH_POINTS

    assert {p for p in CRASH_POINTS if p.startswith("ship.")} == set(SHIP_CRASH_POINTS)


@pytest.mark.parametrize("point", SHIP_CRASH_POINTS)
def test_kill_at_a_shipping_step_then_restart(harness: Harness, point: str) -> None:
    """Where a real kill cannot aim: right after a chunk or the finalize committed, before the
    shipper heard of it. The restart asks the store where it stands and goes on from there."""
    from ql_core.crashpoints import CRASH_EXIT_CODE

    harness.start_control()
    crashed = harness.start_worker("a", crash=point, limits=BIG)
    run_id = harness.submit(bulk_command(6, pieces=3, pause_s=0.2))
    assert crashed.wait(60) == CRASH_EXIT_CODE, harness.logs()
    attempt = harness.attempts(run_id)[0]
    committed = (artifact(harness, attempt["id"]) or {}).get("committed_bytes", 0)
    assert committed > 0  # the crash came after a commit
    harness.start_worker("a-restarted", worker_id="a", data_dir=harness.worker_dir("a"), limits=BIG)
    harness.wait_status(run_id)
    assert_shipped_equals_local(harness, "a", attempt["id"])


def _proxy(harness: Harness) -> Proxy:
    return Proxy("127.0.0.1", int(harness.sql.info.port))


def test_a_chunk_corrupted_in_transit_is_refused_and_sent_again(harness: Harness) -> None:
    proxy = _proxy(harness)
    try:
        proxy.corrupt_next_bulk()
        harness.start_worker("a", database_url=harness.proxied_url(proxy.port), limits=BIG)
        run_id = harness.submit(bulk_command(4, pieces=2, pause_s=0.2))
        harness.wait_status(run_id)
        assert_shipped_equals_local(harness, "a", harness.attempts(run_id)[0]["id"])
        assert proxy.corrupted == 1
        wait_for(lambda: "refused as corrupt" in harness.procs[-1].log.read_text(), what="the refusal logged")
    finally:
        proxy.close()


def test_a_lost_append_answer_is_replayed_without_a_duplicate(harness: Harness) -> None:
    proxy = _proxy(harness)
    try:
        proxy.cut_after_commit("ql_artifact_append")
        harness.start_worker("a", database_url=harness.proxied_url(proxy.port), limits=BIG)
        run_id = harness.submit(bulk_command(3, pieces=3, pause_s=0.3))
        harness.wait_status(run_id)
        assert_shipped_equals_local(harness, "a", harness.attempts(run_id)[0]["id"])
        assert proxy.cuts == 1
    finally:
        proxy.close()


def test_a_partition_while_shipping_only_delays_it(harness: Harness) -> None:
    harness.start_control()
    proxy = _proxy(harness)
    try:
        harness.start_worker("a", database_url=harness.proxied_url(proxy.port), limits=BIG)
        run_id = harness.submit(bulk_command(16, pieces=16, pause_s=0.25))
        attempt = harness.wait_attempt(run_id)
        wait_for(lambda: (artifact(harness, attempt["id"]) or {}).get("committed_bytes", 0) > 0,
                 what="shipping to start", diagnose=harness.logs)
        proxy.partition()
        time.sleep(2.0)
        proxy.heal()
        harness.wait_status(run_id)
        assert_shipped_equals_local(harness, "a", attempt["id"])
    finally:
        proxy.close()


def test_a_256_mib_log_ships_with_bounded_worker_memory(harness: Harness) -> None:
    worker = harness.start_worker("a", limits=BIG)
    wait_for(lambda: "slots" in worker.log.read_text(), what="the worker to register", diagnose=harness.logs)
    time.sleep(0.5)
    base = peak = rss_kib(worker.pid)
    run_id = harness.submit(["sh", "-c", "head -c 256M /dev/urandom"])
    attempt = harness.wait_attempt(run_id, ("running", "succeeded"))
    deadline = time.monotonic() + 55
    while time.monotonic() < deadline:
        peak = max(peak, rss_kib(worker.pid))
        row = artifact(harness, attempt["id"])
        if row is not None and row["status"] == "final":
            break
        time.sleep(0.05)
    row = artifact(harness, attempt["id"])
    assert row is not None and row["status"] == "final", harness.logs()
    assert row["total_bytes"] == 256 << 20
    # Streamed on both sides (the test holds one chunk at a time too).
    digest, at = hashlib.sha256(), 0
    for chunk in harness.sql.execute("SELECT byte_offset, data FROM ql_artifact_chunk WHERE attempt_id = %s "
                                     "ORDER BY byte_offset", (attempt["id"],)):
        assert chunk["byte_offset"] == at
        digest.update(chunk["data"])
        at += len(chunk["data"])
    local = hashlib.sha256()
    with open(log_path(harness.worker_dir("a"), attempt["log_artifact_id"]), "rb") as f:
        while piece := f.read(1 << 20):
            local.update(piece)
    assert digest.hexdigest() == local.hexdigest() == row["sha256"]
    growth_mib = (peak - base) / 1024
    assert growth_mib < 64, f"worker RSS grew by {growth_mib:.1f} MiB while shipping 256 MiB"


# -- reading on the control node -------------------------------------------------------------------------
class Follower(Client):
    """`ql logs -f RUN` on the control profile, its stdout collected by a thread as it arrives."""

    def __init__(self, harness: Harness, run_id: str) -> None:
        super().__init__(harness, ["logs", "-f", run_id])

    kill = Client.close


def test_a_follower_on_the_control_node_sees_the_bytes_in_order_while_the_worker_ships(harness: Harness) -> None:
    harness.start_control()
    harness.start_worker("a")
    run_id = harness.submit(writer_command(20_000, pause_every=1000, pause_s=0.2))
    harness.wait_attempt(run_id)
    follower = Follower(harness, run_id)
    try:
        wait_for(lambda: len(follower.out) > 0, what="the follower's first bytes", diagnose=harness.logs)
        seen_while_running = harness.status(run_id) == "running"
        rc, out, err = follower.finish()
    finally:
        follower.kill()
    assert rc == 0, err
    assert seen_while_running, "the follower saw nothing before the run ended"
    attempt_id = harness.attempts(run_id)[0]["id"]
    assert out == assert_shipped_equals_local(harness, "a", attempt_id)
    assert out.splitlines()[:2] == [b"00000000 " + b"0" * 90, b"00000001 " + b"0" * 90]


def test_acceptance_follow_on_control_survives_a_worker_kill_and_restart(harness: Harness) -> None:
    """The user story: `ql logs -f` on the control node streams a task running on a worker; the
    worker is SIGKILLed and restarted; the stream goes on without a gap or a duplicate."""
    harness.start_control()
    worker = harness.start_worker("a")
    run_id = harness.submit(writer_command(60_000, pause_every=2000, pause_s=0.2))
    attempt_id = harness.wait_attempt(run_id)["id"]
    follower = Follower(harness, run_id)
    try:
        wait_for(lambda: len(follower.out) > 100_000, what="the stream to be under way", diagnose=harness.logs)
        worker.signal(signal.SIGKILL)
        worker.wait()
        streamed_before_restart = len(follower.out)
        harness.start_worker("a-restarted", worker_id="a", data_dir=harness.worker_dir("a"))
        rc, out, err = follower.finish()
    finally:
        follower.kill()
    # `ql logs -f` exits with the run's status: 0, or 75 when the restart came after the lease expired.
    assert rc == {"succeeded": 0, "lost": 75}[harness.status(run_id)], err
    local = assert_shipped_equals_local(harness, "a", attempt_id)
    assert len(out) > streamed_before_restart  # the rest came after the restart
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(local).hexdigest()
    assert harness.status(run_id) in ("lost", "failed", "succeeded", "cancelled")


def test_ql_logs_reads_the_shipped_log_on_any_node_without_the_orm(harness: Harness) -> None:
    """On the control node and on the worker that did not run it: the same bytes, the same offsets; `ql logs` loads
    no SQLAlchemy/SQLModel/Alembic (psycopg only, like the rest of the cluster read path)."""
    harness.start_worker("a")
    harness.start_worker("b")
    run_id = harness.submit(writer_command(5000))
    harness.wait_status(run_id)
    (attempt,) = harness.attempts(run_id)
    ran_on = attempt["runtime_owner"]  # either worker may have claimed it
    local = assert_shipped_equals_local(harness, ran_on, attempt["id"])
    other = "b" if ran_on == "a" else "a"
    probe = ("import sys\nfrom ql_core.cli.main import main\n"
             "try:\n    main(sys.argv[1:])\nfinally:\n"
             "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel', 'alembic'))\n"
             "    sys.stderr.write('HEAVY=' + ','.join(heavy) + '\\n')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["HOME"] = str(harness.root)
    for config in (harness.control_config(), harness.root / f"{other}.toml"):
        env["QL_CONFIG"] = str(config)
        out = subprocess.run([sys.executable, "-c", probe, "logs", run_id], env=env, capture_output=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout == local
        assert b"HEAVY=\n" in out.stderr, out.stderr
        tail = subprocess.run(QL + ["logs", run_id, "--offset", "4321"], env=env, capture_output=True)
        assert tail.stdout == local[4321:]


def test_ql_control_deletes_shipped_logs_past_retention(harness: Harness) -> None:
    harness.start_worker("a")
    run_id = harness.submit(writer_command(3000))
    harness.wait_status(run_id)
    attempt_id = harness.attempts(run_id)[0]["id"]
    assert_shipped_equals_local(harness, "a", attempt_id)
    harness.start_control(limits={"log_retention_s": 60.0, "artifact_sweep_page": 1})
    time.sleep(1.0)
    assert artifact(harness, attempt_id) is not None  # ended just now: kept
    # Time travel for the run's end alone: it ended two minutes ago (database clock).
    harness.sql.execute("UPDATE ql_run SET finished_at_ms = ql__clock_ms() - 120000 WHERE id = %s", (run_id,))
    wait_for(lambda: artifact(harness, attempt_id) is None, what="retention to delete the shipped log",
             diagnose=harness.logs)
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_artifact_chunk").fetchone()["n"] == 0


def test_follow_of_a_run_cancelled_before_it_started_returns_at_once(harness: Harness) -> None:
    run_id = harness.submit(["true"])
    assert harness.ql("cancel", run_id).returncode == 0
    started = time.monotonic()
    out = harness.ql("logs", "-f", run_id, timeout=30)
    assert out.returncode == 130 and out.stdout == "", out.stderr  # the run's status: cancelled
    assert f"run {run_id} cancelled" in out.stderr
    assert time.monotonic() - started < 20  # not log_follow_unfinalized_s (120 s)


def test_local_retention_keeps_a_log_until_it_is_shipped(harness: Harness) -> None:
    """Cut off from the database, a worker whose logs exceed log_total_max_bytes still keeps the one
    it has not shipped: when the network heals it ships it whole (the local copy goes only after
    the store acknowledged it)."""
    proxy = _proxy(harness)
    try:
        harness.start_worker("a", database_url=harness.proxied_url(proxy.port),
                             limits={"log_total_max_bytes": 1 << 20, "log_max_bytes": 64 << 20})
        run_id = harness.submit(["sh", "-c", "sleep 0.5; head -c 3M /dev/urandom"])
        attempt = harness.wait_attempt(run_id)
        proxy.partition()
        log_id = attempt["log_artifact_id"]
        # The local retention pass has finalized and sized it (the next step would evict it).
        wait_for(lambda: harness.local_rows("a", "SELECT size_bytes FROM ql_log_artifact WHERE id = ? AND "
                                                 "size_bytes IS NOT NULL", (log_id,)),
                 timeout=30, what="the local retention pass to size the ended log", diagnose=harness.logs)
        time.sleep(1.5)  # several more retention rounds (scan_interval_s = 0.5)
        local = log_path(harness.worker_dir("a"), log_id)
        assert local.exists()
        # The log is final (sized): read it now. Once shipped it is over the limit and no longer
        # protected, so the next retention round may evict it at any time after the heal.
        kept = local.read_bytes()
        assert len(kept) == 3 << 20
        proxy.heal()
        art = wait_finalized(harness, attempt["id"])
        data = shipped(harness, attempt["id"])
        assert len(data) == art["total_bytes"] == len(kept)
        assert sha(data) == art["sha256"] == sha(kept)
        # ...and then evicted: shipped, it counts against log_total_max_bytes like any other.
        wait_for(lambda: not local.exists(), timeout=60, what="the shipped log to be evicted locally",
                 diagnose=harness.logs)
    finally:
        proxy.close()
