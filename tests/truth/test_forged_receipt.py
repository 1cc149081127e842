"""A same-user forgery never beats the host that waited (the review's "forged receipt" finding).

The attack, as it was reproduced: a task read its sibling standby launcher's hand-over message (ids,
shard, token) out of that launcher's memory (``/proc/PID/mem``) and published the sibling's receipt
while the sibling still ran; a ``ql status``/``ql reconcile``/supervisor round consumed it, and the
sibling's waiting ``ql run`` then exited 0 for a task that exits 4.

- the compiled launcher is not dumpable: the same read now fails (a dumpable process of the same
  kind, read by the same task, shows the read itself works);
- a receipt whose launcher still runs beside its live host is deferred by every reader, and the
  waiting host, once it reaped the task, commits the true status and quarantines the forgery with an
  ``attempt.receipt_rejected`` event — through ``ql run`` and through the embedding API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ql_core.testing.executor import wait_until
from tests import dbview
from tests.conftest import QL, json_lines, release_host, run_ql

BOUND_S = 60
from tests.truth.mem_reader import MAGIC

READER = Path(__file__).with_name("mem_reader.py")


def _wait(predicate, what: str):  # type: ignore[no-untyped-def]
    return wait_until(predicate, what, BOUND_S, interval=0.02)


def _unprivileged(command: list[str]) -> list[str]:
    """``command`` as an ordinary same-user process. As root: without CAP_SYS_PTRACE (which reads
    any process's memory whatever its dumpable flag), for the victim's host and the attacker alike
    (a reader whose capabilities are not a superset of its target's is refused anyway)."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is needed to drop CAP_SYS_PTRACE from a root test's processes")
    return [setpriv, "--bounding-set=-sys_ptrace", *command]


def _read_memory_as_a_task(env: dict[str, str], pid: int, out: Path) -> dict:
    """The attacker: a task of another `ql run` of the same user, reading ``pid``'s memory."""
    ran = subprocess.run(_unprivileged([*QL, "run", "--", sys.executable, str(READER), str(pid), str(out)]),
                         env=env, capture_output=True, text=True, timeout=BOUND_S)
    assert ran.returncode == 0, ran.stderr
    return json.loads(out.read_text())


def _launcher_pid(data_dir: Path, attempt_id: str) -> int:
    rows = dbview.rows(f"sqlite:///{data_dir}/ql.db", "SELECT handle FROM ql_run_attempt WHERE id = ?",
                       (attempt_id,))
    return int(json.loads(rows[0]["handle"])["pid"])


def test_a_sibling_task_cannot_read_the_token_from_a_standby_launchers_memory(ql_env: dict[str, str],
                                                                              data_dir: Path,
                                                                              tmp_path: Path) -> None:
    go = tmp_path / "go"
    # Control: the same reader, as the same kind of task, does find such a message in a dumpable
    # process of the same user (so what it finds below is the launcher's protection, not a broken reader).
    message = b"\0".join([MAGIC[:-1], b"shard", b"run", b"attempt", b"1", b"0", b"argv", b",,,,", b"", b"1", b"true",
                          b"0", b"T" * 43]) + b"\0"
    holder = subprocess.Popen(_unprivileged([sys.executable, "-c", "import sys, time; m = bytes.fromhex(sys.argv[1]); "
                                             "print('ready', flush=True); time.sleep(120)", message.hex()]),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        control = _read_memory_as_a_task(ql_env, holder.pid, tmp_path / "control.json")
    finally:
        holder.kill()
        holder.communicate()
    assert ["run", "attempt", "1", "0", "T" * 43] in control.get("found", []), control

    victim = subprocess.Popen(_unprivileged([*QL, "--json", "run", "--", "sh", "-c",
                                             f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 4']),
                              env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(victim.stdout.readline())  # type: ignore[union-attr]
        pid = _launcher_pid(data_dir, first["attempt_id"])
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1] == b"--standby"  # a standby got it
        stolen = _read_memory_as_a_task(ql_env, pid, tmp_path / "stolen.json")
        go.touch()
        stdout, stderr = victim.communicate(timeout=BOUND_S)
    finally:
        release_host(victim, go)
    assert stolen == {"error": "PermissionError"}, stolen  # /proc/PID/maps and mem refuse the reader
    # The launcher still works and its identity (/proc/PID/stat) is still read: the run ends true.
    assert victim.returncode == 4, stderr
    assert json_lines(stdout)[-1]["status"] == "failed"


def _forge(rt: Any, run_id: str, attempt_id: str, token: str, started_at_ms: int, exit_code: int) -> None:
    from ql_core.clock import now_ms_ceil
    from ql_core.receipts import Receipt

    rt.receipts.publish(Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                                token=token, started_at_ms=started_at_ms, finished_at_ms=now_ms_ceil(),
                                exit_code=exit_code))


def _status(env: dict[str, str], run_id: str) -> dict:
    out = run_ql(["--json", "status", run_id], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def _readers_leave_it(env: dict[str, str], run_id: str) -> None:
    """``ql status`` and ``ql reconcile`` look at the run while the forgery waits in its slot."""
    assert _status(env, run_id)["status"] == "running"
    counts = json_lines(run_ql(["--json", "reconcile"], env).stdout)[0]
    assert counts["applied"] == 0 and counts["other"].get("receipt_deferred") == 1, counts
    assert _status(env, run_id)["status"] == "running"


def _assert_rejected(rt: Any, run_id: str, attempt_id: str) -> None:
    events = [(e.type, e.reason) for e in rt.events(run_id)]
    assert ("attempt.receipt_rejected", "DISAGREES_WITH_OBSERVED_EXIT") in events, events
    row = dbview.row(rt, "ql_receipt_journal", attempt_id)
    assert row is not None and row.quarantine_reason == "disagrees_with_observed_exit"
    assert rt.receipts.quarantined_exists(attempt_id)


@pytest.mark.skipif(os.geteuid() != 0, reason="the test reads the token from the launcher as root would")
def test_ql_run_ends_with_the_true_status_though_a_forgery_was_published_and_read(
        open_rt, ql_env: dict[str, str], tmp_path: Path) -> None:
    rt = open_rt()  # the test's view of the data dir (and its receipt store, to publish the forgery)
    go = tmp_path / "go"
    host = subprocess.Popen(QL + ["--json", "run", "--", "sh", "-c",
                                  f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 4'],
                            env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(host.stdout.readline())  # type: ignore[union-attr]
        run_id, attempt_id = first["run_id"], first["attempt_id"]
        pid = _launcher_pid(rt.config.data_dir, attempt_id)
        # The attacker's read, done with the privilege it no longer has (root, CAP_SYS_PTRACE).
        found = json.loads((_read_as_root(pid, tmp_path / "root.json")).read_text())["found"]
        ids = next(f for f in found if f[:2] == [run_id, attempt_id])
        _forge(rt, run_id, attempt_id, ids[4], int(ids[3]), exit_code=0)
        _readers_leave_it(ql_env, run_id)
        go.touch()
        stdout, stderr = host.communicate(timeout=BOUND_S)
    finally:
        release_host(host, go)
    assert host.returncode == 4, stderr
    final = json_lines(stdout)[-1]
    assert (final["status"], final["exit_code"]) == ("failed", 4)
    _assert_rejected(rt, run_id, attempt_id)


def _read_as_root(pid: int, out: Path) -> Path:
    subprocess.run([sys.executable, str(READER), str(pid), str(out)], check=True, timeout=BOUND_S)
    return out


def test_an_embedding_host_ends_with_the_true_status_though_a_forgery_was_read_by_everyone(
        open_rt, ql_env: dict[str, str], tmp_path: Path) -> None:
    rt = open_rt()
    go = tmp_path / "go"
    sub = rt.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done; exit 4'], awaited=True)
    assert sub.attempt_id is not None
    _forge(rt, sub.run_id, sub.attempt_id, sub.token, sub.started_at_ms, exit_code=0)
    _readers_leave_it(ql_env, sub.run_id)
    report = rt.supervisor().run_round()  # the embedding host's own supervisor round
    assert report.counts["applied"] == 0 and report.counts["receipt_deferred"] == 1, report.counts
    assert not rt.status(sub.run_id).terminal
    go.touch()
    view = rt.wait(sub)
    assert (view.status, view.exit_code) == ("failed", 4)
    _assert_rejected(rt, sub.run_id, sub.attempt_id)
