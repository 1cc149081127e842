"""A Nomad-style crash loop: hosts SIGKILLed at random moments, tasks killed at random, a supervisor racing.

Repeatedly start a host process that submits tasks of random short durations and random exit
codes and waits for them; SIGKILL the host at a random moment (sometimes before it submitted
anything, sometimes mid-submit, mid-wait or never); now and then SIGKILL a running task's whole
process group (so it can leave no receipt). A supervisor reconciles concurrently the whole time.
Then reconcile until every run has ended and check the protocol's invariants for every run:

- exactly one ``run.<terminal>`` event and one ``attempt.<terminal>`` event;
- a run whose task was not killed ends with its true exit code (``succeeded``/``failed``), taken
  from its receipt — or, only if its host died before it was ever spawned, ``lost``
  (``RECOVERY_NEVER_STARTED``);
- a killed task ends ``lost`` — unless its receipt was already published, then its true code;
- nothing ever ``succeeded`` whose code was not 0; no receipt ever lost a race to ``lost``
  (no ``attempt.late_callback_ignored``); no receipt file is left behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from recovery_support import kill_group, wait_until

from ql_core.reconciler import Reconciler
from ql_core.supervisor import Supervisor

ITERATIONS = 15
TASKS_PER_HOST = 6
#: Kill task groups while hosts are alive too: a waiting host that reaps a killed launcher must
#: leave the verdict to recovery (lost), never record 128+9 as the command's exit.
KILL_WHILE_HOST_ALIVE = True
HOST = Path(__file__).with_name("recovery_host.py")


def _runs(rt: Any) -> list[Any]:
    from recovery_support import attempt_row

    from tests import dbview

    return [(run, attempt_row(rt, run.current_attempt_id)) for run in dbview.rows(rt, "SELECT * FROM ql_run")]


def _running_groups(rt: Any) -> list[tuple[str, int]]:
    return [(a.id, a.pgid) for _, a in _runs(rt) if a.status == "running" and a.pgid]


@pytest.mark.slow
def test_hosts_and_tasks_killed_at_random_every_run_ends_true(rt_factory, data_dir: Path) -> None:
    seed = int(os.environ.get("QL_CRASH_LOOP_SEED", time.time_ns() % 1_000_000))
    print(f"crash loop seed {seed}")  # shown on failure: rerun with QL_CRASH_LOOP_SEED
    rng = random.Random(seed)
    rt = rt_factory(cancel_grace_s=0.5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    killed_tasks: set[str] = set()
    pgids: list[int] = []
    supervisor = Supervisor(rt, interval_s=0.1)

    def kill_random_task() -> None:
        groups = _running_groups(rt)
        pgids.extend(g for _, g in groups)
        if groups:
            attempt_id, pgid = rng.choice(groups)
            kill_group(pgid)  # the launcher dies with its task: no receipt can follow
            killed_tasks.add(attempt_id)

    supervisor.start()
    loop_started = time.monotonic()
    try:
        for i in range(ITERATIONS):
            host = subprocess.Popen([sys.executable, str(HOST), str(data_dir), str(rng.randrange(1 << 30)),
                                     str(TASKS_PER_HOST)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            # Random moments: before the runtime opened, mid-submit, mid-wait, or after it finished.
            host_dies = rng.uniform(0.2, 1.6)
            task_dies = rng.uniform(0.1, host_dies) if rng.random() < 0.7 else None
            born = time.monotonic()
            if task_dies is not None:
                time.sleep(task_dies)
                if KILL_WHILE_HOST_ALIVE:
                    kill_random_task()
            time.sleep(max(0.0, host_dies - (time.monotonic() - born)))
            host.send_signal(signal.SIGKILL)
            _, err = host.communicate(timeout=30)
            assert host.returncode in (0, -signal.SIGKILL), err.decode(errors="replace")
            if rng.random() < (0.3 if KILL_WHILE_HOST_ALIVE else 0.7):
                kill_random_task()  # with no host alive
        assert time.monotonic() - loop_started < 90
    finally:
        assert supervisor.stop(drain_s=10)

    # Every host is dead, so no handle is still on its way: decide handle-less attempts now.
    rec = Reconciler(rt)
    rec.spawn_grace_ms = 1_000

    def settled() -> bool:
        rec.full_pass()
        return all(run.status in ("succeeded", "failed", "cancelled", "timed_out", "lost") for run, _ in _runs(rt))

    try:
        wait_until(settled, timeout=60, interval=0.3, message="every run to end")
    finally:
        for pgid in pgids:
            kill_group(pgid)

    runs = _runs(rt)
    assert runs, "no host got as far as a create commit"
    outcomes: dict[str, int] = {}
    for run, attempt in runs:
        expected = int(run.name.split("=", 1)[1])
        events = [e.type for e in rt.events(run.id)]
        where = f"run {run.id} (code {expected}, {run.status}, {run.reason}, killed={attempt.id in killed_tasks})"
        assert sum(1 for t in events if t.startswith("run.") and t[4:] in (
            "succeeded", "failed", "cancelled", "timed_out", "lost")) == 1, where
        assert sum(1 for t in events if t == f"attempt.{attempt.status}") == 1, where
        assert attempt.status == run.status, where
        assert "attempt.late_callback_ignored" not in events, where
        assert not rt.receipts.exists(attempt.id), where
        if run.status == "succeeded":
            assert expected == 0 and run.exit_code == 0, where
        if run.status in ("succeeded", "failed"):
            assert run.exit_code == expected, where
        elif attempt.id in killed_tasks:
            assert run.status == "lost" and run.reason == "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT", where
        else:
            # Not killed, no receipt: only a host that died between the create commit and the spawn.
            assert (run.status, run.reason, attempt.pid) == ("lost", "RECOVERY_NEVER_STARTED", None), where
        key = f"{run.status}{'(killed)' if attempt.id in killed_tasks else ''}"
        outcomes[key] = outcomes.get(key, 0) + 1
    print(f"{len(runs)} runs: {outcomes}")
    assert outcomes.get("succeeded", 0) + outcomes.get("failed", 0) > 0
