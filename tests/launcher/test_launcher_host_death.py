"""The host is SIGKILLed while its task runs: the task goes on and its receipt proves the exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ql_core.ids import new_id, shard_of
from ql_executors.local_process.identity import IdentityState, capture_handle, inspect

from .conftest import FactoryLauncher, is_standby, launcher_kwargs, new_token, parse_receipt_strict, wait_for

HOST = textwrap.dedent(
    """
    import json, os, sys, time
    from ql_executors.local_process.launch import spawn_launcher

    cfg = json.loads(sys.stdin.readline())  # the token never goes through this host's argv
    fd = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    ids = dict(shard_dir=cfg["shard"], run_id=cfg["run_id"], attempt_id=cfg["attempt_id"], callback_sequence=3,
               started_at_ms=cfg["started"])
    if cfg["standby"]:  # started first, handed its run afterwards (the executor's way)
        from ql_executors.local_process.launch import encode_task, hand_over, spawn_standby, standby_message
        if cfg["factory"]:  # forked by a factory, which dies with this host
            from ql_executors.local_process.factory import StandbyFactory
            proc, channel, _capacity = StandbyFactory(cfg["launcher"]["compiled"]).standby()
        else:
            proc, channel, _capacity = spawn_standby(cfg["launcher"]["compiled"])
        pid = proc.pid
        task = encode_task(cfg["command"], shell=False, cwd=None, env=None)
        cwd_fd = os.open(".", os.O_PATH | os.O_DIRECTORY)
        hand_over(channel, standby_message(**ids, task=task, token=cfg["token"], awaited=False), log_fd=fd,
                  cwd_fd=cwd_fd)
        channel.close()
    else:
        pid = spawn_launcher(**cfg["launcher"], **ids, mode="argv", command=cfg["command"], token=cfg["token"],
                             log_fd=fd).pid
    os.close(fd)
    print(pid, flush=True)
    time.sleep(600)
    """
)

TICKS = 20
TASK = f'i=0; while [ $i -lt {TICKS} ]; do echo "tick $i"; i=$((i+1)); sleep 0.05; done; exit 9'


def test_task_survives_sigkill_of_its_host(shell: list[str], data_dir: Path, tmp_path: Path) -> None:
    run_id, attempt_id, token = new_id(), new_id(), new_token()
    shard = data_dir / "receipts" / shard_of(attempt_id)
    shard.mkdir(mode=0o700, parents=True)
    log = data_dir / "logs" / f"{attempt_id}.log"
    log.parent.mkdir(mode=0o700)
    script = tmp_path / "host.py"
    script.write_text(HOST)
    cfg = {
        "launcher": launcher_kwargs(shell),
        "standby": is_standby(shell),
        "factory": isinstance(shell, FactoryLauncher),
        "shard": str(shard),
        "run_id": run_id,
        "attempt_id": attempt_id,
        "started": 1_700_000_000_000,
        "command": ["sh", "-c", TASK],
        "token": token,
        "log": str(log),
    }
    host = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    launcher_pid = 0
    try:
        assert host.stdin is not None and host.stdout is not None
        host.stdin.write(json.dumps(cfg).encode() + b"\n")
        host.stdin.close()
        launcher_pid = int(host.stdout.readline())
        handle = capture_handle(launcher_pid)
        assert handle is not None and handle.pgid == launcher_pid

        wait_for(lambda: log.exists() and log.read_bytes().count(b"\n") >= 2, "the first ticks")
        host.send_signal(signal.SIGKILL)
        assert host.wait(20) == -signal.SIGKILL
        size_at_host_death = log.stat().st_size
        assert inspect(handle) is IdentityState.RUNNING

        # The task keeps appending to the same log after its host died ...
        wait_for(lambda: log.stat().st_size > size_at_host_death, "the log to grow after host death")
        # ... and its receipt proves the true exit code.
        receipt_path = shard / f"{attempt_id}.json"
        wait_for(receipt_path.exists, "the receipt")
        receipt = parse_receipt_strict(receipt_path.read_bytes())
        assert receipt["exitCode"] == 9
        assert receipt["token"] == token
        assert receipt["runId"] == run_id and receipt["callbackSequence"] == 3
        assert log.read_bytes() == b"".join(f"tick {i}\n".encode() for i in range(TICKS))
        # The temp file is unlinked just after the link: look once the launcher is gone.
        wait_for(lambda: inspect(handle) is IdentityState.EXITED, "the launcher to exit")
        assert sorted(os.listdir(shard)) == [f"{attempt_id}.json"]
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        assert host.stdout is not None
        host.stdout.close()
        if launcher_pid:
            try:
                os.killpg(launcher_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
