"""Helpers for the recovery tests: real runtimes, real SQLite rows, real processes, the real `ql`.

Nothing here mocks the database, the file system or a process: rows are inserted with stdlib sqlite3 into
the migrated SQLite file (``tests/dbview.py``), tasks are started through ``Runtime.submit`` or the ``ql`` command, faults are
produced for real (SIGKILL of a process group, a tampered handle row).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from ql_core.testing.executor import wait_until as poll_until
from tests.conftest import QL, run_ql
from tests import dbview
from tests.processes import pids, proc_stat

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")


def open_runtime(data_dir: Path, profile: str = "edge", *, database_url: str | None = None,
                 **limits: Any):  # type: ignore[no-untyped-def]
    """A runtime on ``data_dir`` with the named profile and validated limit overrides."""
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    environ = {"QL_DATABASE_URL": database_url} if database_url else {}
    config = load_config(data_dir=data_dir, profile=profile, environ=environ, cwd=data_dir)
    if limits:
        config = dataclasses.replace(config, profile=config.profile.with_overrides(limits))
    return Runtime.open(config)


def write_config(path: Path, profile: str = "edge", **limits: Any) -> Path:
    """A ql.toml with ``[limits]`` for `ql --config` (the same overrides a user would write)."""
    lines = [f'profile = "{profile}"', "", "[limits]"]
    lines += [f"{k} = {v!r}" for k, v in limits.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def ql(args: list[str], env: dict[str, str], *, timeout: float = 60, check: bool = True,
       config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `ql` command."""
    pre = ["--config", str(config)] if config is not None else []
    proc = run_ql(pre + args, env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ql {args} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def ql_json(args: list[str], env: dict[str, str], **kw: Any) -> list[dict[str, Any]]:
    proc = ql(["--json", *args], env, **kw)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.05,
               message: str = "condition") -> Any:
    """ql_core.testing's poller (``wait_until``), with this folder's keyword names."""
    return poll_until(predicate, message, timeout, interval=interval)


def proc_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (None when it does not exist)."""
    fields = proc_stat(pid)
    return None if fields is None else fields[0]


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is neither a zombie nor dead."""
    return proc_state(pid) not in (None, "Z", "X", "x")


def group_alive(pgid: int) -> bool:
    """True when any non-zombie process is still in process group ``pgid``."""
    return any((fields := proc_stat(pid)) is not None and int(fields[2]) == pgid
               and fields[0] not in ("Z", "X", "x") for pid in pids())


def kill_group(pgid: int | None, sig: int = signal.SIGKILL) -> None:
    """Best-effort cleanup of a task's process group."""
    if pgid is None or pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def attempt_row(rt: Any, attempt_id: str) -> Any:
    """The attempt's row, plus ``pid``/``pgid`` decoded from its local-executor handle (None without one)."""
    found = dbview.row(rt, "ql_run_attempt", attempt_id)
    if found is not None:
        handle = dbview.launcher(found) or {}
        found["pid"], found["pgid"] = handle.get("pid"), handle.get("pgid")
    return found


def dispatch_row(rt: Any, run_id: str) -> Any:
    return dbview.row(rt, "ql_cancel_dispatch", run_id)


def journal_row(rt: Any, attempt_id: str) -> Any:
    return dbview.row(rt, "ql_receipt_journal", attempt_id)


def update_rows(rt: Any, table: str, key: str, values: dict[str, Any]) -> None:
    """A direct UPDATE of one row (used to tamper a handle or age a retention clock)."""
    assert dbview.update(rt, table, key, **values) == 1


def tamper_handle(rt: Any, attempt_id: str, **changes: Any) -> None:
    """Rewrite fields of an attempt's stored local-executor handle (a corrupted or foreign row)."""
    row = dbview.row(rt, "ql_run_attempt", attempt_id)
    handle = dict(dbview.launcher(row) or {}, **changes)
    update_rows(rt, "ql_run_attempt", attempt_id, {"handle": dbview.local_handle(handle)})


def event_types(rt: Any, run_id: str) -> list[str]:
    return [e.type for e in rt.events(run_id)]


def terminal_events(rt: Any, run_id: str) -> list[str]:
    return [t for t in event_types(rt, run_id) if t.startswith("run.") and t[4:] in TERMINAL]


def wait_terminal(rt: Any, run_id: str, *, timeout: float, reconcile: bool = False) -> Any:
    """Poll the run until it is terminal (optionally running reconcile passes in between)."""
    def done() -> Any:
        if reconcile:
            rt.reconcile()
        view = rt.status(run_id)
        return view if view.terminal else None

    return wait_until(done, timeout=timeout, interval=0.1, message=f"run {run_id} to end")


@dataclasses.dataclass
class Inserted:
    run_ids: list[str]
    attempt_ids: list[str]
    tokens: dict[str, str]


def dead_handle() -> dict[str, Any]:
    """A handle that names no live process: this boot, the pid of a reaped child, an impossible start time.

    Classifies as ``exited``; a dispatcher re-verifies it and sends nothing.
    """
    from ql_executors.local_process.identity import read_boot_id

    child = subprocess.Popen(["true"])
    child.wait()
    return {"boot_id": read_boot_id(), "pid": child.pid, "pgid": child.pid, "start_time": 1}


