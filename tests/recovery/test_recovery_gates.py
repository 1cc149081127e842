"""ADR-0007 §6 gates 5 and 6 with real tasks, the real `ql` command and no host alive.

Gate 5: a process that exited without a receipt ends ``lost`` — never ``succeeded``, whatever its
log says. Gate 6: a persisted deadline that passes while no host is alive is enforced by
`ql reconcile`: the timeout intent is committed first, then TERM (then KILL after the grace).

(The launcher enforces the deadline itself too — docs/launcher.md, "Protections";
tests/truth/test_launcher_enforced.py. Gate 6 is about recovery, so its tasks run with their
launcher SIGKILLed on its own: the command runs on in the launcher's group and recovery is the only
enforcer left.)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from tests.recovery.recovery_support import (
    alive,
    attempt_row,
    dispatch_row,
    event_types,
    group_alive,
    open_runtime,
    ql,
    ql_json,
    terminal_events,
    wait_until,
    write_config,
)


def _detach(env: dict[str, str], *cmd: str, timeout: float | None = None, config: Path | None = None) -> dict:
    args = ["run", "--detach"] + (["--timeout", str(timeout)] if timeout is not None else []) + ["--", *cmd]
    (line,) = ql_json(args, env, config=config)
    return line


def _reconcile(env: dict[str, str], config: Path | None = None) -> dict:
    (line,) = ql_json(["reconcile"], env, config=config)
    return line


def test_gate5_exit_without_receipt_is_lost_never_success(data_dir: Path, ql_env: dict[str, str],
                                                          groups: list[int]) -> None:
    started = _detach(ql_env, "sh", "-c", 'echo "exit 0"; echo success; exec sleep 60')
    rt = open_runtime(data_dir)
    try:
        attempt = attempt_row(rt, started["attempt_id"])
        assert attempt.pgid == attempt.pid  # the launcher leads its own group
        groups.append(attempt.pgid)
        log = rt.log_path(started["run_id"])
        wait_until(lambda: b"success" in log.read_bytes(), timeout=10, message="the task's log line")

        # The launcher and its task die together; nothing is left to publish a receipt.
        os.killpg(attempt.pgid, signal.SIGKILL)
        wait_until(lambda: not group_alive(attempt.pgid), timeout=10, message="the group to die")

        counts = _reconcile(ql_env)
        assert counts["lost"] == 1 and counts["applied"] == 0
        view = rt.status(started["run_id"])
        assert view.status == "lost"
        assert view.reason == "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
        assert view.exit_code is None
        assert view.attempts[0].status == "lost"
        assert terminal_events(rt, started["run_id"]) == ["run.lost"]
        assert "run.succeeded" not in event_types(rt, started["run_id"])
        # The log is evidence only, and it is kept.
        assert b"exit 0\nsuccess\n" in log.read_bytes()

        # A second pass changes nothing: exactly one terminal event.
        again = _reconcile(ql_env)
        assert again["lost"] == 0 and again["applied"] == 0
        assert terminal_events(rt, started["run_id"]) == ["run.lost"]
    finally:
        rt.close()


def test_gate5_receipt_beats_identity(data_dir: Path, ql_env: dict[str, str]) -> None:
    """The contrast: the same kind of task finishing normally leaves a receipt, which is its truth."""
    started = _detach(ql_env, "sh", "-c", "echo success; exit 3")
    rt = open_runtime(data_dir)
    try:
        attempt = attempt_row(rt, started["attempt_id"])
        wait_until(lambda: not alive(attempt.pid), timeout=10, message="the task to end")
        counts = _reconcile(ql_env)
        assert counts["applied"] == 1 and counts["lost"] == 0
        view = rt.status(started["run_id"])
        assert (view.status, view.exit_code) == ("failed", 3)
    finally:
        rt.close()


def _assert_timeout_order(rt, run_id: str) -> None:  # type: ignore[no-untyped-def]
    events = rt.events(run_id)
    types = [e.type for e in events]
    assert types[:3] == ["run.created", "attempt.spawned", "run.cancel_requested"]
    assert events[2].reason == "timeout"
    assert terminal_events(rt, run_id) == ["run.timed_out"]
    assert types.index("run.cancel_requested") < types.index("attempt.timed_out") < types.index("run.timed_out")


def test_gate6_deadline_with_no_host_times_out_by_term(data_dir: Path, ql_env: dict[str, str],
                                                       groups: list[int]) -> None:
    rt = open_runtime(data_dir)
    try:
        started, attempt = _detach_and_kill_launcher_alone(rt, ql_env, groups, "sleep", "60")
        assert attempt.deadline_at_ms is not None  # persisted before spawn
        wait_until(lambda: time.time() * 1000 > attempt.deadline_at_ms + 50, timeout=10, message="the deadline")
        # No host is alive (`ql run --detach` returned); the task still runs past its deadline.
        assert group_alive(attempt.pgid)
        assert rt.status(started["run_id"]).status == "running"

        passes = 0

        def timed_out() -> bool:
            nonlocal passes
            passes += 1
            _reconcile(ql_env)
            return rt.status(started["run_id"]).terminal

        wait_until(timed_out, timeout=20, interval=0.1, message="the run to end")
        assert passes <= 3

        view = rt.status(started["run_id"])
        assert view.status == "timed_out" and view.reason == "timeout"
        assert view.exit_code is None  # no launcher, no receipt: the committed intent ql signalled decides
        _assert_timeout_order(rt, started["run_id"])
        # Persist first, signal after: TERM went out after the intent's commit, to a process that
        # identity re-verified as running at that moment — so it was alive when the intent committed.
        dispatch = dispatch_row(rt, started["run_id"])
        assert dispatch.reason == "timeout" and dispatch.outcome == "signalled"
        with_intent = rt.status(started["run_id"])
        assert dispatch.term_sent_at_ms >= _cancel_requested_at(rt, started["run_id"])
        assert with_intent.finished_at_ms >= dispatch.term_sent_at_ms
        assert not group_alive(attempt.pgid)
    finally:
        rt.close()


#: Deadlines tried in turn. The launcher enforces the deadline itself, so the test must kill it
#: before the deadline; on a loaded machine `ql run --detach` and the reads after it can take
#: longer than the first one.
_DEADLINES_S = (1, 3, 9)
#: The least time left before the deadline at which the launcher is still killed.
_KILL_MARGIN_MS = 300


def _detach_and_kill_launcher_alone(rt, env: dict[str, str], groups: list[int], *cmd: str,  # type: ignore[no-untyped-def]
                                    config: Path | None = None, ready: bytes | None = None):
    """Start ``cmd`` with a deadline, wait for ``ready`` in its log, then SIGKILL its launcher, not
    its group: the command runs on, and nothing but recovery enforces its deadline any more
    (docs/launcher.md, "A launcher killed on its own").

    When the deadline is too near by then, the launcher could enforce it first; that task is
    killed, settled by a reconcile and tried again with a longer deadline."""
    for timeout in _DEADLINES_S:
        started = _detach(env, *cmd, timeout=timeout, config=config)
        attempt = attempt_row(rt, started["attempt_id"])
        groups.append(attempt.pgid)
        if ready is not None:
            log = rt.log_path(started["run_id"])
            wait_until(lambda: ready in log.read_bytes(), timeout=10, message="the task to be ready")
        if time.time() * 1000 < attempt.deadline_at_ms - _KILL_MARGIN_MS:
            os.kill(attempt.pid, signal.SIGKILL)
            wait_until(lambda: not alive(attempt.pid), timeout=10, message="the launcher to die")
            assert group_alive(attempt.pgid)
            return started, attempt
        os.killpg(attempt.pgid, signal.SIGKILL)
        wait_until(lambda: not group_alive(attempt.pgid), timeout=10, message="the late try to die")
        _reconcile(env, config)
        assert rt.status(started["run_id"]).terminal
    raise AssertionError(f"the launcher could not be killed before any of the deadlines {_DEADLINES_S}")


def _cancel_requested_at(rt, run_id: str) -> int:  # type: ignore[no-untyped-def]
    run = rt.journal.run(run_id)
    assert run is not None and run.cancel_requested_at_ms is not None
    return run.cancel_requested_at_ms


def test_gate6_task_ignoring_term_is_killed_after_grace(data_dir: Path, ql_env: dict[str, str],
                                                        tmp_path: Path, groups: list[int]) -> None:
    config = write_config(tmp_path / "ql.toml", cancel_grace_s=0.5)
    rt = open_runtime(data_dir, cancel_grace_s=0.5)
    try:
        started, attempt = _detach_and_kill_launcher_alone(rt, ql_env, groups, "sh", "-c",
                                                           'trap "" TERM; echo ready; sleep 60',
                                                           config=config, ready=b"ready")
        wait_until(lambda: time.time() * 1000 > attempt.deadline_at_ms + 50, timeout=10, message="the deadline")

        first = _reconcile(ql_env, config)
        assert first["timeouts_requested"] == 1 and first["dispatch_signalled"] == 1
        time.sleep(0.2)
        assert group_alive(attempt.pgid)  # TERM was ignored
        assert rt.status(started["run_id"]).status == "running"

        wait_until(lambda: (_reconcile(ql_env, config), rt.status(started["run_id"]).terminal)[1],
                   timeout=20, interval=0.2, message="KILL after the grace")
        view = rt.status(started["run_id"])
        assert view.status == "timed_out" and view.reason == "timeout"
        assert view.exit_code is None  # KILL leaves no receipt; the committed intent decides
        _assert_timeout_order(rt, started["run_id"])
        dispatch = dispatch_row(rt, started["run_id"])
        assert dispatch.outcome == "killed" and dispatch.state == "done"
        assert dispatch.kill_sent_at_ms - dispatch.term_sent_at_ms >= 500
        assert not group_alive(attempt.pgid)
    finally:
        rt.close()


@pytest.mark.parametrize("grace", [0.3])
def test_gate6_supervise_enforces_deadline(data_dir: Path, ql_env: dict[str, str], tmp_path: Path,
                                           groups: list[int], grace: float) -> None:
    """The same flow driven by `ql supervise` (the periodic loop), stopped by SIGTERM with a bounded drain."""
    import subprocess

    from tests.recovery.recovery_support import QL

    config = write_config(tmp_path / "ql.toml", cancel_grace_s=grace)
    started = _detach(ql_env, "sleep", "60", timeout=1, config=config)
    rt = open_runtime(data_dir)
    supervise = subprocess.Popen(QL + ["--config", str(config), "--json", "supervise", "--interval", "0.2"],
                                 env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        attempt = attempt_row(rt, started["attempt_id"])
        groups.append(attempt.pgid)
        view = wait_until(lambda: (v := rt.status(started["run_id"])).terminal and v, timeout=20,
                          message="the supervisor to time the run out")
        assert view.status == "timed_out"
        _assert_timeout_order(rt, started["run_id"])
    finally:
        supervise.send_signal(signal.SIGTERM)
        out, err = supervise.communicate(timeout=30)
        rt.close()
    assert supervise.returncode == 0, err
    assert '"type":"stopped","drained":true' in out


def test_reconcile_cli_reports_incomplete_pass(data_dir: Path, ql_env: dict[str, str], tmp_path: Path,
                                               sleeper_handle: dict) -> None:
    from tests.recovery.recovery_support import insert_attempts

    rt = open_runtime(data_dir)
    try:
        insert_attempts(rt, 10, handle=sleeper_handle)
    finally:
        rt.close()
    config = write_config(tmp_path / "ql.toml", page_size=2, pages_per_round=1)
    (line,) = ql_json(["reconcile", "--max-rounds", "2"], ql_env, config=config)
    assert line["complete"] is False and line["rounds"] == 2 and line["attempts_checked"] == 4
    (line,) = ql_json(["reconcile"], ql_env, config=config)
    assert line["complete"] is True and line["still_running"] == 10 and line["rounds"] == 6
    assert ql(["reconcile", "--max-rounds", "0"], ql_env, check=False).returncode == 2


def test_gate5_with_a_waiting_host_a_killed_task_is_lost_not_failed(data_dir: Path, ql_env: dict[str, str],
                                                                     groups: list[int]) -> None:
    import json
    import subprocess

    from tests.recovery.recovery_support import QL

    host = subprocess.Popen(QL + ["--json", "run", "--", "sh", "-c", "echo success; exec sleep 60"], env=ql_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rt = open_runtime(data_dir)
    try:
        first = json.loads(host.stdout.readline())  # type: ignore[union-attr]
        attempt = wait_until(lambda: (a := attempt_row(rt, first["attempt_id"])).pid and a, timeout=15,
                             message="the durable handle")
        groups.append(attempt.pgid)
        wait_until(lambda: b"success" in rt.log_path(first["run_id"]).read_bytes(), timeout=10, message="output")
        os.killpg(attempt.pgid, signal.SIGKILL)  # launcher and task together: no receipt can exist
        host.communicate(timeout=30)
        _reconcile(ql_env)
        view = rt.status(first["run_id"])
        assert terminal_events(rt, first["run_id"]) == [f"run.{view.status}"]
        assert view.status != "succeeded"
        assert (view.status, view.exit_code) == ("lost", None)
        assert host.returncode == 75
    finally:
        if host.poll() is None:
            host.kill()
            host.communicate()
        rt.close()
