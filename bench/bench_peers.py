"""ql against the floor and against the tools a user would pick instead, in one run, as ratios.

    python bench/bench_peers.py [--quick] [--reps N] [--only tool,...] [--json FILE] [--no-install]

Run it from ql's own environment (``pip install -e '.[dev]'``). Every figure is measured in the
same run on the same machine and printed as a ratio to its floor (raw medians in parentheses),
followed by the performance goals with PASS/FAIL.

Variants ("tools")
------------------
floor          a plain Python host: ``subprocess.Popen(argv)`` + ``wait()``.
tsp            task-spooler (Debian ``task-spooler``), private ``TS_SOCKET``; a task is ``tsp -f CMD``
               (enqueue and wait in the foreground; exit status = the command's). Output files
               (the default) go to a private ``TMPDIR``.
nq             ``nq CMD`` then ``nq -w JOB``, private ``NQDIR`` (a fresh queue per measurement block:
               nq scans every earlier job file of its queue on each submit). nq runs one job of a
               queue at a time, so the N running tasks of the memory figure use N queues.
supervisord    generated config, unix socket, programs with ``autostart=false``, ``startsecs=0``,
               output to log files (the default); the host starts a program with XML-RPC
               ``startProcess`` and polls ``getProcessInfo`` every 1 ms until it is EXITED.
huey (tuned)   ``RedisHuey(blocking=True, notify_result=True)`` against the local Redis, consumer
               ``-k thread -w N -q -n``. Chosen because it is the fastest reasonable set-up: the
               worker takes a task with BRPOP (no poll interval), and ``result.get(blocking=True)``
               wakes on a BLPOP notification instead of huey's default backoff polling (first
               sleep 50 ms); thread workers are the lightest for tasks that only wait on a child.
               The task function is ``subprocess.call(argv)``.
procrastinate  PostgreSQL (a private database, dropped at the end), ``procrastinate worker -c N``
               (LISTEN/NOTIFY). The task is ``asyncio.create_subprocess_exec(*argv)`` + ``wait()``;
               procrastinate has no result API, so the host polls ``job_manager.get_job_status``
               every 1 ms until the job is finished.
ql embedded    one Python host using ql's public API: ``Runtime.open(load_config(...))``,
               ``rt.submit(argv, awaited=True)``, ``rt.wait(sub)`` (see ``QlApi``: every ql call is
               there; the recovery host submits without ``awaited``: it never waits).
ql run         the ``ql`` command, one process per task: ``ql --data-dir D run -- CMD``.

The task is the same command for every variant: ``true`` (throughput), the ``stamp`` helper
(latencies; a tiny C program compiled with gcc into the temp dir at start, or ``date +%s%N`` in
a shell script when gcc is absent) or ``sleep 60`` (memory).

Figures (defined identically for every variant)
-----------------------------------------------
short tasks/s, 1 in flight
    Tasks ``true`` submitted one after another, each waited for until the tool reports it done
    before the next is submitted, in a loop of ``--window`` seconds (at least a few tasks, one
    warm-up task not counted). Rate = tasks / elapsed. Ratio: tool / floor.
submit → exec
    From ``time.time_ns()`` just before the submit call (or the client command's spawn) to the
    first instruction of the task: the stamp helper reads CLOCK_REALTIME (ns) on entry. Median
    of the samples. Ratio: tool / floor.
task exit → terminal state (added ms)
    From the task's own last CLOCK_REALTIME timestamp before it exits to the moment the tool
    reports it done, as the host sees it (``wait()`` returns / the foreground client exits /
    ``nq -w`` returns / the polled status says finished / the result is available), minus the
    same median for the floor (``Popen.wait()`` returning).
status query, whole process
    Wall time of one whole process that asks for one finished task's state: floor = ``python3
    -c`` opening a SQLite file and running one ``SELECT`` by primary key; ``tsp -s ID``,
    ``nq -t JOB``, ``supervisorctl status NAME``, ``ql status RUN_ID``. Ratio: tool / floor.
    Also ``python3 -c pass``, ``ql list``, ``ql events RUN_ID`` and ``ql run -- true``
    (whole process) for the goals. The task queried finished just before (a new one each
    repetition); the commands run ``--status-n`` times each, interleaved, after one untimed
    pass in the first repetition (not with ``--quick``). Bytecode caches are used as in a
    normal install (``PYTHONDONTWRITEBYTECODE`` is unset for the processes the bench starts).
memory kept alive per running task (PSS)
    (Sum of ``Pss`` from ``/proc/PID/smaps_rollup`` of every process the tool keeps alive while
    N ``sleep 60`` tasks run, minus the same sum with the tool idle just before) / N, N =
    ``--tasks`` (20). The sleeps themselves are excluded. A process belongs to a tool when it
    carries the bench's per-tool environment marker, or descends from a process that does (so
    daemons, per-task runners and launchers count — a ql standby launcher runs with an empty
    environment); the host program is counted only where it *is* the tool (floor, ql embedded), not
    where it is only a client (tsp, nq, supervisorctl/XML-RPC, huey, procrastinate). The Redis
    and PostgreSQL servers are shared services and are not counted. For ``ql run`` the idle
    footprint is 0 (nothing stays up without a task), so the figure is the PSS of each waiting
    ``ql run`` and its launcher. PSS splits shared pages among every process mapping them.
one waiting ``ql run`` (goal)
    PSS of the ``ql run`` process + its launcher while it waits for ``sleep 60``, alone.
50-task host (goal)
    Total PSS (not a difference) of the host and every process it keeps per task, excluding the
    ``sleep``s, with 50 running ``sleep 60`` tasks: ql embedded host vs the floor's Popen host.
recovery after host death, attempts/s
    A ql host submits N ``true`` tasks (``--recovery-n``, 1000; ``--quick`` 200) and is
    SIGKILLed right after its last submit; once every launcher has exited (each publishes its
    receipt before exiting) a fresh process opens a ``Runtime`` and the call ``rt.reconcile()``
    is timed: N / its duration (the whole process, start-up included, is printed too). Floor:
    a sqlite3 loop (WAL, ``synchronous=FULL``, like ql) of ``UPDATE`` one row + ``COMMIT`` +
    ``unlink`` of a small file + ``fsync`` of its directory, N times, on the same file system.

Method: every variant runs in its own agent process (ql's interpreter, or the peers' venv for
supervisor, huey and procrastinate); each repetition runs every figure block over all variants
round-robin (the order rotates with the repetition); a repetition yields one value per variant
and figure (a rate, or the median of that repetition's samples); the table shows the median over
repetitions. The machine's load average is printed at start and end.

supervisor, huey and procrastinate are installed (pinned) into a private venv
(``bench/.peers-venv``, git-ignored) on first use; task-spooler and nq with ``apt-get`` when
missing and running as root. A variant that cannot be installed or started is skipped with a
one-line reason. Everything the run starts carries an environment marker; at the end (also on
Ctrl-C) the bench stops the services, drops its database and Redis keys, kills what is left of
its own processes by pid and removes its temp dir. The run sits under a small child-subreaper
parent so the orphans that daemons leave behind are reaped.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import select
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
MARK = "BENCH_PEERS_MARK"           # env marker "<run token>:<tool>" on every process the bench starts
CTX_ENV = "BENCH_PEERS_CTX"         # JSON context handed to agents
REAPED_ENV = "BENCH_PEERS_REAPED"
PEER_GROUPS = {                     # pinned, so before/after runs compare the same peers
    "supervisord": ["supervisor==4.3.0"],
    "huey": ["huey==3.5.4", "redis==8.1.0"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]==3.3.9"],
}
PEER_IMPORTS = {"supervisord": "supervisor", "huey": "huey, redis", "procrastinate": "procrastinate, psycopg"}
TOOLS = ["floor", "tsp", "nq", "supervisord", "huey", "procrastinate", "ql", "ql-run"]
PEERS = ["tsp", "nq", "supervisord", "huey", "procrastinate"]
HOSTS = {"floor", "ql"}             # the agent process is the tool's host and is counted in its memory
POLL_S = 0.001                      # poll interval of hosts that must poll (supervisord, procrastinate)


# =============================================================================================
# ql's surface: every call the bench makes into ql is here (a later API change is a one-line fix)
# =============================================================================================

class QlApi:
    """The embedded host: ``Runtime`` opened on ``data_dir`` with no config file or environment."""

    def __init__(self, data_dir: Path) -> None:
        from ql_core.config import load_config
        from ql_core.runtime import Runtime

        data_dir.mkdir(parents=True, exist_ok=True)
        self.rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
        import inspect

        # A host that waits for its tasks says so (acknowledged completion); older trees lack it.
        self._awaited = "awaited" in inspect.signature(self.rt.submit).parameters

    def submit(self, argv: list[str], *, awaited: bool = False) -> Any:
        if awaited and self._awaited:
            return self.rt.submit(argv, awaited=True)
        return self.rt.submit(argv)

    def run_id(self, sub: Any) -> str:
        return sub.run_id

    def wait(self, sub: Any) -> tuple[str, int | None]:
        view = self.rt.wait(sub)
        return view.status, view.exit_code

    def status(self, run_id: str) -> tuple[str, int | None]:
        view = self.rt.status(run_id)
        return view.status, view.exit_code

    def reconcile(self) -> dict[str, int]:
        return dict(self.rt.reconcile())

    def close(self) -> None:
        self.rt.close()


QL_SUCCEEDED = "succeeded"
QL_TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "lost"}


def ql_command() -> list[str]:
    """The ``ql`` console script of this interpreter's environment (else ``python -m``)."""
    script = Path(sys.executable).parent / "ql"
    if script.exists():
        return [str(script)]
    found = shutil.which("ql")
    return [found] if found else [sys.executable, "-m", "ql_core.cli.main"]