def unverifiable_handle() -> dict[str, Any]:
    """A corrupt handle (negative start time): identity cannot be verified (→ blocked, never signalled)."""
    from ql_executors.local_process.identity import read_boot_id

    return {"boot_id": read_boot_id(), "pid": 2 ** 22 + 7, "pgid": 2 ** 22 + 7, "start_time": -1}


def insert_attempts(rt: Any, n: int, *, handle: dict[str, Any] | None, status: str = "running",
                    journal: bool = True, owner: str | None = None, created_at_ms: int | None = None,
                    deadline_at_ms: int | None = None, batch: int = 10_000,
                    host_handle: dict[str, Any] | None = None) -> Inserted:
    """Insert ``n`` runs + attempts (+ journal rows) directly into the SQLModel tables, ``batch`` per transaction.

    Every attempt gets its own random token; only its SHA-256 is stored (``hash_token``), the plaintext
    is returned so a test can publish valid receipts.
    """
    import secrets

    from ql_core.completion import hash_token
    from ql_core.ids import new_id
    from ql_core.paths import log_relative_path

    now = int(time.time() * 1000)
    created = now if created_at_ms is None else created_at_ms
    out = Inserted([], [], {})
    owner = rt.node_id if owner is None else owner
    run_status = "running" if status in ("running", "blocked") else ("queued" if status == "starting" else status)
    todo = n
    while todo > 0:
        k = min(batch, todo)
        todo -= k
        runs, attempts, logs, events, rows = [], [], [], [], []
        for _ in range(k):
            run_id, attempt_id, log_id = new_id(), new_id(), new_id()
            token = secrets.token_urlsafe(32)
            out.run_ids.append(run_id)
            out.attempt_ids.append(attempt_id)
            out.tokens[attempt_id] = token
            runs.append(dict(id=run_id, name=None, status=run_status, exit_code=None, reason=None, version=1,
                             event_seq=1, current_attempt_id=attempt_id, created_at_ms=created,
                             updated_at_ms=created, finished_at_ms=None, deadline_at_ms=deadline_at_ms,
                             cancel_reason=None, cancel_requested_at_ms=None))
            attempts.append(dict(
                id=attempt_id, run_id=run_id, attempt_no=1, executor="local", runtime_owner=owner,
                status=status, exit_code=None, reason=None, log_artifact_id=log_id,
                callback_token_hash=hash_token(token), callback_sequence=0, deadline_at_ms=deadline_at_ms,
                created_at_ms=created, started_at_ms=created if handle else None, finished_at_ms=None,
                handle=dbview.local_handle(handle) if handle else None,
                host_handle=dbview.local_handle(host_handle) if host_handle else None, version=1))
            logs.append(dict(id=log_id, run_id=run_id, attempt_id=attempt_id,
                             relative_path=log_relative_path(log_id), max_bytes=1 << 20, size_bytes=None,
                             truncated=False, created_at_ms=created, deleted_at_ms=None))
            events.append(dict(run_id=run_id, seq=1, type="run.created", attempt_id=attempt_id, status=None,
                               exit_code=None, reason=None, at_ms=created))
            if journal:
                rows.append(dict(attempt_id=attempt_id, run_id=run_id, state="pending",
                                 receipt_ref=rt.receipts.relative_ref(attempt_id), quarantine_reason=None,
                                 registered_at_ms=created, updated_at_ms=created, terminal_seen_at_ms=None))
        for table, values in (("ql_run", runs), ("ql_run_attempt", attempts), ("ql_log_artifact", logs),
                              ("ql_run_event", events), ("ql_receipt_journal", rows)):
            dbview.insert(rt, table, values)
    return out


def publish_receipt(rt: Any, inserted: Inserted, attempt_id: str, exit_code: int = 0, *,
                    sequence: int = 1, finished_at_ms: int | None = None, fsync: bool = True) -> None:
    """Publish a valid receipt for an inserted attempt with the runtime's own receipt store."""
    from ql_core.receipts.codec import Receipt

    run_id = inserted.run_ids[inserted.attempt_ids.index(attempt_id)]
    now = int(time.time() * 1000)
    rt.receipts.publish(Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id,
                                callback_sequence=sequence, token=inserted.tokens[attempt_id],
                                started_at_ms=now - 10, finished_at_ms=finished_at_ms or now,
                                exit_code=exit_code), fsync=fsync)


def count_rows(rt: Any, table: str, where: str = "1=1", params: Iterable[Any] = ()) -> int:
    return dbview.count(rt, table, where, params)


def statuses(rt: Any, run_ids: Iterable[str]) -> dict[str, str]:
    ids = list(run_ids)
    out: dict[str, str] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        marks = ",".join("?" * len(chunk))
        for r in dbview.rows(rt, f"SELECT id, status FROM ql_run WHERE id IN ({marks})", chunk):
            out[r["id"]] = r["status"]
    return out
