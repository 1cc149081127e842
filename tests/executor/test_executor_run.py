"""LocalProcess through the real `ql` command and Runtime: gates 1, 12, 14 and the CLI contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ql_core.testing.executor import wait_until
from tests.conftest import QL, classic_env, json_lines, run_ql


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    return wait_until(predicate, "the condition", timeout, interval=interval)


def receipt_path(data_dir: Path, attempt_id: str) -> Path:
    return data_dir / "receipts" / attempt_id[-2:] / f"{attempt_id}.json"


def log_file(data_dir: Path) -> Path:
    logs = list((data_dir / "logs").glob("*/*.log"))
    assert len(logs) == 1, logs
    return logs[0]


def test_run_exits_with_the_task_exit_code_and_streams_its_log(ql_env) -> None:
    out = run_ql(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"], ql_env)
    assert out.returncode == 7
    assert out.stdout == "out\nerr\n"
    assert out.stderr == ""


def test_run_json_and_the_query_commands(ql_env, data_dir: Path) -> None:
    out = run_ql(["run", "--json", "--name", "nightly", "--", "sh", "-c", "echo hi"], ql_env)
    assert out.returncode == 0, out.stderr
    first, last = json_lines(out.stdout)
    run_id = first["run_id"]
    assert last == {"run_id": run_id, "attempt_id": first["attempt_id"], "status": "succeeded",
                    "exit_code": 0, "reason": None}
    status = json_lines(run_ql(["status", run_id, "--json"], ql_env).stdout)[0]
    assert status["status"] == "succeeded" and status["exit_code"] == 0 and status["name"] == "nightly"
    assert [a["status"] for a in status["attempts"]] == ["succeeded"]
    events = json_lines(run_ql(["events", run_id, "--json"], ql_env).stdout)  # one event per line
    assert [e["type"] for e in events] == ["run.created", "attempt.spawned", "attempt.succeeded", "run.succeeded"]
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    listed = json_lines(run_ql(["list", "--json", "--status", "succeeded"], ql_env).stdout)
    assert [r["run_id"] for r in listed] == [run_id]
    assert run_ql(["logs", run_id], ql_env).stdout == "hi\n"
    assert run_ql(["logs", run_id, "--offset", "1"], ql_env).stdout == "i\n"
    # The receipt was consumed and the journal row resolved; the log stays.
    assert list((data_dir / "receipts").glob("*/*.json")) == []
    assert log_file(data_dir).read_bytes() == b"hi\n"


def test_detach_prints_ids_and_the_task_completes_without_a_host(ql_env, data_dir: Path) -> None:
    out = run_ql(["run", "--detach", "--json", "--", "sh", "-c", "sleep 0.2; exit 5"], ql_env)
    rec = json_lines(out.stdout)[0]
    assert set(rec) >= {"run_id", "attempt_id"}
    wait_for(lambda: receipt_path(data_dir, rec["attempt_id"]).exists())
    counts = json_lines(run_ql(["reconcile", "--json"], ql_env).stdout)[0]
    assert counts["applied"] == 1
    status = json_lines(run_ql(["status", rec["run_id"], "--json"], ql_env).stdout)[0]
    assert (status["status"], status["exit_code"]) == ("failed", 5)


def test_unknown_run_is_a_one_line_error(ql_env) -> None:
    out = run_ql(["status", "01900000-0000-7000-8000-000000000000"], ql_env)
    assert out.returncode == 1 and out.stderr.startswith("ql: error: run ") and "Traceback" not in out.stderr
    out = run_ql(["run"], ql_env)
    assert out.returncode == 2 and "nothing to run" in out.stderr


def test_gate1_sigkill_of_ql_run_leaves_the_task_running(ql_env, data_dir: Path) -> None:
    """Gate 1: the host dies; the task keeps appending to the same log and publishes its receipt."""
    script = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.25; done; exit 9"
    host = subprocess.Popen(QL + ["run", "--", "sh", "-c", script], env=ql_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = wait_for(lambda: next(iter((data_dir / "logs").glob("*/*.log")), None))
    wait_for(lambda: b"tick 2" in log.read_bytes())
    inode = log.stat().st_ino
    host.kill()
    host.wait()
    size_at_kill = log.stat().st_size
    wait_for(lambda: b"tick 8" in log.read_bytes())
    assert log.stat().st_ino == inode and log.stat().st_size > size_at_kill
    receipt = wait_for(lambda: next(iter((data_dir / "receipts").glob("*/*.json")), None))
    assert json.loads(receipt.read_bytes())["exitCode"] == 9
    counts = json_lines(run_ql(["reconcile", "--json"], ql_env).stdout)[0]
    assert counts["applied"] == 1
    run_id = json_lines(run_ql(["list", "--json"], ql_env).stdout)[0]["run_id"]
    status = json_lines(run_ql(["status", run_id, "--json"], ql_env).stdout)[0]
    assert (status["status"], status["exit_code"]) == ("failed", 9)
    assert log.read_bytes().count(b"tick") == 8


def test_ctrl_c_cancels_the_run(ql_env, data_dir: Path) -> None:
    host = subprocess.Popen(QL + ["run", "--", "sh", "-c", "echo started; sleep 30"], env=ql_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(p.read_bytes() for p in (data_dir / "logs").glob("*/*.log")))
    host.send_signal(signal.SIGINT)
    stdout, stderr = host.communicate(timeout=30)
    assert host.returncode == 130, stderr
    assert "cancelling run" in stderr and "ended cancelled" in stderr
    run_id = json_lines(run_ql(["list", "--json"], ql_env).stdout)[0]["run_id"]
    types = [e["type"] for e in json_lines(run_ql(["events", run_id, "--json"], ql_env).stdout)]
    assert types.index("run.cancel_requested") < types.index("run.cancelled")


def test_timeout_exits_124(ql_env) -> None:
    out = run_ql(["run", "--timeout", "0.5", "--", "sleep", "20"], ql_env)
    assert out.returncode == 124, out.stderr
    assert "timed_out" in out.stderr


def test_token_never_reaches_the_task_its_parent_or_the_log(runtime) -> None:
    """Gate 12: the token is in no process's argv or environment, and not in the log."""
    script = ('env; echo ---; tr "\\0" "\\n" < /proc/$PPID/environ; echo ---; '
              'tr "\\0" " " < /proc/$PPID/cmdline; echo; echo FDS; ls /proc/self/fd; sleep 0.3')
    sub = runtime.submit(["sh", "-c", script])
    # While it runs: the launcher's own argv and environment.
    launcher = sub.task.live.process.pid
    environ = Path(f"/proc/{launcher}/environ").read_bytes()
    cmdline = Path(f"/proc/{launcher}/cmdline").read_bytes()
    view = runtime.wait(sub)
    assert view.status == "succeeded"
    log = runtime.log_path(sub.run_id).read_bytes()
    token = sub.token.encode()
    for blob in (environ, cmdline, log):
        assert token not in blob
    assert b"---" in log  # the task really dumped what it could see
    # Only stdin/stdout/stderr reach the task (3 is ls's own directory fd): nothing of the host leaks.
    fds = set(log.split(b"FDS\n", 1)[1].split())
    assert {b"0", b"1", b"2"} <= fds <= {b"0", b"1", b"2", b"3"}
    # Receipts and events never carry the command or its output.
    for event in runtime.events(sub.run_id):
        assert "proc" not in json.dumps(event.as_dict())


