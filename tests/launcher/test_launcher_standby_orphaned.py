"""A standby whose host sent the go-ahead and died before the standby looked at its channel.

The host's create commit precedes the hand-over message, and that message is the go-ahead: once it
is sent, the run is recorded ``running`` with this launcher's handle, and the task must run whatever
happens to the host afterwards ("kill the host in the middle of anything: the task keeps running").
An idle standby also leaves when its owner dies (it checks that the owner is still its parent); that
check must never win over a message that is already waiting. Found by the power-loss replay under
``strace``, where the traced standby often reached its channel after its host had already exited.

Produced for real: the standby is stopped (SIGSTOP) before it runs a single instruction of the
launcher; its host hands it a run and exits; then the standby is continued, an orphan.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ql_core.ids import new_id, shard_of

from .conftest import DEADLINE_S, alive, new_token, parse_receipt_strict, require_tool, wait_for

STARTED_AT_MS = 1_700_000_000_000

# The host: a standby on a socket pair, stopped before its exec; the run handed over; the host gone.
OWNER = textwrap.dedent("""
    import os, signal, socket, sys
    from ql_executors.local_process.launch import encode_task, hand_over, standby_message

    compiled, shard, run_id, attempt_id, token, log, touch, marker = sys.argv[1:9]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(theirs.fileno(), 0)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.setsid()
        os.kill(os.getpid(), signal.SIGSTOP)  # nothing of the launcher has run yet
        os.execve(compiled, [compiled, "--standby"], {})
    theirs.close()
    _, status = os.waitpid(pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status
    task = encode_task([touch, marker], shell=False, cwd=None, env={"PATH": os.environ["PATH"]})
    message = standby_message(shard_dir=shard, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                              started_at_ms=%d, task=task, token=token, awaited=False)
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    cwd_fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    hand_over(ours, message, log_fd=log_fd, cwd_fd=cwd_fd)
    print(pid, flush=True)
    os._exit(0)  # the host dies: the go-ahead was sent, the standby has not looked yet
""" % STARTED_AT_MS)


@pytest.fixture(scope="module")
def binary() -> str:
    from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher

    try:
        return compiled_launcher(os.environ)
    except CompiledLauncherError as exc:
        return require_tool(None, f"the compiled launcher cannot be built here: {exc}")[0]


def test_a_go_ahead_sent_before_the_host_died_runs_the_task(binary: str, tmp_path: Path) -> None:
    run_id, attempt_id, token = new_id(), new_id(), new_token()
    shard = tmp_path / "receipts" / shard_of(attempt_id)
    shard.mkdir(mode=0o700, parents=True)
    log = tmp_path / f"{attempt_id}.log"
    log.touch(mode=0o600)
    marker = tmp_path / "ran"
    touch = shutil.which("touch")
    assert touch is not None
    owner = subprocess.run([sys.executable, "-c", OWNER, binary, str(shard), run_id, attempt_id, token, str(log),
                            touch, str(marker)], cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S)
    assert owner.returncode == 0, owner.stderr
    standby = int(owner.stdout)
    try:
        os.kill(standby, signal.SIGCONT)  # an orphan now: its owner is gone, its message waits
        receipt = shard / f"{attempt_id}.json"
        wait_for(receipt.exists, "the orphaned standby to run its task and publish")
        obj = parse_receipt_strict(receipt.read_bytes())
        assert (obj["runId"], obj["attemptId"], obj["exitCode"]) == (run_id, attempt_id, 0)
        assert marker.exists()
        wait_for(lambda: not alive(standby), "the standby to exit after publishing")
    finally:
        if alive(standby):
            os.killpg(standby, signal.SIGKILL)
    assert json.loads(receipt.read_bytes())["token"] == token