def ql_cli(data_dir: Path | str, *args: str) -> list[str]:
    return [*ql_command(), "--data-dir", str(data_dir), *args]


def ql_cli_env() -> dict[str, str]:
    """No QL_* variable of the caller leaks in (the data dir is given with --data-dir)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("QL_")}


def ql_first_run_id(stdout: str) -> str:
    """``ql --json run ...`` prints one JSON object per line; the first names the run."""
    for raw in stdout.splitlines():
        line = raw.strip()
        if line.startswith("{"):
            return json.loads(line)["run_id"]
    raise RuntimeError(f"no run id in ql output: {stdout[:200]!r}")


# =============================================================================================
# small helpers (stdlib only: this file also runs inside the peers' venv)
# =============================================================================================

def one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def now_ns() -> int:
    return time.time_ns()


def read_stamp(path: str) -> tuple[int, int]:
    """(first, last) CLOCK_REALTIME ns the task recorded; the date fallback writes one value."""
    parts = Path(path).read_text().split()
    if not parts:
        raise RuntimeError(f"empty stamp file {path}")
    return int(parts[0]), int(parts[-1])


def poll_until(check: Callable[[], Any], timeout: float, what: str, interval: float = POLL_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def run_checked(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120,
                capture: bool = False, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv[:4])} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return proc


def proc_table() -> dict[int, dict[str, Any]]:
    """pid -> {ppid, comm, state, mark} for every process (mark = our env marker or None)."""
    table: dict[int, dict[str, Any]] = {}
    needle = MARK.encode() + b"="
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
        fields = stat[stat.rindex(b")") + 2:].split()
        mark = None
        for item in environ.split(b"\0"):
            if item.startswith(needle):
                mark = item[len(needle):].decode(errors="replace")
                break
        table[pid] = {"ppid": int(fields[1]), "state": fields[0].decode(), "comm": comm, "mark": mark}
    # A process without the marker belongs to the tool of its nearest marked ancestor: a ql standby
    # launcher runs with an empty environment (its task must not read its host's), yet is ql's.
    inherited: dict[int, str | None] = {}
    for pid in table:
        chain, cur, mark = [], pid, None
        while cur in table and cur not in inherited and len(chain) < 64:
            if table[cur]["mark"] is not None:
                mark = table[cur]["mark"]
                break
            chain.append(cur)
            cur = table[cur]["ppid"]
        else:
            mark = inherited.get(cur)
        for member in chain:
            inherited[member] = mark
    for pid, info in table.items():
        if info["mark"] is None:
            info["mark"] = inherited.get(pid)
    return table


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def is_task_command(info: dict[str, Any]) -> bool:
    return info["comm"] == "sleep"


# =============================================================================================
# agents: one process per variant, driven over a line-based JSON protocol on stdin/stdout
# =============================================================================================

class Driver:
    """One variant, as its host program drives it. Subclasses implement the task primitives."""

    tool = ""

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.ctx = ctx
        self.work = Path(ctx["work"]) / self.tool
        self.work.mkdir(parents=True, exist_ok=True)
        self.true = ctx["true"]
        self.stamp = ctx["stamp"]
        self.sleep = ctx["sleep"]
        self.n_mem = ctx["tasks"]

    # -- primitives -------------------------------------------------------------------
    def setup(self) -> dict[str, Any]:
        return {}

    def run_true(self) -> None:
        raise NotImplementedError

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        """Submit the stamp task, wait until the tool reports it done: (t_submit, t_done, stamp path)."""
        raise NotImplementedError

    def mem_start(self, n: int) -> None:
        raise NotImplementedError

    def mem_stop(self) -> None:
        raise NotImplementedError

    def status_commands(self) -> dict[str, dict[str, Any]]:
        return {}

    def teardown(self) -> None:
        pass

    # -- ops --------------------------------------------------------------------------
    def op_setup(self) -> dict[str, Any]:
        info = self.setup()
        self.run_true()  # the tool works end to end
        return {"pid": os.getpid(), **info}

    def op_throughput(self, seconds: float, min_tasks: int) -> dict[str, Any]:
        self.run_true()  # warm-up, not counted
        count = 0
        start = time.perf_counter()
        while True:
            self.run_true()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and count >= min_tasks:
                return {"rate": count / elapsed, "tasks": count, "elapsed_s": elapsed}

    def op_latency(self, n: int, stamp_dir: str) -> dict[str, Any]:
        samples = []
        for i in range(n):
            path = os.path.join(stamp_dir, f"{self.tool}-{os.getpid()}-{i}")
            t_submit, t_done, used = self.run_stamp(path)
            first, last = read_stamp(used)
            samples.append({"submit_exec_ms": (first - t_submit) / 1e6, "exit_terminal_ms": (t_done - last) / 1e6})
            with contextlib.suppress(OSError):
                os.unlink(used)
        return {"samples": samples}

    def op_mem_start(self, n: int) -> dict[str, Any]:
        self.mem_start(n)
        return {}

    def op_mem_stop(self) -> dict[str, Any]:
        self.mem_stop()
        return {}

    def op_status_commands(self) -> dict[str, Any]:
        return self.status_commands()

    def op_teardown(self) -> dict[str, Any]:
        self.teardown()
        return {}


class FloorDriver(Driver):
    tool = "floor"

    def setup(self) -> dict[str, Any]:
        self.procs: list[subprocess.Popen[bytes]] = []
        return {}

    def run_true(self) -> None:
        if subprocess.Popen([self.true]).wait() != 0:
            raise RuntimeError("true failed")

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        proc = subprocess.Popen([self.stamp, path])
        proc.wait()
        return t0, now_ns(), path

    def mem_start(self, n: int) -> None:
        self.procs += [subprocess.Popen([self.sleep, "60"]) for _ in range(n)]

    def mem_stop(self) -> None:
        for proc in self.procs:
            proc.wait(timeout=60)
        self.procs = []

    def op_recovery_floor(self, n: int, directory: str) -> dict[str, Any]:
        """N x (UPDATE one row + COMMIT, WAL + synchronous=FULL; unlink a small file; fsync its dir)."""
        root = Path(directory)
        files = root / "files"
        files.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(root / "floor.db", isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, status TEXT, exit_code INTEGER, version INTEGER)")
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO t (status, version) VALUES ('running', 1)", [()] * n)
            conn.execute("COMMIT")
            for i in range(n):
                (files / f"{i}.json").write_bytes(b'{"exit_code": 0}')
            dir_fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY)
            try:
                start = time.perf_counter()
                for i in range(n):
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("UPDATE t SET status='succeeded', exit_code=0, version=version+1 "
                                 "WHERE id=? AND version=1", (i + 1,))
                    conn.execute("COMMIT")
                    os.unlink(f"{i}.json", dir_fd=dir_fd)
                    os.fsync(dir_fd)
                elapsed = time.perf_counter() - start
            finally:
                os.close(dir_fd)
        finally:
            conn.close()
        shutil.rmtree(root, ignore_errors=True)
        return {"rate": n / elapsed, "elapsed_s": elapsed, "n": n}


class TspDriver(Driver):
    tool = "tsp"

    def setup(self) -> dict[str, Any]:
        self.bin = shutil.which("tsp")
        if not self.bin:
            raise RuntimeError("tsp not found")
        out = self.work / "out"
        out.mkdir(exist_ok=True)
        self.env = dict(os.environ, TS_SOCKET=str(self.work / "socket"), TMPDIR=str(out))
        self.ids: list[str] = []
        version = subprocess.run([self.bin, "-V"], env=self.env, capture_output=True, text=True)
        return {"version": (version.stdout + version.stderr).strip().splitlines()[0]}

    def run_true(self) -> None:
        run_checked([self.bin, "-f", self.true], env=self.env)

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        run_checked([self.bin, "-f", self.stamp, path], env=self.env)
        return t0, now_ns(), path

    def mem_start(self, n: int) -> None:
        run_checked([self.bin, "-S", str(len(self.ids) + n)], env=self.env)
        for _ in range(n):
            self.ids.append(run_checked([self.bin, self.sleep, "60"], env=self.env, capture=True).stdout.strip())

    def mem_stop(self) -> None:
        for job in self.ids:
            run_checked([self.bin, "-w", job], env=self.env, ok=tuple(range(256)))
        self.ids = []
        run_checked([self.bin, "-S", "1"], env=self.env)

    def status_commands(self) -> dict[str, dict[str, Any]]:
        job = run_checked([self.bin, self.true], env=self.env, capture=True).stdout.strip()
        run_checked([self.bin, "-w", job], env=self.env)
        return {"tsp -s ID": {"argv": [self.bin, "-s", job], "env": {"TS_SOCKET": self.env["TS_SOCKET"]}}}

    def teardown(self) -> None:
        subprocess.run([self.bin, "-K"], env=self.env, capture_output=True, timeout=30)


class NqDriver(Driver):
    tool = "nq"

    def setup(self) -> dict[str, Any]:
        self.bin = shutil.which("nq")
        if not self.bin:
            raise RuntimeError("nq not found")
        self.queues = 0
        self.jobs: list[tuple[dict[str, str], str]] = []
        self.new_queue()
        return {}

    def new_queue(self) -> dict[str, str]:
        self.queues += 1
        qdir = self.work / f"q{self.queues}"
        qdir.mkdir()
        self.env = dict(os.environ, NQDIR=str(qdir))
        return self.env

    def submit_wait(self, argv: list[str]) -> None:
        job = run_checked([self.bin, *argv], env=self.env, capture=True).stdout.strip()
        run_checked([self.bin, "-w", job], env=self.env)

    def run_true(self) -> None:
        self.submit_wait([self.true])

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        self.submit_wait([self.stamp, path])
        return t0, now_ns(), path

    def op_throughput(self, seconds: float, min_tasks: int) -> dict[str, Any]:
        self.new_queue()
        return super().op_throughput(seconds, min_tasks)

    def op_latency(self, n: int, stamp_dir: str) -> dict[str, Any]:
        self.new_queue()
        return super().op_latency(n, stamp_dir)

    def mem_start(self, n: int) -> None:
        for _ in range(n):  # one queue per task: a queue runs its jobs one at a time
            env = self.new_queue()
            self.jobs.append((env, run_checked([self.bin, self.sleep, "60"], env=env, capture=True).stdout.strip()))

    def mem_stop(self) -> None:
        for env, job in self.jobs:
            run_checked([self.bin, "-w", job], env=env)
        self.jobs = []
        self.new_queue()

    def status_commands(self) -> dict[str, dict[str, Any]]:
        env = self.new_queue()
        job = run_checked([self.bin, self.true], env=env, capture=True).stdout.strip()
        run_checked([self.bin, "-w", job], env=env)
        return {"nq -t JOB": {"argv": [self.bin, "-t", job], "env": {"NQDIR": env["NQDIR"]}}}


SUPERVISOR_CONF = """\
[unix_http_server]
file={sock}

