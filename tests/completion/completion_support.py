"""Helpers for the completion tests: the real `ql` command, real tasks, real files, the real database.

Nothing here mocks anything. A "trigger task" is a real command that waits
(bounded) for a file to appear and then exits with a chosen code, so a test
decides exactly when a task ends without a fixed sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ql_core.testing.executor import wait_until
from ql_core.clock import now_ms_ceil
from ql_core.crashpoints import CRASH_EXIT_CODE
from ql_core.receipts import Receipt, serialize_receipt
from ql_core.states import RUN_TERMINAL
from ql_core.submit import create
from tests.conftest import QL, run_ql
from tests import dbview
from tests.processes import under_subreaper

T = TypeVar("T")

#: Generous: CI machines can be slow; nothing waits this long when things work.
DEADLINE_S = 60.0


def wait_for(predicate: Callable[[], T], *, timeout: float = DEADLINE_S, what: str = "condition") -> T:
    """ql_core.testing's poller (``wait_until``), with this folder's keyword names."""
    return wait_until(predicate, what, timeout, interval=0.02)


# -- the real command ------------------------------------------------------------------
def ql(env: dict[str, str], *args: str, crash: str | None = None, timeout: float = DEADLINE_S,
       config: Path | None = None, subreaper: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `ql ARGS` in a subprocess; ``crash`` sets QL_CRASH_POINT for that process only;
    ``subreaper``: under :func:`tests.processes.under_subreaper` (the return code is then
    ``OUTLIVED_EXIT_CODE`` when a process the host started outlived it)."""
    env = dict(env)
    if crash is not None:
        env["QL_CRASH_POINT"] = crash
    if config is not None:
        env["QL_CONFIG"] = str(config)
    if subreaper:  # the host's orphans are this wrapper's, not the machine's (tests/processes.py)
        argv = under_subreaper(QL + list(args), bound_s=timeout / 2)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return run_ql(list(args), env, timeout=timeout)


def ql_json(env: dict[str, str], *args: str, **kwargs: Any) -> dict[str, Any]:
    """The first JSON line of a successful `ql --json ARGS`."""
    out = ql(env, "--json", *args, **kwargs)
    assert out.returncode == 0, (args, out.returncode, out.stderr)
    return json.loads(out.stdout.splitlines()[0])


