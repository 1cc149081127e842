"""The cluster's failure tests: real PostgreSQL, real worker processes, real signals, a real proxy.

Each checks (besides its own story): at most one terminal event per run, no accepted completion
from an old generation, no false success (``check_invariants`` on the control database at
teardown), the workers' exit codes agree with the control plane's and no token outlives its final
answer (``check_workers``), and nothing is deleted before its final answer (asserted per test).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from ql_core.paths import log_path

from tests.cluster.proxy import Proxy
from tests.cluster.worker_support import Harness, trigger_command, wait_for

pytestmark = pytest.mark.postgres

#: A task that finishes at once on a worker started with FAST=1 and sleeps a minute elsewhere.
FAST_OR_SLOW = ["sh", "-c", 'echo started; if [ -n "$FAST" ]; then exit 0; fi; sleep 60; exit 0']


def _audit(h: Harness, attempt_id: str) -> list[dict]:
    return [e for e in h.sql.execute("SELECT * FROM ql_run_event WHERE attempt_id = %s AND "
                                     "type = 'attempt.completion_fenced'", (attempt_id,)).fetchall()]


@pytest.mark.parametrize("retries", [0, 1])
def test_paused_worker_is_fenced_and_stops_its_task(harness: Harness, retries: int) -> None:
    harness.start_control()
    a = harness.start_worker("a")
    run_id = harness.submit(FAST_OR_SLOW, retries=retries)
    first = harness.wait_attempt(run_id, ("running",))
    a.signal(signal.SIGSTOP)
    # Past its lease: the sweeper ends A's attempt (lost), or queues the run for another attempt.
    wait_for(lambda: harness.attempts(run_id)[0]["status"] == "lost", what="the sweeper to end A's attempt")
    assert harness.attempts(run_id)[0]["reason"] == "LEASE_EXPIRED"
    if retries:
        harness.start_worker("b", env={"FAST": "1"})
        row = harness.wait_status(run_id)
        assert (row["status"], row["exit_code"]) == ("succeeded", 0)
        assert harness.attempts(run_id)[1]["runtime_owner"] == "b"
    else:
        assert harness.status(run_id) == "lost"
    before = {k: v for k, v in harness.run_row(run_id).items() if k != "event_seq"}
    a.signal(signal.SIGCONT)
    # A fences itself (its own deadline passed while it was stopped), stops its task, and its
    # completion is answered 'fenced' and audited — the run keeps its one terminal state.
    wait_for(lambda: any(r["answer"] == "fenced" for r in harness.lease_rows("a")), what="A's fenced answer",
             diagnose=harness.logs)
    (lease,) = harness.lease_rows("a")
    # Whichever A noticed first: its own deadline (it reports the stopped task "lost", never the exit
    # status it caused itself) or the database's "fenced" renewal answer (it reports the completion).
    assert (lease["stop_reason"], lease["kind"]) in (("SELF_FENCED", "lost"), ("FENCED", "complete")), lease
    local = harness.local_attempt("a", first["id"])
    assert local is not None and local["exit_code"] == 143  # A stopped it: TERM, not the task's own end
    (audit,) = _audit(harness, first["id"])
    assert audit["reason"] == "LEASE_EXPIRED" and audit["exit_code"] in (143, None)
    after = {k: v for k, v in harness.run_row(run_id).items() if k != "event_seq"}
    assert after == before
    assert a.alive()  # fenced leases only: the worker itself goes on


# -- kill -9 at every step of the worker's local journal, restart with the same id -------------------
#: crash point -> (touch the trigger before the crash?, the final answer(s) of attempt 1's lease row).
CRASH_CASES = {
    "worker.claim.after_answer": (True, None),           # never recorded: the sweeper requeues it
    "worker.start.after_answer": (True, "applied"),      # released on restart (RELEASED)
    "worker.launch.before_spawn": (True, "applied"),     # its host is gone: never started, released
    "spawn.after_log_created": (True, "applied"),        # likewise (log file made, nothing forked)
    "spawn.before_handle_commit": (True, "applied"),     # launcher held, never released: released
    "worker.running.before_call": (False, "fenced"),     # runs on without a lease: stopped, fenced
    "completion.before_commit": (True, "applied"),       # receipt replayed locally, then submitted
    # Inside the local terminal commit (the outbox row is written in it): both roll back, the
    # receipt is replayed on restart and its terminal commit writes the outbox row.
    "worker.outbox.before_insert": (True, "applied"),
    # A runner waits for its task on the acknowledged path (no receipt while the worker lives):
    # reaped, nothing committed — the task's publisher then publishes the receipt, replayed on restart.
    "wait.after_exit": (True, "applied"),
    # The outbox row exists before these points: the control loop may have sent it already (then the
    # restart's replay is answered already_completed) — either is the one true answer. Before the
    # acknowledgement the publisher publishes the receipt, which the restart finds already applied.
    "wait.before_ack": (True, ("applied", "already_completed")),
    "wait.after_ack": (True, ("applied", "already_completed")),
    "worker.outbox.after_submit": (True, "already_completed"),  # the replay of a committed completion
}


#: The points between the local create commit and the task's go-ahead on the classic spawn path
#: (the launcher forked after the create commit, its handle committed before it is released): run
#: by a worker with standby launchers off. With a standby (the default) the handle is in the create
#: commit and the go-ahead is the hand-over: STANDBY_CASES.
CLASSIC_ONLY = ("worker.launch.before_spawn", "spawn.after_log_created", "spawn.before_handle_commit")

#: Standby launchers (the default): a claimed attempt's create commit records the standby's handle
#: (``launching`` in the same commit), then the standby is handed its run. point -> (the first
#: attempt's status and reason, did its command run?).
STANDBY_CASES = {
    # Killed after the create commit, before the hand-over: the idle standby reads EOF and exits
    # having run nothing — but nothing can prove that afterwards (no receipt, process gone, as for
    # a launcher killed mid-task), so the attempt ends lost, never a status nobody saw; the run
    # runs again on its retry.
    "worker.launch.before_spawn": (("lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"), False),
    "spawn.after_log_created": (("lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"), False),
    # Killed right after the hand-over: the launcher runs the task and, its waiter gone,
    # publishes the receipt, which the restart replays: the first attempt's true result.
    "start.after_hand_over": (("succeeded", None), True),
}


def test_every_worker_crash_point_has_a_case() -> None:
    from ql_core.crashpoints import CRASH_POINTS

    assert {p for p in CRASH_POINTS if p.startswith("worker.")} <= set(CRASH_CASES)


@pytest.mark.parametrize("point", list(CRASH_CASES))
def test_kill_at_a_crash_point_then_restart_with_the_same_id(harness: Harness, tmp_path, point: str) -> None:
    from ql_core.crashpoints import CRASH_EXIT_CODE

    local = {"standby": False} if point in CLASSIC_ONLY else None
    trigger_first, first_answer = CRASH_CASES[point]
    trigger = tmp_path / "go"
    # Leases longer than a loaded machine's worker restart (2-5 s at load 17): the restarted worker's
    # own replay must be what answers first, not the sweeper expiring a 3 s lease meanwhile.
    harness.limits = dict(harness.limits, run_lease_s=10.0, fence_margin_s=2.0, session_lease_s=12.0)
    harness.start_control()
    command = ["sh", "-c", f'echo started; i=0; while [ ! -e "{trigger}" ] && [ "$i" -lt 2400 ]; do sleep 0.05; '
                           f'i=$((i+1)); done; exit 0']
    if trigger_first:
        trigger.touch()
    crashed = harness.start_worker("a", crash=point, local=local)
    run_id = harness.submit(command, retries=1)
    assert crashed.wait(60) == CRASH_EXIT_CODE, harness.logs()
    restarted = harness.start_worker("a-restarted", worker_id="a", data_dir=harness.worker_dir("a"), local=local)
    wait_for(lambda: "slots" in restarted.log.read_text(), what="the restarted worker to register",
             diagnose=harness.logs)
    trigger.touch()
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0), harness.logs()
    attempts = harness.attempts(run_id)
    # Nothing launched was ever started twice: every local attempt's log says "started" at most once
    # (never, for an attempt released because it provably never started).
    for attempt in attempts:
        log = log_path(harness.worker_dir("a"), attempt["log_artifact_id"])
        if log.exists():
            expected = 0 if attempt["reason"] == "RELEASED" else 1
            assert log.read_text().count("started") == expected, (attempt["id"], log.read_text())
    # Every attempt of the run was answered (outbox replayed); nothing left unanswered.
    wait_for(lambda: all(r["state"] == "answered" for r in harness.lease_rows("a")),
             what="every outbox row to get its final answer", diagnose=harness.logs)
    answers = {r["attempt_id"]: r["answer"] for r in harness.lease_rows("a")}
    if first_answer is None:
        assert attempts[0]["reason"] == "CLAIM_EXPIRED" and attempts[0]["id"] not in answers
    else:
        allowed = first_answer if isinstance(first_answer, tuple) else (first_answer,)
        assert answers[attempts[0]["id"]] in allowed, (answers, harness.logs())
    if point in ("worker.start.after_answer", "worker.launch.before_spawn", "spawn.after_log_created",
                 "spawn.before_handle_commit"):
        assert (attempts[0]["status"], attempts[0]["reason"]) == ("lost", "RELEASED")
    # One spawned event per attempt that ran, one terminal pair for the run.
    types = harness.event_types(run_id)
    assert types.count("run.succeeded") == 1 and types.count("attempt.succeeded") == 1
    spawned = [e["attempt_id"] for e in harness.events(run_id) if e["type"] == "attempt.spawned"]
    assert len(spawned) == len(set(spawned))


@pytest.mark.parametrize("point", list(STANDBY_CASES))
def test_kill_at_a_standby_crash_point_then_restart_with_the_same_id(harness: Harness, tmp_path, point: str) -> None:
    from ql_core.crashpoints import CRASH_EXIT_CODE

    (status, reason), ran = STANDBY_CASES[point]
    harness.limits = dict(harness.limits, run_lease_s=10.0, fence_margin_s=2.0, session_lease_s=12.0)
    harness.start_control()
    crashed = harness.start_worker("a", crash=point)
    run_id = harness.submit(["sh", "-c", "echo started"], retries=1)
    assert crashed.wait(60) == CRASH_EXIT_CODE, harness.logs()
    harness.start_worker("a-restarted", worker_id="a", data_dir=harness.worker_dir("a"))
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0), harness.logs()
    attempts = harness.attempts(run_id)
    assert (attempts[0]["status"], attempts[0]["reason"]) == (status, reason), (attempts, harness.logs())
    assert len(attempts) == (1 if status == "succeeded" else 2)
    # The first attempt's command ran exactly when the hand-over happened; no command ran twice.
    log = log_path(harness.worker_dir("a"), attempts[0]["log_artifact_id"])
    assert (log.read_text().count("started") if log.exists() else 0) == (1 if ran else 0), harness.logs()
    wait_for(lambda: all(r["state"] == "answered" for r in harness.lease_rows("a")),
             what="every outbox row to get its final answer", diagnose=harness.logs)
    types = harness.event_types(run_id)
    assert types.count("run.succeeded") == 1 and types.count("attempt.succeeded") == 1


# -- the network: a lost COMMIT answer, a partition ------------------------------------------------------
def test_a_lost_commit_answer_is_replayed_and_answered_already_completed(harness: Harness) -> None:
    host, port = "127.0.0.1", int(harness.sql.info.port)
    proxy = Proxy(host, port)
    try:
        # The completion's statement: ql_spawn_complete_many (0017), ql_complete_many or ql_complete.
        proxy.cut_after_commit("_complete")
        harness.start_worker("a", database_url=harness.proxied_url(proxy.port))
        run_id = harness.submit(["sh", "-c", "exit 5"])
        row = harness.wait_status(run_id)
        assert (row["status"], row["exit_code"]) == ("failed", 5)
        wait_for(lambda: [r["answer"] for r in harness.lease_rows("a")] == ["already_completed"],
                 what="the replay's answer", diagnose=harness.logs)
        assert proxy.cuts == 1
        types = harness.event_types(run_id)
        assert types.count("run.failed") == 1 and "attempt.late_callback_ignored" not in types
    finally:
        proxy.close()


def test_a_partitioned_worker_fences_itself_before_its_lease_expires(harness: Harness) -> None:
    host, port = "127.0.0.1", int(harness.sql.info.port)
    proxy = Proxy(host, port)
    try:
        harness.start_control()
        worker = harness.start_worker("a", database_url=harness.proxied_url(proxy.port))
        run_id = harness.submit(["sh", "-c", "echo started; sleep 60"])
        attempt = harness.wait_attempt(run_id, ("running",))
        proxy.partition()
        row = harness.wait_status(run_id)  # the sweeper: LEASE_EXPIRED
        assert (row["status"], row["reason"]) == ("lost", "LEASE_EXPIRED")
        lease = harness.lease(attempt["id"])
        (local_row,) = harness.lease_rows("a")
        local = harness.local_attempt("a", attempt["id"])
        # The worker stopped its task before the database's lease expired (one machine, one clock).
        assert (local_row["stop_reason"], local_row["kind"], local_row["reason"]) == (
            "SELF_FENCED", "lost", "WORKER_FENCED")
        assert local_row["stopped_at_ms"] < lease["expires_at_ms"], (local_row, lease)
        assert local is not None and local["status"] in ("failed", "lost")
        assert local["finished_at_ms"] is None or local["finished_at_ms"] <= lease["expires_at_ms"] + 50
        # Nothing was sent while partitioned; the outbox row is kept until its final answer.
        assert local_row["state"] == "outbox"
        before = {k: v for k, v in harness.run_row(run_id).items() if k != "event_seq"}
        proxy.heal()
        wait_for(lambda: harness.lease_rows("a")[0]["answer"] == "fenced", what="the fenced answer after healing",
                 diagnose=harness.logs)
        after = {k: v for k, v in harness.run_row(run_id).items() if k != "event_seq"}
        assert after == before  # nothing it sends changes the run
        # It claims again once its session is confirmed.
        later = harness.submit(["true"])
        assert harness.wait_status(later)["status"] == "succeeded"
        assert worker.alive()
    finally:
        proxy.close()


# -- clocks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("skew", ["+10m", "-10m"])
def test_a_worker_with_a_skewed_clock_keeps_correct_leases(harness: Harness, skew: str) -> None:
    from tests.truth.faked_clock import LIBFAKETIME

    if not os.path.exists(LIBFAKETIME):
        pytest.fail("faketime is not installed (Debian package faketime; .ci/run installs it)")
    harness.start_control()
    # The wall clock is skewed (what a machine without NTP has); its monotonic clock is not, and must
    # not be faked: Python's timed waits take a monotonic deadline to the kernel unfaked.
    # libfaketime preloaded, not the `faketime` wrapper, which leaves a pid-named semaphore behind when
    # killed (a later wrapper with that pid then fails: "sem_open: File exists").
    harness.start_worker("skewed", env={"LD_PRELOAD": LIBFAKETIME, "FAKETIME": skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    quick = harness.submit(["sh", "-c", "sleep 0.2; exit 4"])
    slow = harness.submit(["sleep", "5"])  # longer than a lease: renewals must keep it
    timed = harness.submit(["sleep", "60"], timeout_s=1)
    for run_id, status, code in ((quick, "failed", 4), (slow, "succeeded", 0), (timed, "timed_out", None)):
        row = harness.wait_status(run_id)
        assert row["status"] == status, (run_id, row, harness.logs())
        if code is not None:
            assert row["exit_code"] == code
        (attempt,) = harness.attempts(run_id)
        # Times are on the database's clock: within the attempt's life, never 10 minutes off. (The
        # finish is an upper bound translated with the offset measured on a call: it may lie up to one
        # round trip after the commit that recorded it.)
        assert attempt["created_at_ms"] <= attempt["started_at_ms"] <= attempt["finished_at_ms"]
        assert attempt["finished_at_ms"] <= row["updated_at_ms"] + 1_000
        assert attempt["finished_at_ms"] - attempt["started_at_ms"] < 120_000
    assert harness.attempts(slow)[0]["finished_at_ms"] - harness.attempts(slow)[0]["started_at_ms"] >= 4_500
    assert not any(r["stop_reason"] for r in harness.lease_rows("skewed"))  # never fenced itself


# -- identities and sweepers ---------------------------------------------------------------------------
def test_a_reused_worker_id_fences_the_older_process(harness: Harness) -> None:
    harness.start_control()
    old = harness.start_worker("old", worker_id="shared")
    run_id = harness.submit(FAST_OR_SLOW, retries=1)
    first = harness.wait_attempt(run_id, ("running",))
    harness.start_worker("new", worker_id="shared", env={"FAST": "1"})
    # The older process learns it was replaced: it stops its attempt and exits with an error.
    assert old.wait(60) == 1, harness.logs()
    assert "registered by another process" in old.log.read_text()
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0)
    attempts = harness.attempts(run_id)
    assert (attempts[0]["status"], attempts[0]["reason"]) == ("lost", "LEASE_EXPIRED")
    assert attempts[1]["runtime_owner"] == "shared"
    local = harness.local_attempt("old", first["id"])
    assert local is not None and local["exit_code"] in (143, 137)
    # Its completion, if it got one out before it exited, was fenced; else it waits in its outbox.
    (lease,) = harness.lease_rows("old")
    assert lease["answer"] in (None, "fenced") and lease["stop_reason"] == "FENCED"


def test_two_control_processes_sweep_at_once_without_double_action(harness: Harness) -> None:
    import uuid

    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB
    from ql_plugins.cluster_fenced.results import LeaseAnswer

    db = ControlDB.connect(harness.dsn)
    try:
        worker = db.register("ghost", str(uuid.uuid4()), slots=64, ql_version="test").worker
        runs = [harness.submit(["true"], retries=i % 2) for i in range(48)]
        claimed = []
        for _ in range(6):
            ids = [new_id() for _ in range(8)]
            claimed += db.claim(worker, max_n=8, free_slots=8, executor="local", attempt_ids=ids,
                                log_ids=[new_id() for _ in range(8)], lease_ttl_ms=5000).attempts
        for i, c in enumerate(claimed):
            if i % 3:  # two thirds started (lost or retried), one third only claimed (requeued)
                fence = c.fence(worker)
                # Each start must land inside its lease: a loaded machine once took over 1 s for these
                # calls, and an attempt whose start is fenced is requeued, not lost.
                assert db.start(fence).answer is LeaseAnswer.OK, "a start outlived the test's lease"
                db.running(fence, started_at_ms=0)
    finally:
        db.close()
    assert len(claimed) == 48
    limits = {"sweep_page": 4, "sweep_interval_s": 0.05}
    harness.start_control("control-1", limits=limits)
    harness.start_control("control-2", limits=limits)
    wait_for(lambda: harness.sql.execute("SELECT count(*) AS n FROM ql_attempt_lease WHERE status <> 'ended'")
             .fetchone()["n"] == 0, what="both sweepers to end every lease", diagnose=harness.logs)
    for i, c in enumerate(claimed):
        lost = [e for e in harness.events(c.run_id) if e["type"] == "attempt.lost" and e["attempt_id"] == c.attempt_id]
        assert len(lost) == 1, (c.run_id, harness.event_types(c.run_id))
    statuses = {r: harness.status(r) for r in runs}
    assert set(statuses.values()) <= {"queued", "lost"}
    assert sum(1 for s in statuses.values() if s == "lost") == sum(
        1 for i, c in enumerate(claimed) if i % 3 and harness.run_row(c.run_id)["max_attempts"] == 1)
    # Both processes really swept (each acted on some leases), and none acted twice (above).
    assert all("sweep:" in (harness.root / f"{name}.log").read_text() for name in ("control-1", "control-2")), \
        harness.logs()


@pytest.mark.slow
def test_expire_versus_complete_with_real_pauses_many_times(harness: Harness) -> None:
    """A worker paused around the moment its lease expires, while its task completes: either the
    completion or the sweeper wins — never both, never neither — round after round."""
    import random

    rng = random.Random(7)
    harness.start_control(limits={"sweep_interval_s": 0.05})
    worker = harness.start_worker("a", slots=1, limits={"run_lease_s": 1.0, "fence_margin_s": 0.2,
                                                         "heartbeat_interval_s": 0.2, "session_lease_s": 2.0})
    outcomes: dict[str, int] = {}
    for _ in range(12):
        run_id = harness.submit(["sh", "-c", "sleep 0.3"])
        harness.wait_attempt(run_id, ("running", "succeeded", "lost"))
        worker.signal(signal.SIGSTOP)
        time.sleep(rng.uniform(0.6, 1.6))  # the fault itself: a pause of a chosen length, not a wait
        worker.signal(signal.SIGCONT)
        row = harness.wait_status(run_id)
        outcomes[row["status"]] = outcomes.get(row["status"], 0) + 1
        assert row["status"] in ("succeeded", "lost"), row
    wait_for(lambda: all(r["state"] == "answered" for r in harness.lease_rows("a")), what="every answer",
             diagnose=harness.logs)
    assert sum(outcomes.values()) == 12
