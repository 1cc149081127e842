"""The soak: 4 workers × 2 slots, 2 sweepers, 500 runs of mixed tasks, workers SIGKILLed and
SIGSTOPped at random — then every run is terminal and every invariant holds.

Bounded: the faults stop after ``CHAOS_S`` seconds, every stopped worker is continued and every
killed one restarted (same id, same data dir), and the runs must all end within ``SETTLE_S``.
Set ``QL_SOAK_REPORT=/path.json`` to keep the counts (runs per outcome, faults injected).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from tests.cluster.support import check_invariants
from tests.cluster.worker_support import TERMINAL, Harness, check_workers, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

RUNS = 500
WORKERS = 4
SLOTS = 2
CHAOS_S = 45.0
SETTLE_S = 150.0

#: kind -> (command, retries, timeout_s, allowed final statuses)
KINDS = {
    "ok": (["true"], 0, None, {"succeeded", "lost"}),
    "exit3": (["sh", "-c", "exit 3"], 0, None, {"failed", "lost"}),
    "short": (["sh", "-c", "sleep 0.{n}; exit 0"], 0, None, {"succeeded", "lost"}),
    "retried": (["sh", "-c", "sleep 0.3; exit 0"], 2, None, {"succeeded", "lost"}),
    "timeout": (["sleep", "30"], 0, 1.0, {"timed_out", "lost"}),
    "cancel": (["sleep", "30"], 1, None, {"cancelled", "lost"}),
}
MIX = ["ok"] * 30 + ["exit3"] * 15 + ["short"] * 25 + ["retried"] * 15 + ["timeout"] * 7 + ["cancel"] * 8


def test_soak(harness: Harness) -> None:
    rng = random.Random(int(os.environ.get("QL_SOAK_SEED", "20261130")))
    harness.start_control("control-1")
    harness.start_control("control-2")
    workers = {f"w{i}": harness.start_worker(f"w{i}", slots=SLOTS, drain_timeout_s=5) for i in range(WORKERS)}
    restarts = {name: 0 for name in workers}
    kinds: dict[str, str] = {}
    for _ in range(RUNS):
        kind = rng.choice(MIX)
        command, retries, timeout_s, _allowed = KINDS[kind]
        command = [part.replace("{n}", str(rng.randint(1, 8))) for part in command]
        kinds[harness.submit(command, retries=retries, timeout_s=timeout_s)] = kind
    to_cancel = [r for r, k in kinds.items() if k == "cancel"]

    faults = {"sigkill": 0, "sigstop": 0, "cancels": 0}
    stopped: dict[str, float] = {}
    end = time.monotonic() + CHAOS_S
    while time.monotonic() < end:
        now = time.monotonic()
        for name, until in list(stopped.items()):
            if now >= until:
                workers[name].signal(signal.SIGCONT)
                del stopped[name]
        for name, proc in workers.items():
            if not proc.alive() and name not in stopped:  # killed: restart with the same id and data dir
                restarts[name] += 1
                workers[name] = harness.start_worker(f"{name}-r{restarts[name]}", worker_id=name, slots=SLOTS,
                                                     drain_timeout_s=5, data_dir=harness.worker_dir(name))
        if to_cancel and rng.random() < 0.5:
            harness.control.cancel(to_cancel.pop(), "user")
            faults["cancels"] += 1
        name = rng.choice(list(workers))
        proc = workers[name]
        if proc.alive() and name not in stopped:
            if rng.random() < 0.5:
                proc.signal(signal.SIGKILL)
                proc.wait(10)
                faults["sigkill"] += 1
            else:
                proc.signal(signal.SIGSTOP)
                stopped[name] = now + rng.uniform(0.5, 5.0)
                faults["sigstop"] += 1
        time.sleep(rng.uniform(0.3, 1.2))  # the chaos's own pace: when the next fault strikes
    for name in list(stopped):
        workers[name].signal(signal.SIGCONT)
    for name, proc in workers.items():
        if not proc.alive():
            restarts[name] += 1
            workers[name] = harness.start_worker(f"{name}-r{restarts[name]}", worker_id=name, slots=SLOTS,
                                                 drain_timeout_s=5, data_dir=harness.worker_dir(name))
    for run_id in to_cancel:
        harness.control.cancel(run_id, "user")

    def unfinished() -> int:
        return harness.sql.execute("SELECT count(*) AS n FROM ql_run WHERE status <> ALL(%s)",
                                   (list(TERMINAL),)).fetchone()["n"]

    wait_for(lambda: unfinished() == 0, timeout=SETTLE_S, what="every run to end", every=0.5,
             diagnose=harness.logs)
    # A clean drain of every worker: each outbox row gets its final answer (nothing deleted before).
    for proc in workers.values():
        proc.signal(signal.SIGTERM)
    for name, proc in workers.items():
        assert proc.wait(60) == 0, harness.logs()
    # Only rows that can never have anything to say may stay unanswered: attempts of an earlier
    # process that nothing can identify (blocked: no durable handle and no provable host), whose
    # control attempt the sweeper already ended. (Since launchers are held until their handle is
    # durable, a host killed before that commit proves its attempt never started: released.)
    blocked = 0
    for n in workers:
        for r in harness.lease_rows(n):
            if r["state"] == "answered":
                continue
            local = harness.local_attempt(n, r["attempt_id"])
            (control,) = [a for a in harness.attempts(r["run_id"]) if a["id"] == r["attempt_id"]]
            assert r["state"] == "launching" and local is not None and local["status"] == "blocked", (r, local)
            assert control["status"] == "lost" and control["reason"] == "LEASE_EXPIRED", control
            blocked += 1
    # The invariants, here (teardown checks them again): one terminal event per run, no completion
    # from an old generation, no false success, exit codes as the workers recorded them.
    check_invariants(harness.dsn)
    check_workers(harness)

    outcomes: dict[str, int] = {}
    for run_id, kind in kinds.items():
        row = harness.run_row(run_id)
        outcomes[row["status"]] = outcomes.get(row["status"], 0) + 1
        assert row["status"] in KINDS[kind][3], (kind, row)
        if row["status"] == "failed":
            assert row["exit_code"] == 3
        if row["status"] == "succeeded":
            assert row["exit_code"] == 0
    answers: dict[str, int] = {}
    for name in workers:
        for r in harness.lease_rows(name):
            answers[r["answer"]] = answers.get(r["answer"], 0) + 1
    attempts = harness.sql.execute("SELECT count(*) AS n FROM ql_run_attempt").fetchone()["n"]
    audits = harness.sql.execute("SELECT count(*) AS n FROM ql_run_event WHERE type = 'attempt.completion_fenced'"
                                 ).fetchone()["n"]
    report = {"runs": RUNS, "workers": WORKERS, "slots": SLOTS, "outcomes": outcomes, "faults": faults,
              "restarts": sum(restarts.values()), "attempts": attempts, "worker_answers": answers,
              "completion_fenced_audits": audits, "blocked_without_handle": blocked, "invariant_violations": 0}
    print("soak:", json.dumps(report, sort_keys=True))
    if os.environ.get("QL_SOAK_REPORT"):
        with open(os.environ["QL_SOAK_REPORT"], "w") as fh:
            json.dump(report, fh, indent=2, sort_keys=True)
    assert sum(outcomes.values()) == RUNS
    assert faults["sigkill"] + faults["sigstop"] > 0
