"""A small cluster on this machine for the worker tests: real `ql worker` / `ql control` processes.

Each test gets its own PostgreSQL database (``cluster_dsn``), its own worker data dirs and config
files with the cluster numbers shrunk (leases of a few seconds), a control-node ``Runtime`` for
submitting, and real signals (SIGSTOP, SIGCONT, SIGKILL, SIGTERM) on real processes. Nothing is
mocked. At teardown every process is stopped, every task a worker left running is killed through
its durable handle, and the invariants are checked: in the control database (``check_invariants``)
and across the workers' local stores (:func:`check_workers`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import psycopg
from psycopg.rows import dict_row

from ql_core.testing.executor import wait_until
from ql_plugins.cluster_fenced.settings import NUMBER_RANGES
from tests.conftest import QL, run_ql

T = TypeVar("T")
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
DEADLINE_S = 90.0

#: The numbers of the tests: leases of a few seconds, fast sweeps and heartbeats (the cluster's
#: numbers go to [plugin.cluster-fenced], the core's to [limits]).
FAST_LIMITS: dict[str, Any] = {
    "run_lease_s": 3.0,
    "fence_margin_s": 0.6,
    "session_lease_s": 4.0,
    "heartbeat_interval_s": 0.5,
    "sweep_interval_s": 0.2,
    "claim_interval_s": 0.1,
    "control_call_timeout_s": 1.0,
    "cancel_grace_s": 1.0,
    "scan_interval_s": 0.5,
    "publish_grace_ms": 100,
}


def wait_for(predicate: Callable[[], T], *, timeout: float = DEADLINE_S, what: str = "condition",
             every: float = 0.02, diagnose: Callable[[], str] | None = None) -> T:
    """ql_core.testing's poller (``wait_until``), with this folder's keyword names."""
    return wait_until(predicate, what, timeout, interval=every, diagnose=diagnose)


def toml_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value).lower() if isinstance(value, bool) \
        else repr(value)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    data_dir: Path | None = None
    config: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        """To the whole process group it leads (a wrapper such as faketime forks the real process);
        its tasks are in sessions of their own and are not hit."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 60) -> int:
        return self.popen.wait(timeout=timeout)

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"[{self.name}: no log]"
        return f"--- {self.name} (rc={self.popen.poll()}) ---\n" + "\n".join(lines[-n:])


