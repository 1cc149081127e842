"""Durable cancellation (ADR-0007 §2.7, DESIGN.md §2): intent first, lease, verified signals.

Real tasks, real process groups, a real SQLite file shared by several processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from tests.recovery.recovery_support import (
    QL,
    alive,
    attempt_row,
    count_rows,
    dispatch_row,
    event_types,
    group_alive,
    insert_attempts,
    ql,
    ql_json,
    terminal_events,
    tamper_handle,
    update_rows,
    wait_until,
)


def _detach(env: dict[str, str], *cmd: str) -> dict:
    (line,) = ql_json(["run", "--detach", "--", *cmd], env)
    return line


def _wait_log(rt: Any, run_id: str, marker: bytes) -> None:
    log = rt.log_path(run_id)
    wait_until(lambda: log.exists() and marker in log.read_bytes(), timeout=15, message=f"{marker!r} in the log")


def test_ql_cancel_stops_a_waiting_ql_run_with_130(data_dir: Path, ql_env: dict[str, str], rt_factory,
                                                   groups: list[int]) -> None:
    host = subprocess.Popen(QL + ["--json", "run", "--", "sh", "-c", "echo ready; exec sleep 60"], env=ql_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(host.stdout.readline())  # type: ignore[union-attr]
        rt = rt_factory()
        attempt = wait_until(lambda: (a := attempt_row(rt, first["attempt_id"])).pid and a, timeout=15,
                             message="the durable handle")
        groups.append(attempt.pgid)
        _wait_log(rt, first["run_id"], b"ready")

        out = ql_json(["cancel", first["run_id"]], ql_env)
        assert out == [{"run_id": first["run_id"], "outcome": "requested"}]
        stdout, stderr = host.communicate(timeout=30)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert host.returncode == 130, stderr
    last = json.loads(stdout.splitlines()[-1])
    assert last["status"] == "cancelled" and last["reason"] == "user"
    view = rt.status(first["run_id"])
    assert view.status == "cancelled"
    types = event_types(rt, first["run_id"])
    assert types.index("run.cancel_requested") < types.index("run.cancelled")
    assert terminal_events(rt, first["run_id"]) == ["run.cancelled"]
    assert dispatch_row(rt, first["run_id"]).outcome == "signalled"
    assert not group_alive(attempt.pgid)


def test_cancel_after_terminal_is_a_no_op(data_dir: Path, ql_env: dict[str, str], rt_factory) -> None:
    done = ql_json(["run", "--", "true"], ql_env)[-1]
    rt = rt_factory()
    assert rt.status(done["run_id"]).status == "succeeded"
    before = rt.events(done["run_id"])

    out = ql_json(["cancel", done["run_id"]], ql_env)
    assert out == [{"run_id": done["run_id"], "outcome": "already_terminal"}]
    assert rt.events(done["run_id"]) == before  # no event
    assert dispatch_row(rt, done["run_id"]) is None  # nothing that could ever signal
    assert rt.status(done["run_id"]).status == "succeeded"
    missing = ql(["cancel", "01a00000-0000-7000-8000-000000000000"], ql_env, check=False)
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("tamper, expected", [
    # Not the launcher's group any more: identity mismatch → blocked, nothing sent, never retried.
    ({"pgid": 1}, "blocked"),
    # A handle that cannot be verified at all → blocked.
    ({"start_time": -5}, "blocked"),
    # Another start time under the same pid means "the launched process exited and the pid was
    # reused" (DESIGN.md §2): nothing is sent, outcome already_exited — the live process survives.
    ({"start_time": 12345}, "already_exited"),
])
def test_mismatched_identity_is_never_signalled(data_dir: Path, ql_env: dict[str, str], rt_factory,
                                                groups: list[int], tamper: dict, expected: str) -> None:
    started = _detach(ql_env, "sh", "-c", "echo ready; exec sleep 60")
    rt = rt_factory()
    attempt = attempt_row(rt, started["attempt_id"])
    groups.append(attempt.pgid)
    _wait_log(rt, started["run_id"], b"ready")
    tamper_handle(rt, attempt.id, **tamper)

    assert str(rt.cancel(started["run_id"])) == "requested"
    dispatch = dispatch_row(rt, started["run_id"])
    assert dispatch.outcome == expected and dispatch.term_sent_at_ms is None
    assert dispatch.state == ("blocked" if expected == "blocked" else "done")
    assert rt.canceller.dispatch_due(10) == {}  # blocked/done: never retried
    time.sleep(0.3)
    assert alive(attempt.pid) and group_alive(attempt.pgid)  # no signal reached the task
    assert rt.status(started["run_id"]).status == "running"
    assert "run.cancel_requested" in event_types(rt, started["run_id"])


_COUNTER = textwrap.dedent("""
    import os, signal, sys, time
    path = sys.argv[1]
    def on_term(signum, frame):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b"TERM\\n")
        os.close(fd)
    signal.signal(signal.SIGTERM, on_term)
    open(path + ".ready", "w").close()
    while True:
        time.sleep(0.05)