def ql_crash(env: dict[str, str], point: str, *args: str,
             subreaper: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `ql ARGS` so that it dies at ``point``; assert it really did (and, with ``subreaper``,
    that nothing it started outlived it)."""
    out = ql(env, *args, crash=point, subreaper=subreaper)
    assert out.returncode == CRASH_EXIT_CODE, (point, args, out.returncode, out.stderr)
    return out


def reconcile(env: dict[str, str], **kwargs: Any) -> dict[str, Any]:
    return ql_json(env, "reconcile", **kwargs)


def trigger_command(trigger: Path, exit_code: int) -> list[str]:
    """A task that waits (at most ~2 minutes) for ``trigger`` to exist, then exits ``exit_code``."""
    script = (f'i=0; while [ ! -e "{trigger}" ] && [ "$i" -lt 2400 ]; do sleep 0.05; i=$((i+1)); done; '
              f"exit {exit_code}")
    return ["sh", "-c", script]


def detach(env: dict[str, str], *command: str, crash: str | None = None) -> dict[str, Any]:
    """`ql run --detach -- CMD`: the host exits at once, the task goes on."""
    out = ql(env, "--json", "run", "--detach", "--", *command, crash=crash)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


# -- files -----------------------------------------------------------------------------
def receipt_path(data_dir: Path, attempt_id: str) -> Path:
    return data_dir / "receipts" / attempt_id[-2:] / f"{attempt_id}.json"


def quarantine_path(data_dir: Path, attempt_id: str) -> Path:
    return data_dir / "receipts" / ".quarantine" / attempt_id[-2:] / f"{attempt_id}.json"


def temp_files(data_dir: Path, attempt_id: str) -> list[Path]:
    return sorted((data_dir / "receipts" / attempt_id[-2:]).glob(f".{attempt_id}.*.tmp"))


def plant(data_dir: Path, attempt_id: str, payload: bytes, *, name: str | None = None) -> Path:
    """Write ``payload`` where a receipt (or ``name``) of the attempt would be, 0600, shard 0700."""
    shard = data_dir / "receipts" / attempt_id[-2:]
    shard.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = shard / (name or f"{attempt_id}.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    return path


def valid_receipt(sub: Any, *, exit_code: int = 0, finished_at_ms: int | None = None,
                  started_at_ms: int | None = None, **changes: Any) -> Receipt:
    """The receipt the launcher of ``sub`` (a Submission) would publish; fields overridable."""
    finished = finished_at_ms if finished_at_ms is not None else max(now_ms_ceil(), sub.started_at_ms)
    started = started_at_ms if started_at_ms is not None else min(sub.started_at_ms, finished)
    fields = dict(schema_version=1, run_id=sub.run_id, attempt_id=sub.attempt_id,
                  callback_sequence=sub.callback_sequence, token=sub.token, started_at_ms=started,
                  finished_at_ms=finished, exit_code=exit_code)
    fields.update(changes)
    return Receipt(**fields)


def receipt_bytes(sub: Any, **kwargs: Any) -> bytes:
    return serialize_receipt(valid_receipt(sub, **kwargs))


# -- the database --------------------------------------------------------------------
def journal_row(rt: Any, attempt_id: str) -> dict[str, Any] | None:
    return dbview.row(rt, "ql_receipt_journal", attempt_id)


def attempt_row(rt: Any, attempt_id: str) -> dict[str, Any]:
    found = dbview.row(rt, "ql_run_attempt", attempt_id)
    assert found is not None, attempt_id
    return found


def dispatch_row(rt: Any, run_id: str) -> dict[str, Any] | None:
    return dbview.row(rt, "ql_cancel_dispatch", run_id)


def set_attempt(rt: Any, attempt_id: str, **values: Any) -> None:
    """Change attempt columns directly (to forge ownership / executor)."""
    assert dbview.update(rt, "ql_run_attempt", attempt_id, **values) == 1


def host_gone(rt: Any, attempt_id: str) -> None:
    """Record the attempt's host as a process that has exited (same pid, another start time): a
    run nobody waits for. Recovery defers a receipt whose launcher still runs beside a live host
    (a forgery must not beat the waiting host, docs/launcher.md "Hardening"); this test's process is
    the host and stays alive, so a test that publishes a receipt for a running task says so."""
    attempt = rt.journal.attempt(attempt_id)  # the store's read (SQLite keeps it beside the row, 0014)
    assert attempt is not None and attempt.host_handle
    handle = json.loads(attempt.host_handle)
    handle["start_time"] += 1
    set_attempt(rt, attempt_id, host_handle=json.dumps(handle, separators=(",", ":"), sort_keys=True))


def only_run_id(rt: Any) -> str:
    runs = rt.list_runs()
    assert len(runs) == 1, [r.run_id for r in runs]
    return runs[0].run_id


def events(rt: Any, run_id: str) -> list[dict[str, Any]]:
    return [e.as_dict() for e in rt.events(run_id)]


def event_types(rt: Any, run_id: str) -> list[str]:
    return [e.type for e in rt.events(run_id)]


def terminal_events(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    runs = [e for e in events if e["type"] in {f"run.{s}" for s in RUN_TERMINAL}]
    attempts = [e for e in events if e["type"] in {f"attempt.{s}" for s in RUN_TERMINAL}]
    return runs, attempts


def assert_one_terminal(rt: Any, run_id: str, status: str, exit_code: int | None | object = ...) -> list[dict]:
    """Exactly one run.<terminal> and one attempt.<terminal> event, matching the run's row."""
    events = [e.as_dict() for e in rt.events(run_id)]
    runs, attempts = terminal_events(events)
    assert [e["type"] for e in runs] == [f"run.{status}"], [e["type"] for e in events]
    assert [e["type"] for e in attempts] == [f"attempt.{status}"], [e["type"] for e in events]
    assert attempts[0]["seq"] + 1 == runs[0]["seq"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    view = rt.status(run_id)
    assert view.status == status
    if exit_code is not ...:
        assert view.exit_code == exit_code
        assert runs[0]["exit_code"] == exit_code and attempts[0]["exit_code"] == exit_code
    return events


def assert_not_terminal(rt: Any, run_id: str) -> None:
    runs, attempts = terminal_events([e.as_dict() for e in rt.events(run_id)])
    assert runs == [] and attempts == []
    assert rt.status(run_id).status in ("queued", "running")


def write_config(path: Path, **limits: Any) -> Path:
    body = "[limits]\n" + "".join(f"{k} = {v!r}\n" for k, v in limits.items())
    path.write_text(body)
    return path


# -- many processes at once ------------------------------------------------------------
#: A consumer process: opens its own Runtime on the same data dir / database, waits for the start
#: file, consumes every attempt id given on stdin (in its own order) and prints the outcome counts.
CONSUME_WORKER = r"""
import collections, json, os, random, sys, time
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime

data_dir, go, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
environ = {"QL_DATABASE_URL": os.environ["QL_DATABASE_URL"]} if os.environ.get("QL_DATABASE_URL") else {}
attempt_ids = json.loads(sys.stdin.read())
random.Random(seed).shuffle(attempt_ids)
rt = Runtime.open(load_config(data_dir=data_dir, environ=environ, cwd=data_dir))
print("ready", flush=True)
deadline = time.monotonic() + 60
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.001)
counts = collections.Counter(str(rt.consumer.consume(a).outcome) for a in attempt_ids)
print(json.dumps(counts), flush=True)
"""


def run_consume_workers(data_dir: Path, attempt_ids: list[str], workers: int, *, tmp: Path,
                        env: dict[str, str] | None = None) -> list[dict[str, int]]:
    """Start ``workers`` consumer processes, release them at the same instant, return their counts."""
    go = tmp / "go-consumers"
    procs = [subprocess.Popen([sys.executable, "-c", CONSUME_WORKER, str(data_dir), str(go), str(seed)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for seed in range(workers)]
    for proc in procs:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(attempt_ids))
        proc.stdin.close()
        proc.stdin = None  # communicate() below must not flush it again
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()  # type: ignore[union-attr]
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=DEADLINE_S * 2)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def create_with_receipts(rt: Any, n: int, *, exit_code: Callable[[int], int] = lambda i: i % 7) -> list[Any]:
    """``n`` attempts through the runtime's own create path (no process), each with its valid receipt."""
    subs = []
    for i in range(n):
        sub = create(rt.node, name=f"r{i}")
        rt.receipts.publish(valid_receipt(sub, exit_code=exit_code(i)))
        subs.append(sub)
    return subs


# -- counting commits ----------------------------------------------------------------------
CommitLog = dbview.CommitLog