[supervisord]
logfile={d}/supervisord.log
pidfile={d}/supervisord.pid
childlogdir={d}/logs
nodaemon=true
loglevel=warn

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{sock}

[program:true]
command={true}
autostart=false
autorestart=false
startsecs=0
startretries=0

[program:stamp]
command={stamp} {d}/stamp.out
autostart=false
autorestart=false
startsecs=0
startretries=0

[program:sleep]
command={sleep} 60
process_name=%(program_name)s_%(process_num)02d
numprocs={n}
autostart=false
autorestart=false
startsecs=0
startretries=0
"""


class SupervisordDriver(Driver):
    tool = "supervisord"

    def setup(self) -> dict[str, Any]:
        import xmlrpc.client

        import supervisor
        from supervisor.xmlrpc import SupervisorTransport

        d = self.work
        (d / "logs").mkdir(exist_ok=True)
        self.sock = str(d / "supervisor.sock")
        self.conf = str(d / "supervisord.conf")
        for value in (str(d), self.true, self.stamp, self.sleep):
            if "%" in value:
                raise RuntimeError(f"path {value!r} contains '%' (supervisor expands it)")
        Path(self.conf).write_text(SUPERVISOR_CONF.format(sock=self.sock, d=d, true=self.true, stamp=self.stamp,
                                                          sleep=self.sleep, n=max(self.n_mem, 50)))
        bindir = Path(sys.executable).parent
        self.log = open(d / "supervisord.out", "wb")
        self.proc = subprocess.Popen([str(bindir / "supervisord"), "-c", self.conf], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        self.ctl = str(bindir / "supervisorctl")

        def proxy() -> Any:
            return xmlrpc.client.ServerProxy(
                "http://127.0.0.1", transport=SupervisorTransport(None, None, serverurl="unix://" + self.sock))

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"supervisord exited {self.proc.returncode}")
            try:
                return proxy().supervisor.getState()["statename"] == "RUNNING"
            except (OSError, xmlrpc.client.Error):
                return False

        poll_until(ready, 30, "supervisord", interval=0.05)
        self.rpc = proxy()  # one connection for the whole run, as a host would keep it
        self.started = 0
        return {"version": supervisor.__version__ if hasattr(supervisor, "__version__")
                else self.rpc.supervisor.getSupervisorVersion()}

    def start_wait(self, name: str) -> None:
        self.rpc.supervisor.startProcess(name, False)

        def exited() -> dict[str, Any] | None:
            info = self.rpc.supervisor.getProcessInfo(name)
            return info if info["statename"] in ("EXITED", "FATAL", "STOPPED") else None

        info = poll_until(exited, 60, f"supervisor program {name}")
        if info["statename"] != "EXITED" or info["exitstatus"] != 0:
            raise RuntimeError(f"{name}: {info['statename']} exit {info['exitstatus']}")

    def run_true(self) -> None:
        self.start_wait("true")

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        used = str(self.work / "stamp.out")
        with contextlib.suppress(OSError):
            os.unlink(used)
        t0 = now_ns()
        self.start_wait("stamp")
        return t0, now_ns(), used

    def mem_start(self, n: int) -> None:
        for i in range(self.started, self.started + n):
            self.rpc.supervisor.startProcess(f"sleep:sleep_{i:02d}", False)
        self.started += n

    def mem_stop(self) -> None:
        def all_down() -> bool:
            return all(p["statename"] != "RUNNING" and p["statename"] != "STARTING"
                       for p in self.rpc.supervisor.getAllProcessInfo() if p["group"] == "sleep")

        poll_until(all_down, 60, "the sleep programs to exit", interval=0.05)
        self.started = 0

    def status_commands(self) -> dict[str, dict[str, Any]]:
        return {"supervisorctl status": {"argv": [self.ctl, "-c", self.conf, "status", "true"], "env": {},
                                         "ok": list(range(256))}}

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            self.rpc.supervisor.shutdown()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


HUEY_MODULE = """\
import os, subprocess
from huey import RedisHuey

huey = RedisHuey(os.environ["BENCH_PEERS_HUEY_NAME"], host=os.environ["BENCH_PEERS_REDIS_HOST"],
                 port=int(os.environ["BENCH_PEERS_REDIS_PORT"]), blocking=True, notify_result=True)


@huey.task()
def run(argv):
    return subprocess.call(argv)
"""


class HueyDriver(Driver):
    tool = "huey"

    def setup(self) -> dict[str, Any]:
        import huey as huey_pkg
        import redis

        host, port = self.ctx["redis"].rsplit(":", 1)
        try:
            redis.Redis(host=host, port=int(port), socket_connect_timeout=3).ping()
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"Redis at {self.ctx['redis']} not reachable ({type(exc).__name__})") from None
        os.environ.update(BENCH_PEERS_HUEY_NAME="qlbench" + self.ctx["token"], BENCH_PEERS_REDIS_HOST=host,
                          BENCH_PEERS_REDIS_PORT=port)
        mod_dir = self.work / "mod"
        mod_dir.mkdir(exist_ok=True)
        (mod_dir / "ql_bench_huey.py").write_text(HUEY_MODULE)
        sys.path.insert(0, str(mod_dir))
        env = dict(os.environ, PYTHONPATH=str(mod_dir))
        self.log = open(self.work / "consumer.log", "wb")
        consumer = Path(sys.executable).parent / "huey_consumer"
        workers = str(max(self.n_mem, 1))  # thread workers: N tasks run at once
        self.proc = subprocess.Popen([str(consumer), "ql_bench_huey.huey", "-k", "thread", "-w", workers, "-q", "-n"],
                                     env=env, cwd=mod_dir, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, start_new_session=True)
        import ql_bench_huey  # noqa: PLC0415

        self.mod = ql_bench_huey
        self.results: list[Any] = []
        if self.mod.run([self.true]).get(blocking=True, timeout=30) is None:
            raise RuntimeError("the huey consumer did not answer")
        return {"version": huey_pkg.__version__}

    def run_true(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"huey consumer exited {self.proc.returncode}")
        if self.mod.run([self.true]).get(blocking=True, timeout=60) != 0:
            raise RuntimeError("true failed")

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        self.mod.run([self.stamp, path]).get(blocking=True, timeout=60)
        return t0, now_ns(), path

    def mem_start(self, n: int) -> None:
        self.results += [self.mod.run([self.sleep, "60"]) for _ in range(n)]

    def mem_stop(self) -> None:
        for result in self.results:
            result.get(blocking=True, timeout=60)
        self.results = []

    def teardown(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # graceful
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(Exception):
            self.mod.huey.flush()
            conn = self.mod.huey.storage.conn
            for key in conn.scan_iter(match=f"huey.*{os.environ['BENCH_PEERS_HUEY_NAME']}*"):
                conn.delete(key)


PROCRASTINATE_MODULE = """\
import asyncio, os
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_PEERS_PG_DSN"]))


@app.task(name="run")
async def run(argv):
    proc = await asyncio.create_subprocess_exec(*argv)
    status = await proc.wait()
    if status != 0:
        raise RuntimeError(f"exit status {status}")