def test_the_log_holds_exactly_the_output_and_is_private(runtime) -> None:
    sub = runtime.submit(["printf", "exact bytes\\000\\001"])
    runtime.wait(sub)
    path = runtime.log_path(sub.run_id)
    assert path.read_bytes() == b"exact bytes\x00\x01"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_stdin_is_dev_null(runtime) -> None:
    sub = runtime.submit(["sh", "-c", "readlink /proc/self/fd/0; cat"])
    runtime.wait(sub)
    assert runtime.log_path(sub.run_id).read_bytes() == b"/dev/null\n"


def test_persist_failure_spawns_nothing(data_dir: Path, tmp_path: Path) -> None:
    """A database that refuses the create transaction (held locked by another writer): no spawn."""
    import dataclasses
    import sqlite3

    from ql_core.config import load_config
    from ql_core.errors import PersistBeforeSpawnError
    from ql_core.runtime import Runtime

    config = load_config(data_dir=data_dir, environ={}, cwd=data_dir)
    config = dataclasses.replace(config, profile=config.profile.with_overrides(
        {"busy_timeout_ms": 100, "completion_retries": 1}))
    rt = Runtime.open(config)
    marker = tmp_path / "spawned"
    blocker = sqlite3.connect(data_dir / "ql.db", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(PersistBeforeSpawnError, match="nothing was started"):
            rt.submit(["touch", str(marker)])
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    time.sleep(0.3)
    assert not marker.exists()
    assert rt.list_runs() == []
    assert not (data_dir / "logs").exists() or list((data_dir / "logs").glob("*/*")) == []
    rt.close()


def test_crash_before_the_create_commit_spawns_nothing(ql_env, data_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    env = dict(ql_env, QL_CRASH_POINT="create.before_commit")
    out = run_ql(["run", "--", "touch", str(marker)], env)
    assert out.returncode == 86
    time.sleep(0.3)
    assert not marker.exists()
    assert json_lines(run_ql(["list", "--json"], ql_env).stdout) == []


def test_crash_before_the_handle_commit_never_starts_the_command(ql_env, data_dir: Path, tmp_path: Path) -> None:
    """Classic path: the launcher is held until its handle is committed: a host that dies first never
    starts the command, and recovery proves it from the dead host's identity (lost, never started)."""
    marker = tmp_path / "ran"
    ql_env = classic_env(ql_env, tmp_path)
    env = dict(ql_env, QL_CRASH_POINT="spawn.before_handle_commit")
    out = run_ql(["run", "--", "sh", "-c", f'touch "{marker}"; exit 4'], env)
    assert out.returncode == 86
    counts = json_lines(run_ql(["reconcile", "--json"], ql_env).stdout)[0]
    assert counts["lost"] == 1 and counts["applied"] == 0
    run_id = json_lines(run_ql(["list", "--json"], ql_env).stdout)[0]["run_id"]
    status = json_lines(run_ql(["status", run_id, "--json"], ql_env).stdout)[0]
    assert (status["status"], status["reason"]) == ("lost", "RECOVERY_NEVER_STARTED")
    assert not marker.exists() and not list((data_dir / "receipts").glob("*/*.json"))


@pytest.mark.root
def test_gate14_full_receipt_directory_keeps_the_exit_code(ql_env, data_dir: Path) -> None:
    """Gate 14: ENOSPC for the receipt → `ql run` still exits 7 and no final receipt is visible."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    receipts = data_dir / "receipts"
    receipts.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(receipts)]).returncode:
        pytest.skip("cannot mount tmpfs here")
    try:
        fd = os.open(receipts / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        out = run_ql(["run", "--json", "--", "sh", "-c", "echo work; exit 7"], ql_env)
        assert out.returncode == 7, out.stderr
        final = json_lines(out.stdout)[-1]
        assert (final["status"], final["exit_code"]) == ("failed", 7)
        leftovers = [p.name for p in receipts.rglob("*") if p.is_file() and p.name != "filler"]
        assert leftovers == []
    finally:
        subprocess.run(["umount", str(receipts)], check=False)
