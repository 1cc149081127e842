"""The adversarial kill loop: hosts, launchers, process groups, reconcilers and supervisors SIGKILLed at
random while mixed runs (exit codes, deadlines, cancels) go on — then every run must end true.

Bounded (about two minutes unloaded; ``QL_KILL_LOOP_HOSTS`` to change) and ``slow``-marked. The seed is
printed; rerun one with ``QL_KILL_LOOP_SEED``. Every run is judged against what it was asked to do
(recorded in its name in the create commit) and what was done to it:

- exactly one ``run.<terminal>`` event (and one ``attempt.<terminal>``);
- never a false success: ``succeeded`` only for exit code 0, and never for a run whose task was
  killed before its receipt existed;
- a recorded exit code is always the task's true one;
- ``timed_out`` only with a deadline, and a run whose deadline is far below its duration never
  ends with its own outcome unless it was killed or lost; ``cancelled`` only if a cancel was asked;
- ``lost`` only with a recovery reason (never started, or exited without a receipt), and no true
  receipt ever loses the race to another verdict (``attempt.late_callback_ignored``);
- no receipt file is left behind.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests import dbview
from tests.conftest import QL, await_open

HOST = Path(__file__).with_name("kill_host.py")
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")


def _rows(rt: Any) -> list[tuple[Any, Any]]:
    out = []
    for run in dbview.rows(rt, "SELECT * FROM ql_run"):
        attempt = dbview.row(rt, "ql_run_attempt", run.current_attempt_id)
        out.append((run, attempt))
    return out


def _wait_dead(pid: int) -> None:
    """Until ``pid`` is gone or a zombie (bounded): a SIGKILLed process runs no more code then."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            raw = Path(f"/proc/{pid}/stat").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return
        if raw[raw.rfind(b")") + 2:].split()[0] in (b"Z", b"X"):
            return
        time.sleep(0.005)