""")

_DISPATCHER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from ql_core.config import load_config
    from ql_core.runtime import Runtime
    data_dir, run_id, go, ready = sys.argv[1:5]
    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    # A real signal, then a pause while the lease is still held: a dispatcher that is slow
    # between its signal and its outcome commit is exactly when a second one must stay out.
    real_signal = rt.executor.signal
    def slow_signal(handle, signum):
        outcome = real_signal(handle, signum)
        time.sleep(0.5)
        return outcome
    rt.executor.signal = slow_signal
    Path(ready).touch()
    while not os.path.exists(go):
        time.sleep(0.001)
    print(json.dumps({"outcome": rt.canceller.dispatch_one(run_id)}), flush=True)
""")


def _counting_task(tmp_path: Path, ql_env: dict[str, str], rt: Any, groups: list[int]) -> tuple[dict, Any, Path]:
    """A task whose grandchild counts the TERMs its process group receives (one line per signal).

    The launcher's own child ignores TERM, so the task survives TERM and every dispatcher sees it
    running; the counter is not the launcher's direct child, so it receives exactly the group's
    signal and no forwarded copy.
    """
    counter = tmp_path / "counter.py"
    counter.write_text(_COUNTER)
    terms = tmp_path / "terms"
    started = _detach(ql_env, "sh", "-c", f'trap "" TERM; {sys.executable} {counter} {terms} & wait')
    attempt = attempt_row(rt, started["attempt_id"])
    groups.append(attempt.pgid)
    wait_until(lambda: Path(f"{terms}.ready").exists(), timeout=15, message="the counter")
    return started, attempt, terms


def _term_lines(path: Path) -> int:
    return path.read_text().count("TERM") if path.exists() else 0