"""


class ProcrastinateDriver(Driver):
    tool = "procrastinate"

    def setup(self) -> dict[str, Any]:
        import psycopg

        import procrastinate

        from urllib.parse import urlsplit, urlunsplit

        self.admin_dsn = self.ctx["pg_dsn"]
        self.dbname = "qlbench_" + self.ctx["token"]
        try:
            with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'CREATE DATABASE "{self.dbname}"')
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"PostgreSQL at {self.admin_dsn}: {type(exc).__name__}: "
                               f"{str(exc).strip()[:120]}") from None
        self.created = True
        parts = urlsplit(self.admin_dsn)
        dsn = urlunsplit(parts._replace(path="/" + self.dbname))
        mod_dir = self.work / "mod"
        mod_dir.mkdir(exist_ok=True)
        (mod_dir / "ql_bench_procrastinate.py").write_text(PROCRASTINATE_MODULE)
        os.environ["BENCH_PEERS_PG_DSN"] = dsn
        sys.path.insert(0, str(mod_dir))
        env = dict(os.environ, PYTHONPATH=str(mod_dir))
        cli = str(Path(sys.executable).parent / "procrastinate")
        app_arg = ["--app", "ql_bench_procrastinate.app"]
        run_checked([cli, *app_arg, "schema", "--apply"], env=env, timeout=120)
        self.log = open(self.work / "worker.log", "wb")
        self.proc = subprocess.Popen([cli, "--log-level", "warning", *app_arg, "worker", "--concurrency",
                                      str(max(self.n_mem, 1))], env=env, cwd=mod_dir, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        import ql_bench_procrastinate  # noqa: PLC0415

        self.mod = ql_bench_procrastinate
        self.app = self.mod.app
        self.app.open()
        self.jobs: list[int] = []
        return {"version": getattr(procrastinate, "__version__", "?")}

    def wait_job(self, job_id: int, timeout: float = 60) -> str:
        def finished() -> str | None:
            status = self.app.job_manager.get_job_status(job_id).value
            return status if status not in ("todo", "doing") else None

        return poll_until(finished, timeout, f"procrastinate job {job_id}")

    def run_true(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"procrastinate worker exited {self.proc.returncode}")
        status = self.wait_job(self.mod.run.defer(argv=[self.true]))
        if status != "succeeded":
            raise RuntimeError(f"job {status}")

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        self.wait_job(self.mod.run.defer(argv=[self.stamp, path]))
        return t0, now_ns(), path

    def mem_start(self, n: int) -> None:
        self.jobs += [self.mod.run.defer(argv=[self.sleep, "60"]) for _ in range(n)]

    def mem_stop(self) -> None:
        for job in self.jobs:
            self.wait_job(job)
        self.jobs = []

    def teardown(self) -> None:
        import psycopg

        if getattr(self, "proc", None) is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(Exception):
            self.app.close()
        if getattr(self, "created", False):
            with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


class QlEmbeddedDriver(Driver):
    tool = "ql"

    def setup(self) -> dict[str, Any]:
        self.api = QlApi(self.work / "data")
        self.subs: list[Any] = []
        import ql_core

        return {"version": getattr(ql_core, "__version__", "?")}

    def submit_wait(self, argv: list[str]) -> tuple[str, int | None]:
        return self.api.wait(self.api.submit(argv, awaited=True))

    def run_true(self) -> None:
        status, code = self.submit_wait([self.true])
        if status != QL_SUCCEEDED:
            raise RuntimeError(f"ql run ended {status} ({code})")

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        self.submit_wait([self.stamp, path])
        return t0, now_ns(), path

    def mem_start(self, n: int) -> None:
        self.subs += [self.api.submit([self.sleep, "60"], awaited=True) for _ in range(n)]

    def mem_stop(self) -> None:
        for sub in self.subs:
            self.api.wait(sub)
        self.subs = []

    def teardown(self) -> None:
        self.api.close()


class QlRunDriver(Driver):
    tool = "ql-run"

    def setup(self) -> dict[str, Any]:
        self.data = self.work / "data"
        self.env = ql_cli_env()
        self.procs: list[subprocess.Popen[bytes]] = []
        return {"command": " ".join(ql_command())}

    def run_true(self) -> None:
        run_checked(ql_cli(self.data, "run", "--", self.true), env=self.env)

    def run_stamp(self, path: str) -> tuple[int, int, str]:
        t0 = now_ns()
        run_checked(ql_cli(self.data, "run", "--", self.stamp, path), env=self.env)
        return t0, now_ns(), path

    def mem_start(self, n: int) -> None:
        self.procs += [subprocess.Popen(ql_cli(self.data, "run", "--", self.sleep, "60"), env=self.env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL) for _ in range(n)]

    def mem_stop(self) -> None:
        for proc in self.procs:
            proc.wait(timeout=60)
        self.procs = []

    def status_commands(self) -> dict[str, dict[str, Any]]:
        out = run_checked(ql_cli(self.data, "--json", "run", "--", self.true), env=self.env, capture=True).stdout
        run_id = ql_first_run_id(out)
        return {
            "ql status": {"argv": ql_cli(self.data, "status", run_id), "env": {}, "ql": True},
            "ql list": {"argv": ql_cli(self.data, "list"), "env": {}, "ql": True},
            "ql events": {"argv": ql_cli(self.data, "events", run_id), "env": {}, "ql": True},
            "ql run -- true": {"argv": ql_cli(self.data, "run", "--", self.true), "env": {}, "ql": True},
        }


DRIVERS: dict[str, type[Driver]] = {d.tool: d for d in (FloorDriver, TspDriver, NqDriver, SupervisordDriver,
                                                        HueyDriver, ProcrastinateDriver, QlEmbeddedDriver,
                                                        QlRunDriver)}


def agent_main(tool: str) -> int:
    """Serve one variant: read {"op": ...} lines, answer {"ok": ..., "result"|"error": ...} lines."""
    os.setpgid(0, 0)  # Ctrl-C at the terminal reaches the coordinator only; it tells us to stop
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # tasks inherit neither end of the protocol
    os.dup2(devnull, 1)
    ctx = json.loads(os.environ[CTX_ENV])
    driver = DRIVERS[tool](ctx)
    for line in proto_in:
        request = json.loads(line)
        op = request.pop("op")
        try:
            reply = {"ok": True, "result": getattr(driver, "op_" + op)(**request)}
        except BaseException as exc:  # noqa: BLE001 - report, keep serving
            tb = traceback.format_exc(limit=3)
            sys.stderr.write(tb)
            sys.stderr.flush()
            reply = {"ok": False, "error": one_line(f"{type(exc).__name__}: {exc}", 300)}
        proto_out.write(json.dumps(reply) + "\n")
        if op == "teardown":
            break
    return 0


def dead_host_main(data_dir: str, n: int) -> int:
    """Recovery set-up: submit N `true` tasks, say so, then wait to be SIGKILLed (never wait()s)."""
    api = QlApi(Path(data_dir))
    ctx = json.loads(os.environ[CTX_ENV])
    run_ids = [api.run_id(api.submit([ctx["true"]])) for _ in range(n)]
    Path(data_dir, "bench-run-ids.json").write_text(json.dumps(run_ids))
    sys.stdout.write("submitted\n")
    sys.stdout.flush()
    time.sleep(3600)
    return 0


def recover_main(data_dir: str, n: int) -> int:
    """Recovery measurement: a fresh process opens the runtime and runs one reconcile pass."""
    t0 = time.perf_counter()
    api = QlApi(Path(data_dir))
    t1 = time.perf_counter()
    counts = api.reconcile()
    t2 = time.perf_counter()
    run_ids = json.loads(Path(data_dir, "bench-run-ids.json").read_text())
    step = max(1, len(run_ids) // 25)
    states = [api.status(r) for r in run_ids[::step]]
    api.close()
    print(json.dumps({"open_s": t1 - t0, "reconcile_s": t2 - t1, "counts": counts,
                      "sampled": len(states), "sampled_succeeded": sum(s == QL_SUCCEEDED for s, _ in states)}))
    return 0


# =============================================================================================
# coordinator
# =============================================================================================

class AgentError(Exception):
    pass


class Agent:
    def __init__(self, tool: str, python: str, env: dict[str, str], work: Path) -> None:
        self.tool = tool
        self.log_path = work / f"agent-{tool}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--agent", tool], env=env, cwd=work,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self.buf = b""
        self.outstanding = 0  # requests sent whose reply was not read (an interrupted or timed-out call)
        self.pid = self.proc.pid

    def log_tail(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def call(self, op: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps({"op": op, **kwargs}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise AgentError(f"{op}: agent gone ({exc.strerror}) {self.log_tail()}") from None
        self.outstanding += 1
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:  # replies come in order: skip those of earlier, abandoned calls
            while b"\n" not in self.buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AgentError(f"{op}: no answer within {timeout:.0f} s")
                ready, _, _ = select.select([fd], [], [], remaining)
                if ready:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        raise AgentError(f"{op}: agent exited ({self.proc.wait()}) {self.log_tail()}")
                    self.buf += chunk
            line, _, self.buf = self.buf.partition(b"\n")
            self.outstanding -= 1
            if self.outstanding == 0:
                break
        reply = json.loads(line)
        if not reply["ok"]:
            raise AgentError(reply["error"])
        return reply["result"]

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.poll() is None:
                self.call("teardown", timeout=60)
        with contextlib.suppress(Exception):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.token = f"{os.getpid()}{os.urandom(3).hex()}"
        self.work = Path(tempfile.mkdtemp(prefix="ql-bench-peers-", dir=args.dir))
        self.agents: dict[str, Agent] = {}
        self.skipped: dict[str, str] = {}
        self.info: dict[str, Any] = {}
        self.values: dict[str, dict[str, list[Any]]] = {}   # figure -> tool -> per-rep value
        self.samples: dict[str, dict[str, list[Any]]] = {}  # figure -> tool -> per-rep raw samples
        self.errors: list[str] = []
        self.peers_python: str | None = None
        self.started_tools: set[str] = set()
        self.timings: dict[str, dict[str, list[float]]] = {}  # block -> tool -> seconds per repetition

    # -- bookkeeping ----------------------------------------------------------------------
    def record(self, figure: str, tool: str, value: Any, raw: Any = None) -> None:
        self.values.setdefault(figure, {}).setdefault(tool, []).append(value)
        self.samples.setdefault(figure, {}).setdefault(tool, []).append(raw if raw is not None else value)

    def median(self, figure: str, tool: str) -> float | None:
        vals = [v for v in self.values.get(figure, {}).get(tool, []) if v is not None]
        return statistics.median(vals) if vals else None

    def note(self, text: str) -> None:
        print(text, flush=True)

    def fail(self, tool: str, what: str, exc: BaseException) -> None:
        msg = f"{tool}: {what} failed: {exc}"
        self.errors.append(msg)
        self.note(f"  ! {msg}")
        agent = self.agents.get(tool)
        if agent is not None and (agent.proc.poll() is not None or "no answer within" in str(exc)):
            self.skipped[tool] = one_line(f"agent lost during {what}: {exc}")
            self.agents.pop(tool)
            agent.proc.kill()
            agent.stop()

    def marked_env(self, tool: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_") and k != REAPED_ENV}
        env[MARK] = f"{self.token}:{tool}"
        env.update(extra or {})
        return env

    def rotated(self, items: list[str], rep: int) -> list[str]:
        if not items:
            return items
        k = rep % len(items)
        return items[k:] + items[:k]

    # -- set-up -------------------------------------------------------------------------------
    def build_stamp(self) -> None:
        bindir = self.work / "bin"
        bindir.mkdir()
        gcc = shutil.which("gcc") or shutil.which("cc")
        if gcc:
            src = bindir / "stamp.c"
            src.write_text(STAMP_C)
            proc = subprocess.run([gcc, "-O2", "-o", str(bindir / "stamp"), str(src)], capture_output=True, text=True)
            if proc.returncode == 0:
                self.stamp, self.info["stamp"] = str(bindir / "stamp"), f"C helper compiled with {gcc}"
                return
            self.note(f"gcc failed ({proc.stderr.strip()[:100]}); stamp falls back to date +%s%N")
        script = bindir / "stamp"
        script.write_text('#!/bin/sh\ndate +%s%N >"$1"\n')
        script.chmod(0o755)
        self.stamp, self.info["stamp"] = str(script), "sh script: date +%s%N (gcc absent)"

    def ensure_debian_peers(self, wanted: list[str]) -> None:
        missing = [t for t in ("tsp", "nq") if t in wanted and not shutil.which(t)]
        if not missing:
            return
        if self.args.no_install:
            for t in missing:
                self.skipped[t] = f"{t} not installed (--no-install)"
            return
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            for t in missing:
                self.skipped[t] = f"{t} not installed and not root with apt-get to install it"
            return
        self.note("installing task-spooler and nq with apt-get ...")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", "task-spooler", "nq"]
        try:
            if subprocess.run(cmd, env=env, capture_output=True, timeout=900).returncode != 0:
                subprocess.run(["apt-get", "update", "-q", "-o", "DPkg::Lock::Timeout=300"], env=env,
                               capture_output=True, timeout=900)
                subprocess.run(cmd, env=env, capture_output=True, timeout=900)
        except subprocess.TimeoutExpired:
            pass
        for t in missing:
            if not shutil.which(t):
                self.skipped[t] = f"apt-get install task-spooler nq did not provide {t}"

    def ensure_peers_venv(self, wanted: list[str]) -> None:
        groups = [t for t in PEER_GROUPS if t in wanted]
        if not groups:
            return
        venv = Path(self.args.peers_venv)
        python = venv / "bin" / "python"
        stamp_file = venv / ".ql-bench-requirements"
        wanted_reqs = "\n".join(r for t in groups for r in PEER_GROUPS[t])
        if not python.exists() or not stamp_file.exists() or any(
                r not in stamp_file.read_text().splitlines() for r in wanted_reqs.splitlines()):
            if self.args.no_install:
                for t in groups:
                    if not python.exists() or not self.peer_importable(str(python), t):
                        self.skipped[t] = f"no peers venv with {PEER_IMPORTS[t]} at {venv} (--no-install)"
                self.peers_python = str(python) if python.exists() else None
                return
            self.note(f"installing {', '.join(r for t in groups for r in PEER_GROUPS[t])} into {venv} ...")
            if not python.exists():
                base = getattr(sys, "_base_executable", None) or sys.executable
                proc = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    for t in groups:
                        self.skipped[t] = f"could not create the peers venv: {proc.stderr.strip()[-120:]}"
                    return
            installed = []
            for t in groups:
                proc = subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_GROUPS[t]],
                                      capture_output=True, text=True, timeout=900)
                if proc.returncode == 0:
                    installed += PEER_GROUPS[t]
                else:
                    tail = [ln for ln in proc.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
                    self.skipped[t] = f"pip install {' '.join(PEER_GROUPS[t])} failed: {(tail or ['?'])[-1][:120]}"
            old = stamp_file.read_text().splitlines() if stamp_file.exists() else []
            stamp_file.write_text("\n".join(sorted(set(old + installed))) + "\n")
        self.peers_python = str(python)
        for t in groups:
            if t not in self.skipped and not self.peer_importable(str(python), t):
                self.skipped[t] = f"{PEER_IMPORTS[t]} not importable in {venv}"

    @staticmethod
    def peer_importable(python: str, tool: str) -> bool:
        return subprocess.run([python, "-c", f"import {PEER_IMPORTS[tool]}"], capture_output=True).returncode == 0

    def start_agents(self, wanted: list[str]) -> None:
        ctx = {"work": str(self.work), "true": shutil.which("true") or "/bin/true", "stamp": self.stamp,
               "sleep": shutil.which("sleep") or "/bin/sleep", "tasks": self.args.tasks, "token": self.token,
               "redis": self.args.redis, "pg_dsn": self.args.pg_dsn}
        self.ctx = ctx
        ql_ok = _ql_importable()
        for tool in wanted:
            if tool in self.skipped:
                continue
            if tool in ("ql", "ql-run") and not ql_ok:
                self.skipped[tool] = "ql_core is not importable by this interpreter (run from ql's venv)"
                continue
            python = self.peers_python if tool in PEER_GROUPS else sys.executable
            if python is None:
                self.skipped.setdefault(tool, "no peers venv")
                continue
            env = self.marked_env(tool, {CTX_ENV: json.dumps(ctx)})
            agent = Agent(tool, python, env, self.work)
            self.agents[tool] = agent
            self.started_tools.add(tool)
            try:
                info = agent.call("setup", timeout=180)
                self.info[tool] = info
            except AgentError as exc:
                self.agents.pop(tool)
                agent.stop()
                self.skipped[tool] = one_line(f"could not start: {exc}")
                self.note(f"  - {tool}: skipped ({self.skipped[tool]})")

    # -- blocks -------------------------------------------------------------------------------
    def live(self, rep: int, block: str, tools: list[str] | None = None) -> Iterator[str]:
        """The variants still up, in this repetition's order; times each one's turn (JSON "timings")."""
        for tool in self.rotated([t for t in (tools or TOOLS) if t in self.agents], rep):
            if tool not in self.agents:
                continue  # lost earlier in this block
            t0 = time.perf_counter()
            yield tool
            self.timings.setdefault(block, {}).setdefault(tool, []).append(round(time.perf_counter() - t0, 3))

    def block_throughput(self, rep: int) -> None:
        for tool in self.live(rep, "throughput"):
            seconds = self.args.window
            try:
                res = self.agents[tool].call("throughput", timeout=seconds + 300, seconds=seconds,
                                             min_tasks=self.args.min_tasks if tool == "ql-run" else 5)
                self.record("tasks_per_s", tool, res["rate"], res)
            except AgentError as exc:
                self.fail(tool, "throughput", exc)

    def block_latency(self, rep: int) -> None:
        stamp_dir = self.work / "stamps"
        stamp_dir.mkdir(exist_ok=True)
        for tool in self.live(rep, "latency"):
            n = self.args.latency_n if tool != "ql-run" else max(3, self.args.latency_n // 3)
            try:
                res = self.agents[tool].call("latency", timeout=60 + 30 * n, n=n, stamp_dir=str(stamp_dir))
            except AgentError as exc:
                self.fail(tool, "latency", exc)
                continue
            sub = [s["submit_exec_ms"] for s in res["samples"]]
            ext = [s["exit_terminal_ms"] for s in res["samples"]]
            self.record("submit_exec_ms", tool, statistics.median(sub), sub)
            self.record("exit_terminal_ms", tool, statistics.median(ext), ext)

    def status_commands(self) -> dict[str, tuple[str, list[str], dict[str, str], tuple[int, ...]]]:
        """label -> (tool, argv, env, accepted exit codes), each naming a task that just finished.

        Built anew for every repetition: a queue may forget old jobs (tsp keeps the last 1000)."""
        db = self.work / "floor-status.db"
        if not db.exists():
            conn = sqlite3.connect(db)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT NOT NULL, exit_code INTEGER)")
            conn.executemany("INSERT INTO runs VALUES (?, 'succeeded', 0)",
                             [(f"run-{i:06d}",) for i in range(1000)])
            conn.commit()
            conn.close()
        select_py = ("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\n"
                     "print(c.execute('SELECT status, exit_code FROM runs WHERE id = ?', (sys.argv[2],)).fetchone())\n")
        cmds: dict[str, tuple[str, list[str], dict[str, str], tuple[int, ...]]] = {
            "python3 -c pass": ("python", [sys.executable, "-c", "pass"], self.marked_env("floor"), (0,)),
            "python+sqlite3 SELECT": ("floor", [sys.executable, "-c", select_py, str(db), "run-000500"],
                                      self.marked_env("floor"), (0,)),
        }
        for tool in [t for t in TOOLS if t in self.agents]:
            try:
                got = self.agents[tool].call("status_commands", timeout=120)
            except AgentError as exc:
                self.fail(tool, "status set-up", exc)
                continue
            for label, spec in got.items():
                if spec.get("ql"):
                    env = {**ql_cli_env(), MARK: f"{self.token}:{tool}"}
                else:
                    env = self.marked_env(tool, spec["env"])
                cmds[label] = (tool, spec["argv"], env, tuple(spec.get("ok", (0,))))
        return cmds

    def block_status(self, rep: int) -> None:
        cmds = self._status_cmds = self.status_commands()
        labels = list(cmds)
        walls: dict[str, list[float]] = {label: [] for label in labels}
        broken: set[str] = set()
        # the first repetition starts with one untimed pass (page cache, bytecode caches), unless --quick
        for i in range(-1 if rep == 0 and not self.args.quick else 0, self.args.status_n):
            for label in self.rotated(labels, rep + max(i, 0)):
                if label in broken:
                    continue
                _tool, argv, env, ok = cmds[label]
                t0 = time.perf_counter()
                proc = subprocess.run(argv, env=env, cwd=self.work, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
                wall = time.perf_counter() - t0
                if proc.returncode not in ok:
                    broken.add(label)
                    self.errors.append(one_line(f"{label}: exit {proc.returncode}: "
                                                f"{proc.stderr.decode(errors='replace')[-200:]}"))
                    self.note(f"  ! {label} exited {proc.returncode}")
                    continue
                if i >= 0:
                    walls[label].append(wall * 1000)
        for label, samples in walls.items():
            if samples:
                self.record("cli_ms:" + label, cmds[label][0], statistics.median(samples), samples)

    def tool_pss(self, tool: str) -> tuple[int, int, list[dict[str, Any]]]:
        """(PSS KiB of the tool's processes, number of running task commands, details)."""
        mark = f"{self.token}:{tool}"
        agent = self.agents.get(tool)
        total, tasks, procs = 0, 0, []
        for pid, info in proc_table().items():
            if info["mark"] != mark or info["state"] == "Z":
                continue
            if is_task_command(info):
                tasks += 1
                continue
            if agent is not None and pid == agent.pid and tool not in HOSTS:
                continue  # the client program is not part of the tool
            kib = pss_kib(pid)
            total += kib
            procs.append({"pid": pid, "comm": info["comm"], "pss_kib": kib})
        return total, tasks, procs

    def wait_tasks(self, tool: str, n: int, timeout: float = 180) -> None:
        def ready() -> bool:
            return self.tool_pss(tool)[1] >= n

        poll_until(ready, timeout, f"{n} running sleep tasks of {tool}", interval=0.1)

    def kill_tasks(self, tool: str) -> None:
        mark = f"{self.token}:{tool}"
        for pid, info in proc_table().items():
            if info["mark"] == mark and is_task_command(info) and info["state"] != "Z":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def memory_once(self, tool: str, steps: list[int], settle: float) -> list[dict[str, Any]]:
        """Start the tasks in steps (cumulative counts); a PSS reading after each. Idle reading first."""
        agent = self.agents[tool]
        idle, _, idle_procs = self.tool_pss(tool)
        readings = [{"n": 0, "pss_kib": idle, "procs": idle_procs}]
        started = 0
        try:
            for target in steps:
                agent.call("mem_start", timeout=300, n=target - started)
                started = target
                self.wait_tasks(tool, target)
                time.sleep(settle)
                total, tasks, procs = self.tool_pss(tool)
                readings.append({"n": tasks, "pss_kib": total, "procs": procs})
        finally:
            if started:
                self.kill_tasks(tool)
                agent.call("mem_stop", timeout=300)
        return readings

    def block_memory(self, rep: int) -> None:
        n = self.args.tasks
        for tool in self.live(rep, "memory"):
            steps = [1, n] if tool == "ql-run" and n > 1 else [n]
            try:
                readings = self.memory_once(tool, steps, settle=self.args.settle * (2 if tool == "ql-run" else 1))
            except (AgentError, TimeoutError, OSError) as exc:
                self.kill_tasks(tool)
                self.fail(tool, "memory", exc)
                continue
            idle, last = readings[0]["pss_kib"], readings[-1]
            self.record("mem_per_task_kib", tool, (last["pss_kib"] - idle) / n, readings)
            if tool == "ql-run":
                self.record("ql_run_single_kib", tool, readings[1]["pss_kib"] - idle, readings[1])
        for tool in self.live(rep, "host-memory", ["floor", "ql"]):
            try:
                readings = self.memory_once(tool, [self.args.host_tasks], settle=self.args.settle)
            except (AgentError, TimeoutError, OSError) as exc:
                self.kill_tasks(tool)
                self.fail(tool, "50-task host memory", exc)
                continue
            self.record("host_total_kib", tool, readings[-1]["pss_kib"], readings)

    def block_recovery(self, rep: int) -> None:
        n = self.args.recovery_n
        for tool in self.rotated(["floor", "ql"], rep):
            if tool == "floor" and "floor" in self.agents:
                try:
                    res = self.agents["floor"].call("recovery_floor", timeout=600, n=n,
                                                    directory=str(self.work / f"recovery-floor-{rep}"))
                    self.record("recovery_per_s", "floor", res["rate"], res)
                except AgentError as exc:
                    self.fail("floor", "recovery floor", exc)
            elif tool == "ql" and "ql" in self.agents:
                try:
                    res = self.ql_recovery_once(n, rep)
                    self.record("recovery_per_s", "ql", n / res["reconcile_s"], res)
                    self.record("recovery_whole_per_s", "ql", n / res["whole_s"], res["whole_s"])
                except (RuntimeError, TimeoutError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
                    self.errors.append(f"ql recovery: {exc}")
                    self.note(f"  ! ql recovery failed: {exc}")

    def ql_recovery_once(self, n: int, rep: int) -> dict[str, Any]:
        data = self.work / f"recovery-ql-{rep}"
        tool = "ql-recovery"
        env = self.marked_env(tool, {CTX_ENV: json.dumps(self.ctx)})
        script = str(Path(__file__).resolve())
        log_path = self.work / f"dead-host-{rep}.log"
        with open(log_path, "wb") as log:
            host = subprocess.Popen([sys.executable, script, "--dead-host", str(data), str(n)], env=env,
                                    cwd=self.work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
        try:
            assert host.stdout is not None
            ready, _, _ = select.select([host.stdout], [], [], 600)
            line = host.stdout.readline() if ready else b""
            if line.strip() != b"submitted":
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [repr(line)]
                raise RuntimeError(f"dead host did not submit: {tail[0][:200]}")
        finally:
            host.kill()  # SIGKILL: the host dies without waiting for any task
            host.wait()
            host.stdout.close()
        mark = f"{self.token}:{tool}"

        def launchers_gone() -> bool:
            return not any(i["mark"] == mark and i["state"] != "Z" for i in proc_table().values())

        poll_until(launchers_gone, 300, "the dead host's launchers to exit", interval=0.05)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, script, "--recover", str(data), str(n)], env=env, cwd=self.work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
        whole = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"recover process exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["whole_s"] = whole
        applied = res["counts"].get("applied")
        if applied is not None and applied != n:
            raise RuntimeError(f"reconcile applied {applied} of {n}: {res['counts']}")
        if res["sampled_succeeded"] != res["sampled"]:
            raise RuntimeError(f"only {res['sampled_succeeded']} of {res['sampled']} sampled runs succeeded")
        shutil.rmtree(data, ignore_errors=True)
        return res

    # -- clean-up -----------------------------------------------------------------------------
    def cleanup(self) -> None:
        for tool in list(self.agents):
            self.kill_tasks(tool)
            self.agents.pop(tool).stop()
        self.sweep()
        self.drop_external_state()
        shutil.rmtree(self.work, ignore_errors=True)

    def drop_external_state(self) -> None:
        """Idempotent: this run's Redis keys and PostgreSQL database, even if an agent died early."""
        if not self.peers_python or not Path(self.peers_python).exists():
            return
        code = {
            "huey": ("import redis, sys\nh, p = sys.argv[1].rsplit(':', 1)\nc = redis.Redis(host=h, port=int(p), "
                     "socket_connect_timeout=3)\nfor k in c.scan_iter(match='huey.*qlbench' + sys.argv[2] + '*'):\n"
                     "    c.delete(k)\n", self.args.redis),
            "procrastinate": ("import psycopg, sys\nwith psycopg.connect(sys.argv[1], autocommit=True, "
                              "connect_timeout=5) as c:\n    c.execute('DROP DATABASE IF EXISTS \"qlbench_' + "
                              "sys.argv[2] + '\" WITH (FORCE)')\n", self.args.pg_dsn),
        }
        for tool, (script, target) in code.items():
            if tool in self.started_tools:
                with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                    subprocess.run([self.peers_python, "-c", script, target, self.token], capture_output=True,
                                   timeout=30)

    def sweep(self) -> None:
        """Kill, by pid, every process still carrying this run's marker (TERM, then KILL)."""
        prefix = f"{self.token}:"
        for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.5)):
            left = [pid for pid, i in proc_table().items()
                    if i["mark"] and i["mark"].startswith(prefix) and i["state"] != "Z" and pid != os.getpid()]
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(pause)