@dataclass
class Harness:
    dsn: str
    root: Path
    limits: dict[str, Any] = field(default_factory=lambda: dict(FAST_LIMITS))
    procs: list[Proc] = field(default_factory=list)
    worker_dirs: dict[str, Path] = field(default_factory=dict)
    _control_rt: Any = None
    _sql: Any = None
    #: The spec key every node of this test's cluster shares (created 0600 on first use).
    _key_file: Path | None = None

    @property
    def key_file(self) -> Path:
        if self._key_file is None:
            from ql_plugins.cluster_fenced.sealing import new_key_file

            self._key_file = self.root / "spec.key"
            new_key_file(self._key_file)
        return self._key_file

    # -- configs ----------------------------------------------------------------------------------
    def write_config(self, path: Path, *, profile: str, data_dir: Path, plugin: dict[str, Any] | None = None,
                     limits: dict[str, Any] | None = None, database_url: str | None = None,
                     local: dict[str, Any] | None = None) -> Path:
        lines = [f'profile = "{profile}"', f'data_dir = "{data_dir}"',
                 f'database_url = "{database_url or self.dsn}"']
        merged = dict(self.limits, **(limits or {}))
        lines.append("[limits]")
        lines += [f"{k} = {toml_value(v)}" for k, v in merged.items() if k not in NUMBER_RANGES]
        # The cluster numbers are the plugin's own settings (an older config's [limits] also works).
        plugin = {"spec_key_file": str(self.key_file), **{k: v for k, v in merged.items() if k in NUMBER_RANGES},
                  **(plugin or {})}
        lines.append("[plugin.cluster-fenced]")
        lines += [f"{k} = {toml_value(v)}" for k, v in plugin.items() if v is not None]
        if local:  # the local executor's own settings (e.g. standby = false: the classic spawn path)
            lines.append("[plugin.local]")
            lines += [f"{k} = {toml_value(v)}" for k, v in local.items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    def worker_dir(self, name: str) -> Path:
        d = self.worker_dirs.get(name)
        if d is None:
            d = self.root / f"worker-{name}"
            d.mkdir(mode=0o700, exist_ok=True)
            self.worker_dirs[name] = d
        return d

    # -- processes ------------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], config: Path, *, env: dict[str, str] | None = None,
               prefix: list[str] | None = None, data_dir: Path | None = None) -> Proc:
        log = self.root / f"{name}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        full_env.update({"QL_CONFIG": str(config), "QL_LOG_LEVEL": "info", "HOME": str(self.root)})
        full_env.update(env or {})
        with open(log, "ab") as out:
            popen = subprocess.Popen((prefix or []) + QL + args, env=full_env, stdout=out, stderr=out,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = Proc(name, popen, log, data_dir, config)
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str, *, worker_id: str | None = None, slots: int = 2, drain: str = "finish",
                     drain_timeout_s: float = 10.0, crash: str | None = None, prefix: list[str] | None = None,
                     limits: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                     data_dir: Path | None = None, database_url: str | None = None,
                     plugin: dict[str, Any] | None = None, local: dict[str, Any] | None = None) -> Proc:
        d = data_dir or self.worker_dir(name)
        config = self.write_config(self.root / f"{name}.toml", profile="cluster-worker", data_dir=d,
                                   plugin={"worker_id": worker_id or name, "slots": slots, "drain": drain,
                                           "drain_timeout_s": drain_timeout_s, **(plugin or {})}, limits=limits,
                                   database_url=database_url, local=local)
        extra = dict(env or {})
        if crash:
            extra["QL_CRASH_POINT"] = crash
        return self._spawn(name, ["worker"], config, env=extra, prefix=prefix, data_dir=d)

    def start_control(self, name: str = "control", *, limits: dict[str, Any] | None = None) -> Proc:
        config = self.control_config(limits=limits, name=name)
        return self._spawn(name, ["control"], config)

    def control_config(self, *, limits: dict[str, Any] | None = None, name: str = "control") -> Path:
        d = self.root / "control-data"
        d.mkdir(mode=0o700, exist_ok=True)
        return self.write_config(self.root / f"{name}.toml", profile="cluster-control", data_dir=d, limits=limits)

    def ql(self, *args: str, timeout: float = DEADLINE_S, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
        """A `ql` command on the control profile (submit, status, cancel, …)."""
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        full_env.update({"QL_CONFIG": str(self.control_config()), "HOME": str(self.root)})
        full_env.update(env or {})
        return run_ql(list(args), full_env, timeout=timeout)

    # -- the control side ---------------------------------------------------------------------------------
    @property
    def control(self) -> Any:
        if self._control_rt is None:
            from ql_core.config import load_config
            from ql_core.runtime import Runtime

            self._control_rt = Runtime.open(load_config(config_path=self.control_config(), environ={},
                                                        cwd=self.root))
        return self._control_rt

    @property
    def sql(self) -> Any:
        if self._sql is None:
            self._sql = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row)
        return self._sql

    def submit(self, command: list[str], *, shell: bool = False, retries: int = 0, timeout_s: float | None = None,
               env: dict[str, str] | None = None) -> str:
        return self.control.submit(command, shell=shell, max_attempts=retries + 1, timeout_s=timeout_s,
                                   env=env).run_id

    def run_row(self, run_id: str) -> dict[str, Any]:
        return self.sql.execute("SELECT * FROM ql_run WHERE id = %s", (run_id,)).fetchone()

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return self.sql.execute("SELECT * FROM ql_run_attempt WHERE run_id = %s ORDER BY attempt_no",
                                (run_id,)).fetchall()

    def lease(self, attempt_id: str) -> dict[str, Any] | None:
        return self.sql.execute("SELECT * FROM ql_attempt_lease WHERE attempt_id = %s", (attempt_id,)).fetchone()

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.sql.execute("SELECT * FROM ql_run_event WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall()

    def event_types(self, run_id: str) -> list[str]:
        return [e["type"] for e in self.events(run_id)]

    def status(self, run_id: str) -> str:
        return self.run_row(run_id)["status"]

    def wait_status(self, run_id: str, statuses: tuple[str, ...] = TERMINAL, *, timeout: float = DEADLINE_S
                    ) -> dict[str, Any]:
        return wait_for(lambda: (lambda r: r if r["status"] in statuses else None)(self.run_row(run_id)),
                        timeout=timeout, what=f"run {run_id} to be {'/'.join(statuses)}", diagnose=self.logs)

    def wait_attempt(self, run_id: str, statuses: tuple[str, ...] = ("running",), *, n: int = 1,
                     timeout: float = DEADLINE_S) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            rows = self.attempts(run_id)
            return rows[n - 1] if len(rows) >= n and rows[n - 1]["status"] in statuses else None

        return wait_for(found, timeout=timeout, what=f"attempt {n} of run {run_id} to be {statuses}",
                        diagnose=self.logs)

    def proxied_url(self, port: int) -> str:
        """This test's database through a proxy on ``port`` (no TLS: the proxy reads message bounds)."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.dsn)
        return f"postgresql://{parts.username}@127.0.0.1:{port}{parts.path}?sslmode=disable"

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    # -- the workers' local stores ---------------------------------------------------------------------------
    def local_rows(self, name: str, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        path = self.worker_dir(name) / "worker.db"
        if not path.exists():
            return []
        with closing(sqlite3.connect(path, timeout=30)) as conn:
            conn.row_factory = sqlite3.Row
            try:
                return [dict(r) for r in conn.execute(sql, params)]
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise

    def lease_rows(self, name: str) -> list[dict[str, Any]]:
        return self.local_rows(name, "SELECT * FROM ql_worker_lease ORDER BY claimed_at_ms")

    def local_attempt(self, name: str, attempt_id: str) -> dict[str, Any] | None:
        rows = self.local_rows(name, "SELECT * FROM ql_run_attempt WHERE id = ?", (attempt_id,))
        return rows[0] if rows else None

    # -- teardown -------------------------------------------------------------------------------------------
    def stop_all(self, timeout: float = 30.0) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)
                proc.wait(10)
        kill_local_tasks(self.worker_dirs.values())
        if self._control_rt is not None:
            self._control_rt.close()
            self._control_rt = None
        if self._sql is not None:
            self._sql.close()
            self._sql = None


def kill_local_tasks(data_dirs: Any) -> int:
    """SIGKILL every task a worker's local store still shows active (verified through its handle)."""
    from ql_executors.local_process.executor import LocalProcessExecutor

    executor, killed = LocalProcessExecutor(), 0
    for d in data_dirs:
        path = Path(d) / "worker.db"
        if not path.exists():
            continue
        with closing(sqlite3.connect(path, timeout=30)) as conn:
            try:
                rows = conn.execute("SELECT handle FROM ql_run_attempt WHERE status IN ('starting', 'running', "
                                    "'blocked') AND handle IS NOT NULL").fetchall()
            except sqlite3.OperationalError:  # killed before its schema was complete: it ran nothing
                continue
        for (handle,) in rows:
            if str(executor.signal(handle, signal.SIGKILL)) == "signalled":
                killed += 1
    return killed


def check_workers(h: Harness) -> None:
    """Across the workers' local stores and the control database: what every test must leave true.

    - an applied (or exactly replayed) completion carries the exit code the worker's own attempt row
      recorded — the control plane never invented one;
    - a control attempt that ended succeeded/failed has a worker-local attempt (same id) that ended
      with that exit code — no success without a receipt or a waited exit status;
    - a token is never in an event, and the local store never keeps one past its final answer.
    """
    terminal_control = {r["id"]: r for r in h.sql.execute(
        "SELECT a.id, a.status, a.exit_code, a.runtime_owner FROM ql_run_attempt a "
        "WHERE a.status IN ('succeeded', 'failed')").fetchall()}
    local: dict[str, dict[str, Any]] = {}
    for name in h.worker_dirs:
        for row in h.local_rows(name, "SELECT id, status, exit_code FROM ql_run_attempt"):
            local[row["id"]] = row
        for row in h.lease_rows(name):
            if row["state"] == "answered":
                assert row["lease_token"] is None, f"{name}: a token kept after its final answer"
    for attempt_id, row in terminal_control.items():
        mine = local.get(attempt_id)
        assert mine is not None, f"control attempt {attempt_id} ended {row['status']} without a worker attempt"
        assert mine["exit_code"] == row["exit_code"], (attempt_id, row, mine)
    tokens = [r["lease_token"] for name in h.worker_dirs for r in h.lease_rows(name) if r["lease_token"]]
    if tokens:
        dump = json.dumps(h.sql.execute("SELECT * FROM ql_run_event").fetchall(), default=str)
        assert not any(t in dump for t in tokens), "a lease token in an event"


def trigger_command(trigger: Path, exit_code: int = 0, *, max_s: int = 120) -> list[str]:
    """A task that waits (at most ``max_s``) for ``trigger`` to exist, then exits ``exit_code``."""
    loops = max_s * 20
    script = (f'i=0; while [ ! -e "{trigger}" ] && [ "$i" -lt {loops} ]; do sleep 0.05; i=$((i+1)); done; '
              f"exit {exit_code}")
    return ["sh", "-c", script]