def _state_and_status(pid: int) -> tuple[bytes, int | None] | None:
    """The process state letter and, for a zombie, its wait status (/proc/PID/stat field 52)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    state = fields[0]
    return state, (int(fields[49]) if state == b"Z" and len(fields) > 49 else None)


def _receipt(data_dir: Path, attempt_id: str) -> Path:
    return data_dir / "receipts" / attempt_id[-2:] / f"{attempt_id}.json"


@pytest.mark.slow
def test_random_sigkills_of_every_process_never_break_an_invariant(open_rt, data_dir: Path) -> None:
    seed = int(os.environ.get("QL_KILL_LOOP_SEED", time.time_ns() % 1_000_000))
    print(f"kill loop seed {seed}")
    rng = random.Random(seed)
    hosts = int(os.environ.get("QL_KILL_LOOP_HOSTS", "40"))
    per_host = 6
    rt = open_rt(cancel_grace_s=0.3, publish_grace_ms=20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_DATA_DIR"] = str(data_dir)
    killed: dict[str, str] = {}          # attempt id -> what was killed
    published_before_kill: set[str] = set()
    cancelled: set[str] = set()
    injected: Counter[str] = Counter()
    background: list[subprocess.Popen[bytes]] = []

    def running() -> list[dict]:
        rows = []
        for run, attempt in _rows(rt):
            if attempt is not None and attempt.status == "running" and attempt.handle:
                rows.append({"run": run.id, "attempt": attempt.id, "pid": json.loads(attempt.handle)["pid"]})
        return rows

    def kill_something() -> None:
        choice = rng.choice(["group", "launcher", "cancel", "reconciler", "supervisor", "nothing"])
        targets = running()
        if choice in ("group", "launcher", "cancel") and targets:
            t = rng.choice(targets)
            before = _state_and_status(t["pid"])
            if choice != "cancel" and (before is None or before[0] in (b"Z", b"X")):
                return  # the launcher already ended on its own: a kill now would hit nothing
            try:
                if choice == "group":
                    os.killpg(t["pid"], signal.SIGKILL)
                elif choice == "launcher":
                    os.kill(t["pid"], signal.SIGKILL)
                else:
                    subprocess.run(QL + ["cancel", t["run"]], env=env, capture_output=True, timeout=60)
                    cancelled.add(t["run"])
            except ProcessLookupError:
                return
            if choice != "cancel":
                killed[t["attempt"]] = choice
                # Once the launcher is really dead it can publish nothing more: a receipt there now
                # was published before the kill (a true verdict, not a false success).
                _wait_dead(t["pid"])
                if _receipt(data_dir, t["attempt"]).exists():
                    published_before_kill.add(t["attempt"])
                after = _state_and_status(t["pid"])
                if after is not None and after[1] is not None and after[1] & 0x7F == 0:
                    # It exited with a status of its own (not our signal) in the microseconds
                    # between the look and the kill: its status is the kernel's, a true verdict.
                    published_before_kill.add(t["attempt"])
            injected[choice] += 1
        elif choice in ("reconciler", "supervisor"):
            args = ["reconcile"] if choice == "reconciler" else ["--profile", "standalone", "supervise"]
            proc = subprocess.Popen(QL + args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            background.append(proc)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            injected[choice] += 1

    for _ in range(hosts):
        host = subprocess.Popen([sys.executable, str(HOST), str(data_dir), str(rng.randrange(1 << 30)),
                                 str(per_host)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Its death is timed from the moment its runtime is open: a Python start takes seconds on a
        # loaded machine, and timed from the spawn nearly every host died before its first submit.
        # Now and then one dies before (most likely) opening, on purpose.
        if rng.random() < 0.15:
            dies_at = time.monotonic() + rng.uniform(0.0, 0.3)
        else:
            await_open(host, "a kill-loop host")
            dies_at = time.monotonic() + rng.uniform(0.1, 1.5)
        while time.monotonic() < dies_at:
            kill_something()
            time.sleep(rng.uniform(0.0, 0.15))
        host.send_signal(signal.SIGKILL)
        _out, err = host.communicate(timeout=60)
        injected["host"] += 1
        assert host.returncode in (0, -signal.SIGKILL), err.decode(errors="replace")

    # Every host is dead: recover until every run has ended (orphaned commands end on their own).
    deadline = time.monotonic() + 120
    while True:
        rt.reconcile()
        rows = _rows(rt)
        if all(run.status in TERMINAL for run, _ in rows):
            break
        assert time.monotonic() < deadline, [(r.id, r.status) for r, _ in rows if r.status not in TERMINAL]
        time.sleep(0.2)

    outcomes: Counter[str] = Counter()
    violations: list[str] = []
    for run, attempt in rows:
        asked = dict(part.split("=") for part in run.name.split())
        code, duration, timeout = int(asked["code"]), float(asked["dur"]), float(asked["timeout"])
        events = [e.type for e in rt.events(run.id)]
        where = f"run {run.id} {run.name} -> {run.status}/{run.exit_code}/{run.reason} killed={killed.get(attempt.id)}"
        outcomes[run.status] += 1
        if sum(1 for t in events if t.startswith("run.") and t[4:] in TERMINAL) != 1:
            violations.append(f"not exactly one terminal event: {where}")
        if run.status == "succeeded" and (code != 0 or (attempt.id in killed
                                                        and attempt.id not in published_before_kill)):
            violations.append(f"false success: {where}")
        if run.exit_code is not None and run.exit_code != code and not (
                run.status in ("cancelled", "timed_out") and run.exit_code >= 128):
            violations.append(f"wrong exit code: {where}")
        if run.status == "timed_out" and timeout == 0:
            violations.append(f"timed out without a deadline: {where}")
        if run.status == "cancelled" and run.id not in cancelled:
            violations.append(f"cancelled without a cancel: {where}")
        if run.status in ("succeeded", "failed") and timeout and timeout < duration:
            violations.append(f"outlived its deadline yet kept its own outcome: {where}")
        if run.status == "lost" and run.reason not in ("RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT",
                                                       "RECOVERY_NEVER_STARTED"):
            violations.append(f"lost for an unexpected reason: {where}")
        if "attempt.late_callback_ignored" in events:
            violations.append(f"a true receipt lost the race to another verdict: {where}")
        if _receipt(data_dir, attempt.id).exists():
            violations.append(f"receipt left behind: {where}")
    print(f"kill loop: {len(rows)} runs {dict(outcomes)}; injected {dict(injected)}; "
          f"violations {len(violations)}")
    assert len(rows) >= 150 or hosts < 40, f"only {len(rows)} runs were created"
    assert violations == [], "\n".join(violations[:20])