def _ql_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("ql_core") is not None


STAMP_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* stamp FILE: write "<ns at entry> <ns just before exit>" to FILE. */
int main(int argc, char **argv) {
    long long first = now_ns();
    if (argc < 2) return 2;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return 1;
    char buf[64];
    long long last = now_ns();
    int n = snprintf(buf, sizeof buf, "%lld %lld\n", first, last);
    if (write(fd, buf, (size_t)n) != n) return 1;
    return close(fd) == 0 ? 0 : 1;
}
"""


# =============================================================================================
# report
# =============================================================================================

def fmt_num(x: float) -> str:
    """Three significant digits or so, whatever the magnitude."""
    for limit, digits in ((100, 0), (10, 1), (1, 2), (0.01, 3)):
        if abs(x) >= limit:
            return f"{x:.{digits}f}"
    return f"{x:.4f}"


def fmt_kib(kib: float) -> str:
    if abs(kib) >= 10240:
        return f"{kib / 1024:.1f} MiB"
    return f"{kib:.0f} KiB" if round(kib) != 0 else "0 KiB"


STATUS_LABELS = {"tsp": "tsp -s ID", "nq": "nq -t JOB", "supervisord": "supervisorctl status", "ql-run": "ql status"}
MEMORY_RATIO_MIN_KIB = 32  # below this the floor is PSS noise (a Popen host keeps ~nothing per task)


def report(bench: Bench, elapsed: float, load_start: tuple[float, ...],
           load_end: tuple[float, ...]) -> dict[str, Any]:
    m = bench.median
    Render = Callable[[float, float], str]

    def cell(tool: str, figure: str, render: Render, floor: float | None) -> str:
        value = m(figure, tool)
        if value is None or floor is None:
            return "skipped" if tool in bench.skipped else "–"
        return render(value, floor)

    def ql_cell(figure: str, render: Render, floor: float | None,
                labels: tuple[str, str] = ("embedded", "`ql run`")) -> str:
        parts = [f"{label} {cell(tool, figure, render, floor)}"
                 for tool, label in zip(("ql", "ql-run"), labels, strict=True) if m(figure, tool) is not None]
        return ", ".join(parts) if parts and floor is not None else "–"

    def row(title: str, figure: str, floor_text: Callable[[float], str], render: Render,
            ql: str | None = None, peers: dict[str, str] | None = None) -> list[str]:
        floor = m(figure, "floor")
        cells = [title, floor_text(floor) if floor is not None else "–"]
        for tool in PEERS:
            fig = figure if peers is None else ("cli_ms:" + peers[tool] if tool in peers else None)
            cells.append(cell(tool, fig, render, floor) if fig else "–")
        cells.append(ql if ql is not None else ql_cell(figure, render, floor))
        return cells

    def ratio(v: float, f: float) -> str:
        return f"{fmt_num(v / f)} ({fmt_num(v)}/s)"

    def times(v: float, f: float) -> str:
        return f"{fmt_num(v / f)}× ({fmt_num(v)} ms)"

    def added(v: float, f: float) -> str:
        return f"{v - f:+.1f} ({fmt_num(v)} ms)"

    def query(v: float, f: float) -> str:
        return f"{fmt_num(v)} ms ({fmt_num(v / f)}×)"

    mem_floor = m("mem_per_task_kib", "floor")
    mem_ratio = mem_floor is not None and mem_floor >= MEMORY_RATIO_MIN_KIB

    def mem(v: float, f: float) -> str:
        return f"{fmt_kib(v)} ({v / f:.1f}×)" if mem_ratio else fmt_kib(v)

    status_floor = m("cli_ms:python+sqlite3 SELECT", "floor")
    recovery_floor = m("recovery_per_s", "floor")
    rows = [
        row("short tasks/s, 1 in flight (ratio to floor)", "tasks_per_s",
            lambda f: f"`Popen(['true'])`+wait: {f:.0f}/s (1)", ratio),
        row("submit → exec (× floor)", "submit_exec_ms", lambda f: f"{fmt_num(f)} ms", times),
        row("task exit → terminal state (added ms)", "exit_terminal_ms", lambda f: f"– ({fmt_num(f)} ms)", added),
        row("status query, whole process", "cli_ms:python+sqlite3 SELECT",
            lambda f: f"python+sqlite3 SELECT {fmt_num(f)} ms", query,
            ql=("`ql status` " + cell("ql-run", "cli_ms:ql status", query, status_floor)
                if m("cli_ms:ql status", "ql-run") is not None else "–"),
            peers={t: label for t, label in STATUS_LABELS.items() if t in PEERS}),
        row("memory kept alive per running task (PSS)", "mem_per_task_kib",
            lambda f: fmt_kib(f) + ("" if mem_ratio else " (≈ 0: no ratio)"), mem,
            ql=ql_cell("mem_per_task_kib", mem, mem_floor or 0.0, ("embedded", "each waiting `ql run`"))),
        row("recovery after host death, attempts/s", "recovery_per_s",
            lambda f: f"sqlite3 UPDATE+COMMIT+unlink+dir fsync {f:.0f}/s", ratio,
            ql=cell("ql", "recovery_per_s", ratio, recovery_floor), peers={}),
    ]
    header = ["figure", "floor", "tsp", "nq", "supervisord", "huey (tuned)", "procrastinate", "ql"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]

    # goals: (text, measured value or None, limit, "<=" | ">=", how the value is shown)
    py = m("cli_ms:python3 -c pass", "python")
    goals: list[dict[str, Any]] = []

    def goal(text: str, value: float | None, limit: float, kind: str, shown: Callable[[], str]) -> None:
        passed = None if value is None else (value <= limit if kind == "<=" else value >= limit)
        goals.append({"goal": text, "value": value, "limit": limit, "kind": kind, "pass": passed,
                      "shown": shown() if value is not None else "not measured"})

    def both(a: float | None, b: float | None) -> bool:
        return a is not None and b is not None and b != 0

    for label, limit in (("ql status", 3.0), ("ql list", 3.0), ("ql events", 3.0), ("ql run -- true", 5.0)):
        v = m("cli_ms:" + label, "ql-run")
        goal(f"`{label}` ≤ {limit:g}× `python3 -c pass`", v / py if both(v, py) else None, limit, "<=",
             lambda v=v: f"{v / py:.1f}× ({v:.0f} ms vs {py:.0f} ms)")
    v = m("ql_run_single_kib", "ql-run")
    goal("one waiting `ql run` ≤ 15 MiB PSS", v / 1024 if v is not None else None, 15.0, "<=",
         lambda: f"{v / 1024:.1f} MiB (the ql run process + its launcher)")
    e, f = m("tasks_per_s", "ql"), m("tasks_per_s", "floor")
    goal("embedded `true` tasks, 1 in flight ≥ 0.15 of the floor", e / f if both(e, f) else None, 0.15, ">=",
         lambda: f"{e / f:.3f} ({fmt_num(e)}/s vs {f:.0f}/s)")
    e2, f2 = m("submit_exec_ms", "ql"), m("submit_exec_ms", "floor")
    goal("embedded submit → exec ≤ 3× the floor", e2 / f2 if both(e2, f2) else None, 3.0, "<=",
         lambda: f"{e2 / f2:.1f}× ({e2:.2f} ms vs {f2:.2f} ms)")
    e3, f3 = m("exit_terminal_ms", "ql"), m("exit_terminal_ms", "floor")
    goal("embedded exit → terminal ≤ +3 ms", e3 - f3 if e3 is not None and f3 is not None else None, 3.0, "<=",
         lambda: f"{e3 - f3:+.1f} ms ({e3:.2f} ms vs the floor's {f3:.2f} ms)")
    r, f4 = m("recovery_per_s", "ql"), m("recovery_per_s", "floor")
    goal("recovery ≥ 0.5 of the sqlite3 floor", r / f4 if both(r, f4) else None, 0.5, ">=",
         lambda: f"{r / f4:.2f} ({r:.0f}/s vs {f4:.0f}/s)")
    e5, f5 = m("host_total_kib", "ql"), m("host_total_kib", "floor")
    goal(f"embedded {bench.args.host_tasks}-task host ≤ 2× the Popen host's PSS",
         e5 / f5 if both(e5, f5) else None, 2.0, "<=",
         lambda: f"{e5 / f5:.1f}× ({fmt_kib(e5)} vs {fmt_kib(f5)})")

    out += ["", "Goals:"]
    for g in goals:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[g["pass"]]
        out.append(f"  {verdict}  {g['goal']}: {g['shown']}")

    out.append("")
    cli = [(label, tool) for label, (tool, *_rest) in getattr(bench, "_status_cmds", {}).items()
           if m("cli_ms:" + label, tool) is not None]
    if cli:
        out.append("Whole-process medians (ms): "
                   + ", ".join(f"{label} {m('cli_ms:' + label, tool):.1f}" for label, tool in cli))
    rw = m("recovery_whole_per_s", "ql")
    if rw:
        out.append(f"Recovery counting the whole fresh process (start-up, Runtime.open, reconcile): "
                   f"{rw:.0f} attempts/s (N={bench.args.recovery_n})")
    if bench.skipped:
        out.append("Skipped: " + "; ".join(f"{t}: {why}" for t, why in bench.skipped.items()))
    if bench.errors:
        out.append(f"Errors ({len(bench.errors)}): " + " | ".join(bench.errors[:10]))
    out.append(f"Run took {elapsed:.0f} s; load average at start {load_start[0]:.2f} {load_start[1]:.2f} "
               f"{load_start[2]:.2f}, at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    print("\n".join(out), flush=True)
    return {"goals": goals, "table": out}


# =============================================================================================
# main
# =============================================================================================

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short windows, N=10 tasks, recovery N=200 (≤ ~2 min)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (≥ 3 for medians; default 3)")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(TOOLS)} "
                   "(floor is always included; 'ql' also selects ql-run)")
    p.add_argument("--json", metavar="FILE", help="write every raw sample, per-rep value and median here")
    p.add_argument("--no-install", action="store_true", help="never run apt-get or pip; skip what is missing")
    p.add_argument("--tasks", type=int, help="N running sleep tasks for the memory figure (default 20; quick 10)")
    p.add_argument("--host-tasks", type=int, default=50, help="running tasks of the host-memory goal (50)")
    p.add_argument("--recovery-n", type=int, help="dead-host attempts to recover (default 1000; quick 200)")
    p.add_argument("--window", type=float, help="seconds per throughput measurement (default 2; quick 0.5)")
    p.add_argument("--latency-n", type=int, help="latency samples per tool and rep (default 15; quick 6)")
    p.add_argument("--status-n", type=int, help="runs of each status command per rep (default 5; quick 2)")
    p.add_argument("--dir", default="/var/tmp", help="parent of the temp dir (default /var/tmp: a real disk)")
    p.add_argument("--peers-venv", default=str(HERE / ".peers-venv"), help="venv for supervisor/huey/procrastinate")
    p.add_argument("--redis", default="127.0.0.1:6379", help="Redis for huey (host:port)")
    p.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="PostgreSQL admin DSN for procrastinate (a private database is created and dropped)")
    args = p.parse_args(argv)
    q = args.quick
    args.tasks = args.tasks or (10 if q else 20)
    args.recovery_n = args.recovery_n or (200 if q else 1000)
    args.window = args.window or (0.5 if q else 2.0)
    args.latency_n = args.latency_n or (6 if q else 15)
    args.status_n = args.status_n or (2 if q else 5)
    args.settle = 0.3 if q else 0.5          # pause between "all N tasks run" and the PSS reading
    args.min_tasks = 2 if q else 3           # least `ql run` tasks per throughput measurement
    if args.reps < 1:
        p.error("--reps must be ≥ 1")
    wanted = {"floor"}
    for name in (x.strip() for x in args.only.split(",") if x.strip()):
        if name == "ql":
            wanted |= {"ql", "ql-run"}
        elif name in TOOLS:
            wanted.add(name)
        else:
            p.error(f"unknown tool {name!r} (choose from {', '.join(TOOLS)})")
    args.tools = [t for t in TOOLS if t in wanted] if args.only else list(TOOLS)
    return args


def git_head() -> str:
    try:
        head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "") if head else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Bytecode caches are written and used, as in a normal install (a PYTHONDONTWRITEBYTECODE
    # environment would recompile ql's own modules in every measured process).
    dont_write = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.time()
    load_start = os.getloadavg()
    bench = Bench(args)

    def on_term(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # also when started with SIGINT ignored
        signal.signal(signum, on_term)
    print(f"# bench_peers: {time.strftime('%Y-%m-%d %H:%M:%S')}  host {platform.node()}  {os.cpu_count()} CPUs  "
          f"python {platform.python_version()}  ql {git_head()}", flush=True)
    print(f"# load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; "
          f"work dir {bench.work}; reps {args.reps}{' (quick)' if args.quick else ''}; tasks N={args.tasks}; "
          f"recovery N={args.recovery_n}; throughput window {args.window:g} s"
          f"{'; PYTHONDONTWRITEBYTECODE unset for the measured processes' if dont_write else ''}", flush=True)
    interrupted = False
    result: dict[str, Any] = {}
    try:
        bench.build_stamp()
        for ensure, tools in ((bench.ensure_debian_peers, ("tsp", "nq")),
                              (bench.ensure_peers_venv, tuple(PEER_GROUPS))):
            try:
                ensure(args.tools)
            except Exception as exc:  # noqa: BLE001 - an install problem skips those peers, never the run
                for tool in tools:
                    if tool in args.tools:
                        bench.skipped.setdefault(tool, f"install failed: {type(exc).__name__}: {exc}"[:160])
        bench.start_agents(args.tools)
        versions = {t: bench.info[t].get("version") for t in TOOLS if isinstance(bench.info.get(t), dict)
                    and bench.info[t].get("version")}
        print(f"# stamp: {bench.info['stamp']}; ql command: {' '.join(ql_command())}; versions: {versions}", flush=True)
        if bench.skipped:
            for tool, why in bench.skipped.items():
                print(f"# skipped {tool}: {why}", flush=True)
        blocks = [("throughput", bench.block_throughput), ("latency", bench.block_latency),
                  ("status", bench.block_status), ("memory", bench.block_memory), ("recovery", bench.block_recovery)]
        for rep in range(args.reps):
            for name, block in blocks:
                t0 = time.time()
                block(rep)
                print(f"# rep {rep + 1}/{args.reps}: {name} {time.time() - t0:.1f} s", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\n# interrupted: cleaning up", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            bench.cleanup()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    load_end = os.getloadavg()
    elapsed = time.time() - started
    print(flush=True)
    result = report(bench, elapsed, load_start, load_end)
    if args.json:
        medians = {fig: {tool: bench.median(fig, tool) for tool in per} for fig, per in bench.values.items()}
        Path(args.json).write_text(json.dumps({
            "args": {k: v for k, v in vars(args).items()}, "started": started, "elapsed_s": elapsed,
            "load_start": load_start, "load_end": load_end, "git": git_head(), "info": bench.info,
            "skipped": bench.skipped, "errors": bench.errors, "per_rep": bench.values, "samples": bench.samples,
            "medians": medians, "goals": result["goals"], "timings_s": bench.timings,
            "interrupted": interrupted}, indent=1, default=str))
        print(f"# raw samples and medians written to {args.json}", flush=True)
    return 130 if interrupted else 0


def run_under_reaper(argv: list[str]) -> int | None:
    """Re-run this script as the child of a child-subreaper: daemons' orphans are reaped here, and
    whatever the bench leaves behind in its own process subtree is killed by pid at the end."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
            return None
    except (OSError, AttributeError):
        return None
    child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv],
                             env=dict(os.environ, **{REAPED_ENV: "1"}))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the bench itself, which cleans up

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    code = 1
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            child.returncode = code
            break
    # Only orphans of the bench are left as our children now: stop them, by pid, and reap.
    me = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        table = proc_table()
        mine = {me}
        changed = True
        while changed:
            changed = False
            for pid, info in table.items():
                if info["ppid"] in mine and pid not in mine:
                    mine.add(pid)
                    changed = True
        mine.discard(me)
        alive = [p for p in mine if table[p]["state"] != "Z"]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (3.0 if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)
        if not alive:
            break
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return code


def entry(argv: list[str]) -> int:
    if argv[:1] == ["--agent"]:
        return agent_main(argv[1])
    if argv[:1] == ["--dead-host"]:
        return dead_host_main(argv[1], int(argv[2]))
    if argv[:1] == ["--recover"]:
        return recover_main(argv[1], int(argv[2]))
    if os.environ.get(REAPED_ENV) != "1" and sys.platform.startswith("linux"):
        code = run_under_reaper(argv)
        if code is not None:
            return code
    return main(argv)


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