def test_lease_two_dispatchers_at_once_signal_once(data_dir: Path, ql_env: dict[str, str], rt_factory,
                                                   tmp_path: Path, groups: list[int]) -> None:
    rt = rt_factory()
    started, attempt, terms = _counting_task(tmp_path, ql_env, rt, groups)
    assert str(rt.canceller.request(started["run_id"], "user")) == "requested"  # intent only, no signal
    assert _term_lines(terms) == 0

    script = tmp_path / "dispatcher.py"
    script.write_text(_DISPATCHER)
    go = tmp_path / "go"
    procs = []
    for i in range(4):
        ready = tmp_path / f"ready{i}"
        procs.append((subprocess.Popen([sys.executable, str(script), str(data_dir), started["run_id"], str(go),
                                        str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                      ready))
    wait_until(lambda: all(r.exists() for _, r in procs), timeout=60, message="the dispatchers")
    go.touch()
    outcomes = []
    for proc, _ in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outcomes.append(json.loads(out)["outcome"])

    assert outcomes.count("signalled") == 1 and outcomes.count(None) == 3, outcomes
    time.sleep(0.5)
    assert _term_lines(terms) == 1  # exactly one TERM reached the group
    dispatch = dispatch_row(rt, started["run_id"])
    assert dispatch.state == "term_sent" and dispatch.lease_owner is None
    assert alive(attempt.pid)


def test_lease_held_by_another_dispatcher_blocks_until_it_expires(data_dir: Path, ql_env: dict[str, str],
                                                                   rt_factory, tmp_path: Path,
                                                                   groups: list[int]) -> None:
    from ql_core.clock import now_ms

    rt = rt_factory(cancel_grace_s=0.3)
    started, attempt, terms = _counting_task(tmp_path, ql_env, rt, groups)
    rt.canceller.request(started["run_id"], "user")
    now = now_ms()  # the edge-sqlite store's clock
    update_rows(rt, "ql_cancel_dispatch", started["run_id"],
                {"lease_owner": "someone-else", "lease_expires_at_ms": now + 60_000})
    assert rt.canceller.dispatch_one(started["run_id"]) is None
    assert rt.canceller.dispatch_due(10) == {}
    time.sleep(0.3)
    assert _term_lines(terms) == 0

    # The lease expires by the database clock; then exactly one dispatcher may act.
    update_rows(rt, "ql_cancel_dispatch", started["run_id"], {"lease_expires_at_ms": now - 1})
    assert rt.canceller.dispatch_one(started["run_id"]) == "signalled"
    assert rt.canceller.dispatch_one(started["run_id"]) is None  # KILL is not due before the grace
    wait_until(lambda: _term_lines(terms) == 1, timeout=5, message="the TERM")

    # The dispatcher that held the lease comes back with its stale version: it cannot write.
    from ql_core.ports.journal import DispatchClaim

    record = rt.journal.dispatch(started["run_id"])
    stale = DispatchClaim(record=record._replace(version=record.version - 1), owner=rt.node_id, now_ms=now)
    assert rt.canceller._finish(stale, state="done", outcome="forged") is False
    assert dispatch_row(rt, started["run_id"]).state == "term_sent"

    # After the grace: KILL ends the whole group; no receipt, the committed intent decides.
    wait_until(lambda: rt.canceller.dispatch_one(started["run_id"]) == "killed", timeout=5,
               message="the KILL to be due")
    wait_until(lambda: not group_alive(attempt.pgid), timeout=10, message="the group to die")
    view = wait_until(lambda: (rt.reconcile(), rt.status(started["run_id"]))[1].terminal
                      and rt.status(started["run_id"]), timeout=10, message="the run to end")
    assert view.status == "cancelled" and view.reason == "user" and view.exit_code is None
    assert terminal_events(rt, started["run_id"]) == ["run.cancelled"]


def test_cancel_before_the_handle_is_retried_not_blocked(rt_factory) -> None:
    rt = rt_factory()
    fresh = insert_attempts(rt, 1, handle=None, status="starting")
    assert str(rt.canceller.request(fresh.run_ids[0], "user")) == "requested"
    assert rt.canceller.dispatch_one(fresh.run_ids[0]) == "retry"
    record = dispatch_row(rt, fresh.run_ids[0])
    assert record.state == "pending" and record.tries == 1 and record.next_attempt_at_ms > record.updated_at_ms

    # Past the spawn grace nothing can ever verify it: blocked, no retry.
    old = insert_attempts(rt, 1, handle=None, status="starting", created_at_ms=int(time.time() * 1000) - 60_000)
    rt.canceller.request(old.run_ids[0], "user")
    assert rt.canceller.dispatch_one(old.run_ids[0]) == "blocked"


def test_dispatch_due_selects_only_this_nodes_attempts(rt_factory) -> None:
    """On a shared database, other nodes' due records must not fill our page (no starvation)."""
    from tests.recovery.recovery_support import dead_handle

    rt = rt_factory()
    foreign = insert_attempts(rt, 5, handle=dead_handle(), owner="01a00000-0000-7000-8000-0000000000ff")
    for run_id in foreign.run_ids:
        rt.canceller.request(run_id, "user")
    time.sleep(0.01)
    ours = insert_attempts(rt, 1, handle=dead_handle())
    rt.canceller.request(ours.run_ids[0], "user")
    assert rt.canceller.dispatch_due(1) == {"already_exited": 1}
    assert dispatch_row(rt, ours.run_ids[0]).state == "done"
    assert count_rows(rt, "ql_cancel_dispatch", "state = 'pending'") == 5
    assert all(dispatch_row(rt, r).version == 1 for r in foreign.run_ids)  # never even claimed


def test_kill_after_grace_for_user_cancel_of_term_ignoring_task(data_dir: Path, ql_env: dict[str, str],
                                                                rt_factory, groups: list[int]) -> None:
    started = _detach(ql_env, "sh", "-c", 'trap "" TERM; echo ready; sleep 60')
    rt = rt_factory(cancel_grace_s=0.3)
    attempt = attempt_row(rt, started["attempt_id"])
    groups.append(attempt.pgid)
    _wait_log(rt, started["run_id"], b"ready")
    assert str(rt.cancel(started["run_id"])) == "requested"
    assert dispatch_row(rt, started["run_id"]).outcome == "signalled"
    time.sleep(0.1)
    assert alive(attempt.pid)
    view = wait_until(lambda: (rt.reconcile(), rt.status(started["run_id"]))[1].terminal
                      and rt.status(started["run_id"]), timeout=15, interval=0.1, message="the run to end")
    assert view.status == "cancelled" and view.exit_code is None
    assert dispatch_row(rt, started["run_id"]).outcome == "killed"
    assert not group_alive(attempt.pgid)
    assert os.path.exists(rt.log_path(started["run_id"]))
    _ = signal  # (imported for readers: every signal in this module is sent by the dispatcher)
