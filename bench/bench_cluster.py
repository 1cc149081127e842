"""Cluster throughput and scale-out on one machine, beside their floors, with issue 24's goals.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/bench_cluster.py
    # the issue's full burst: --burst-n 10000 (the default keeps the run near 5 minutes on a loaded box)

Everything runs against one fresh database (created, migrated and dropped here), in one run:

- **floor**: bare ``UPDATE … RETURNING`` + COMMIT (autocommit, one row per call, prepared), by 1, 2,
  4 and 8 client processes at once — the cheapest possible "take a row and commit" here;
- **protocol**: 1, 2, 4, 8 processes that are workers as far as the control plane can tell — they
  register, heartbeat, ``claim`` (``--claim-batch``: 64, the most one claim takes since revision
  0015, which is also the slots they register; 8 before), ``start``, ``running`` and ``complete`` every
  attempt of queued no-op runs through the fenced functions — but spawn nothing: the control
  plane's own cost. ``--calls batch`` (default) sends start/running/complete for a whole claim in
  one transaction each (``ControlDB.start_many`` …, what ``ql worker`` does); ``--calls single``
  one call per attempt;
- **embedded host**: one ``Runtime`` on a local SQLite data dir keeping 4 ``true`` tasks in flight
  (``submit(awaited=True)`` / ``wait``), after ``--warmup-n`` tasks of its own: what one machine does
  without a cluster;
- **ql worker**: 1, 2, 4 real ``ql worker`` processes (4 slots each) running ``true`` through the
  launcher, receipts, the local journal and the outbox; each phase first drains ``--warmup-n`` runs
  per worker, not measured (a worker's first tasks pay its one-time costs — runner threads and their
  local-store connections, the standby launchers, the spec cipher's import: ~50 ms of CPU here —
  which, spread over 200 measured runs, counted 4x more per task with 4 workers than with 1);
- **burst**: with the 4 workers idle, ``--burst-n`` runs submitted at once (``ControlDB.submit_many``,
  one transaction per ``SUBMIT_BATCH``), then drained: seconds from the first submit to the last
  completion, as a rate beside the 4-worker steady rate;
- **latency**: with the 4 workers idle, ``--latency-n`` runs one after another: enqueue (the run's
  ``created_at_ms``) → exec (its attempt's ``started_at_ms``, the process start), p50 and p99.

Beside each ``ql worker`` rate: CPU milliseconds per task of the worker processes, of their
reaped children (launchers and tasks) and of the PostgreSQL backends of their connections, from
``/proc`` (``--workers-only`` skips the floor and protocol phases: the embedded host and the workers
only; ``--worker-counts 1`` runs one worker phase, for an A/B of one worker beside the embedded host;
``bench/worker_profile.py`` splits one worker's CPU by thread and by connection), and the runs one
claim took on average (``runs/claim``: fewer, larger claims cost less per task — a worker that
refills each slot the moment it frees claims one run at a time, each with its commit and ``start``). Beside each protocol rate: CPU milliseconds (user + sys) per floor row and per completion, of the
client processes and of their PostgreSQL backends (``/proc/PID/stat``, when the server runs on this
machine), and their ratio — unlike wall rates these do not move with other load on a shared machine.

The embedded host and the worker phases run ``--rounds`` times (default 3), alternated: each rate
printed is the median of its rounds, and each goal's ratio (one worker against the embedded host,
4 workers against 1) the median of the ratios measured within each round — on a shared machine a
neighbour's load moves one rate by a fifth from one minute to the next (the embedded host gave 381
and 478 tasks/s in two runs of the same code, one worker 153 and 201), and a single pair then
passes or fails a goal by luck. The burst and the latency run once, in the last round.

Rates come from the database's own timestamps (attempt creation = claim, run update = completion),
from the first claim to the last completion. Every phase has a deadline (``--phase-timeout``): past
it the bench stops with what it saw (runs by status), never hangs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from pg_scratch import scratch_database

from ql_plugins.cluster_fenced.control_db import MAX_CLAIM

PROTOCOL_COUNTS = (1, 2, 4, 8)
WORKER_COUNTS = (1, 2, 4)
TERMINAL = ("succeeded", "failed", "lost", "cancelled", "timed_out")
#: Runs one look of :meth:`Workers.drain` asks about.
DRAIN_LOOK = 64
#: How often a protocol client heartbeats its worker session (the session lease is 45 s).
HEARTBEAT_S = 5.0


class PhaseTimeout(SystemExit):
    """A phase outlived its deadline: the bench stops loudly with what it saw."""


def _status_counts(dsn: str, run_ids: list[str]) -> dict[str, int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM ql_run WHERE id = ANY(%s) GROUP BY status",
                            (run_ids,)).fetchall()
    return {s: n for s, n in rows}


def _backend_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + sys) of a PostgreSQL backend on this machine, from /proc (None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _CpuMeter:
    """CPU (user + sys) of this client process and of its backend, from ``start`` to ``stop``: unlike
    wall time, not inflated by other load on a shared machine (compare it with the floor's)."""

    def __init__(self, backend_pid: int) -> None:
        self.pid = backend_pid
        self.client0, self.server0 = _own_cpu_s(), _backend_cpu_s(backend_pid)

    def stop(self) -> tuple[float, float | None]:
        server = _backend_cpu_s(self.pid)
        return (_own_cpu_s() - self.client0,
                None if server is None or self.server0 is None else server - self.server0)


def _sum_cpu(results: list[tuple[float, float | None]]) -> tuple[float, float | None]:
    servers = [r[1] for r in results]
    return sum(r[0] for r in results), None if None in servers else sum(s for s in servers if s is not None)


def _fail(phase: str, timeout: float, seen: str) -> PhaseTimeout:
    return PhaseTimeout(f"bench_cluster: phase {phase!r} did not finish within {timeout:g}s (--phase-timeout); "
                        f"saw {seen}")


def _collect(phase: str, out: mp.Queue, procs: list[mp.Process], timeout: float,
             seen: Callable[[], str]) -> list[Any]:
    """One result per process, all before the phase's deadline (else stop with what was seen)."""
    deadline = time.monotonic() + timeout
    results = []
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=max(0.1, min(1.0, deadline - time.monotonic()))))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                why = f"{len(dead)} client(s) died (exit {dead[0].exitcode}); " if dead else ""
                raise _fail(phase, timeout, why + seen()) from None
    for p in procs:
        p.join(30)
    return results


# -- floor ---------------------------------------------------------------------------------------
def _floor_client(dsn: str, first: int, n: int, start_at: float, out: mp.Queue) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        while time.time() < start_at:
            time.sleep(0.0005)
        t0, cpu = time.perf_counter(), _CpuMeter(backend)
        for i in range(n):
            conn.execute("UPDATE bench_floor SET n = n + 1 WHERE id = %s RETURNING n", (first + i,),
                         prepare=True).fetchone()
        out.put((n, time.perf_counter() - t0, cpu.stop()))


def floor_rate(dsn: str, clients: int, n: int, timeout: float) -> tuple[float, tuple[float, float | None]]:
    """Rows updated-and-committed per second, all clients together, and the CPU seconds (client,
    server) per row."""
    out: mp.Queue = mp.Queue()
    start_at = time.time() + 0.5
    procs = [mp.Process(target=_floor_client, args=(dsn, c * n, n, start_at, out)) for c in range(clients)]
    for p in procs:
        p.start()
    results = _collect(f"floor x{clients}", out, procs, timeout, lambda: "no floor client finished")
    rows = sum(r[0] for r in results)
    client, server = _sum_cpu([r[2] for r in results])
    return rows / max(r[1] for r in results), (client / rows, None if server is None else server / rows)


# -- the protocol alone --------------------------------------------------------------------------
def _protocol_client(dsn: str, name: str, start_at: float, calls: str, batch: int, out: mp.Queue) -> None:
    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB, completion_digest

    db = ControlDB.connect(dsn)
    worker = db.register(name, str(uuid.uuid4()), slots=64, ql_version="bench").worker
    backend = db._connection().info.backend_pid
    while time.time() < start_at:
        time.sleep(0.0005)
    cpu = _CpuMeter(backend)
    heartbeat_due = time.monotonic() + HEARTBEAT_S
    done = 0

    def outcome(attempt_id: str) -> dict[str, Any]:
        finished = int(time.time() * 1000)
        return dict(exit_code=0, started_at_ms=None, finished_at_ms=finished, signalled=False,
                    completion_digest=completion_digest(attempt_id, exit_code=0, started_at_ms=None,
                                                        finished_at_ms=finished, signalled=False))

    while True:
        if time.monotonic() >= heartbeat_due:  # the session outlives any number of runs
            assert db.heartbeat(worker).answer.value == "ok", "protocol client's session was fenced"
            heartbeat_due = time.monotonic() + HEARTBEAT_S
        claimed = db.claim(worker, max_n=batch, free_slots=batch, executor="local",
                           attempt_ids=[new_id() for _ in range(batch)], log_ids=[new_id() for _ in range(batch)]).attempts
        if not claimed:
            break
        fences = [c.fence(worker) for c in claimed]
        if calls == "batch":
            db.start_many(fences)
            db.running_many([(f, c.db_now_ms) for f, c in zip(fences, claimed)])
            answers = db.complete_many([(f, outcome(f.attempt_id)) for f in fences])
            done += sum(1 for a in answers if a.answer.value == "applied")
        else:
            for c, fence in zip(claimed, fences):
                db.start(fence)
                db.running(fence, started_at_ms=c.db_now_ms)
                if db.complete(fence, **outcome(fence.attempt_id)).answer.value == "applied":
                    done += 1
    used = cpu.stop()
    db.close()
    out.put((done, used))


def _submit(dsn: str, n: int, key_file: Path | None = None) -> tuple[list[str], float]:
    """Queue ``n`` runs of ``true`` (bulk: ``submit_many``), sealed with ``key_file`` (what real
    workers open) or with a throwaway key when nothing will run them. Returns (ids, seconds)."""
    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB
    from ql_plugins.cluster_fenced.control_db import SUBMIT_BATCH, QueuedSubmit
    from ql_plugins.cluster_fenced.sealing import SpecKey, SpecKeyRing, encode_spec, key_id_of, load_key_file

    if key_file is not None:
        ring = SpecKeyRing(load_key_file(key_file))
    else:
        key = os.urandom(32)
        ring = SpecKeyRing(SpecKey(key_id_of(key), key))
    plain = encode_spec(["true"], False, None, None)
    ids = [new_id() for _ in range(n)]
    t0 = time.perf_counter()
    with ControlDB.connect(dsn) as db:
        for i in range(0, n, SUBMIT_BATCH):
            chunk = ids[i:i + SUBMIT_BATCH]
            db.submit_many([QueuedSubmit(run_id, ring.seal(run_id, plain, 1)) for run_id in chunk])
    return ids, time.perf_counter() - t0


def _rates(dsn: str, run_ids: list[str]) -> tuple[float, float]:
    """(claims/s, completions/s) of these runs from the database's timestamps."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        first, last_claim = conn.execute("SELECT min(a.created_at_ms), max(a.created_at_ms) FROM ql_run_attempt a "
                                         "WHERE a.run_id = ANY(%s)", (run_ids,)).fetchone()
        last_done, done = conn.execute("SELECT max(updated_at_ms), count(*) FROM ql_run WHERE id = ANY(%s) "
                                       "AND status = 'succeeded'", (run_ids,)).fetchone()
        claims = conn.execute("SELECT count(*) FROM ql_run_attempt WHERE run_id = ANY(%s)", (run_ids,)).fetchone()[0]
    done_rate = done / max(0.001, (last_done - first) / 1000) if last_done is not None else 0.0
    return claims / max(0.001, (last_claim - first) / 1000), done_rate


def protocol(dsn: str, clients: int, n: int, calls: str, batch: int,
             timeout: float) -> tuple[float, tuple[float, float | None]]:
    """Completions per second of ``n`` runs, and the CPU seconds (client, server) per completion."""
    runs, _ = _submit(dsn, n)
    out: mp.Queue = mp.Queue()
    start_at = time.time() + 0.5
    procs = [mp.Process(target=_protocol_client, args=(dsn, f"bench-p{clients}-{c}", start_at, calls, batch, out))
             for c in range(clients)]
    for p in procs:
        p.start()
    results = _collect(f"protocol x{clients}", out, procs, timeout, lambda: str(_status_counts(dsn, runs)))
    total = sum(r[0] for r in results)
    if total != n:
        raise SystemExit(f"bench_cluster: protocol x{clients} completed {total} of {n} runs; "
                         f"saw {_status_counts(dsn, runs)}")
    client, server = _sum_cpu([r[1] for r in results])
    return _rates(dsn, runs)[1], (client / n, None if server is None else server / n)


# -- one machine: the embedded host ------------------------------------------------------------------
#: HOST N DATA_DIR IN_FLIGHT: tasks/s of one Runtime keeping IN_FLIGHT `true` tasks in flight.
HOST = r"""
import sys, time
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime
n, data, k = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
data.mkdir(mode=0o700)
rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=data.parent))
warm = int(sys.argv[4])
for _ in range(max(1, warm)):  # schema, first use and the standby launchers out of the way, as each worker's warm-up
    rt.wait(rt.submit(["true"], awaited=True))
window, t0 = [], time.perf_counter()
for _ in range(n):
    window.append(rt.submit(["true"], awaited=True))
    if len(window) >= k:
        rt.wait(window.pop(0))
for sub in window:
    rt.wait(sub)
print(n / (time.perf_counter() - t0))
rt.close()
"""


def embedded(n: int, tmp: Path, timeout: float, warm: int) -> float:
    """Tasks/s of one embedded host keeping 4 in flight, on a new data dir in ``tmp``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    try:
        done = subprocess.run([sys.executable, "-c", HOST, str(n), str(tmp / "embedded"), "4", str(warm)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise _fail("embedded host", timeout, "the host still running") from None
    if done.returncode != 0:
        raise SystemExit(f"bench_cluster: the embedded host failed: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.strip().splitlines()[-1])


# -- real `ql worker` processes -----------------------------------------------------------------------
#: More ``[plugin.cluster-fenced]`` settings of every worker (``--worker-setting claim_ahead=0``),
#: as TOML values.
WORKER_SETTINGS: dict[str, str] = {}


class Workers:
    """``count`` real ``ql worker`` processes (4 slots each), all opening specs with one key."""

    def __init__(self, dsn: str, count: int, tmp: Path, key_file: Path, prefix: tuple[str, ...] = (),
                 tag: str = "") -> None:
        """``prefix``: a command each worker runs under (``bench/worker_fsyncs.py``: strace); ``tag``:
        in the worker ids (each round's workers register ids of their own)."""
        self.dsn, self.count = dsn, count
        #: The runs of the last :func:`end_to_end` measurement.
        self.last_runs: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names = [f"bench{tag}-e{count}-{w}" for w in range(count)]
        for w, name in enumerate(self.names):
            d = tmp / f"w{count}-{w}"
            d.mkdir(mode=0o700)
            config = tmp / f"w{count}-{w}.toml"
            config.write_text(f'profile = "cluster-worker"\ndata_dir = "{d}"\ndatabase_url = "{dsn}"\n'
                              f'[plugin.cluster-fenced]\nworker_id = "{name}"\nslots = 4\n'
                              f'spec_key_file = "{key_file}"\n'
                              + "".join(f"{k} = {v}\n" for k, v in WORKER_SETTINGS.items()))
            env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
            env["QL_CONFIG"] = str(config)
            with open(d.parent / f"w{count}-{w}.log", "wb") as log:
                self.procs.append(subprocess.Popen([*prefix, sys.executable, "-m", "ql_core.cli.main", "worker"], env=env,
                                                   stdout=subprocess.DEVNULL, stderr=log))

    def wait_registered(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                n = conn.execute("SELECT count(*) FROM ql_worker WHERE id = ANY(%s) AND status = 'active'",
                                 (self.names,)).fetchone()[0]
                if n == self.count:
                    return
                self.check_alive()
                if time.monotonic() > deadline:
                    raise _fail(f"{self.count} workers registering", timeout, f"{n} registered")
                time.sleep(0.05)

    def check_alive(self) -> None:
        if any(p.poll() is not None for p in self.procs):
            raise SystemExit("bench_cluster: a ql worker exited; its stderr is in the bench's temp dir "
                             "(run one by hand with its config to see why)")

    def drain(self, runs: list[str], phase: str, timeout: float) -> None:
        """Until every one of ``runs`` ended (else stop loudly with what was seen).

        Each look asks only about the oldest :data:`DRAIN_LOOK` runs not seen ended yet (runs are
        claimed oldest first, so they end about in order): a look at every run, 20 times a second,
        cost its PostgreSQL backend a third of a CPU at 3000 runs — taken from the workers measured."""
        import psycopg

        deadline = time.monotonic() + timeout
        pending = list(runs)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while pending:
                ended = {r[0] for r in conn.execute("SELECT id FROM ql_run WHERE id = ANY(%s) AND status = ANY(%s)",
                                                    (pending[:DRAIN_LOOK], list(TERMINAL)))}
                if ended:
                    pending = [r for r in pending[:DRAIN_LOOK] if r not in ended] + pending[DRAIN_LOOK:]
                    if len(ended) == DRAIN_LOOK:
                        continue  # behind: look again at once
                self.check_alive()
                if time.monotonic() > deadline:
                    raise _fail(phase, timeout, str(_status_counts(self.dsn, runs)))
                time.sleep(0.05)
        counts = _status_counts(self.dsn, runs)
        if counts.get("succeeded", 0) != len(runs):
            raise SystemExit(f"bench_cluster: {phase}: not every run succeeded: {counts}")

    def cpu_s(self) -> tuple[float, float, float]:
        """CPU seconds (user + sys) of the worker processes, of their reaped children (the
        launchers and their tasks), and of the PostgreSQL backends of their connections (0 when the
        server is not on this machine), from /proc: per task, unlike a rate, not moved by other load.
        A backend is counted while it lives: the workers keep their connections open."""
        import psycopg

        own = children = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for p in self.procs:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            own += (int(fields[11]) + int(fields[12])) / tick
            children += (int(fields[13]) + int(fields[14])) / tick
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'").fetchall()]
        server = sum(cpu for cpu in map(_backend_cpu_s, pids) if cpu is not None)
        return own, children, server

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def end_to_end(workers: Workers, n: int, key_file: Path, timeout: float) -> float:
    runs, _ = _submit(workers.dsn, n, key_file)
    workers.drain(runs, f"{workers.count} ql workers", timeout)
    workers.last_runs = runs
    return _rates(workers.dsn, runs)[1]


def runs_per_claim(dsn: str, run_ids: list[str]) -> float:
    """How many runs one claim took, on average: a claim's leases share its worker and its database
    time (``claimed_at_ms``), so two claims of one worker in the same millisecond count as one (a
    slight overestimate). A worker's CPU per task moves with it: each claim is a claim, a local
    commit and a ``start`` call, whatever it takes — a worker that refills each slot the moment it
    frees claims one run at a time."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        runs, claims = conn.execute("SELECT count(*), count(DISTINCT (worker_id, claimed_at_ms)) FROM ql_attempt_lease"
                                    " WHERE run_id = ANY(%s)", (run_ids,)).fetchone()
    return runs / max(1, claims)


def burst(workers: Workers, n: int, key_file: Path, timeout: float) -> dict[str, float]:
    """``n`` runs submitted at once to idle workers: submit seconds, drain seconds, drain rate."""
    import psycopg

    runs, submit_s = _submit(workers.dsn, n, key_file)
    workers.drain(runs, f"burst of {n}", timeout)
    with psycopg.connect(workers.dsn, autocommit=True) as conn:
        first, last = conn.execute("SELECT min(created_at_ms), max(updated_at_ms) FROM ql_run WHERE id = ANY(%s)",
                                   (runs,)).fetchone()
    drain_s = max(0.001, (last - first) / 1000)
    return {"submit_s": submit_s, "drain_s": drain_s, "drain_per_s": n / drain_s}


def latency(workers: Workers, n: int, key_file: Path, timeout: float) -> dict[str, float]:
    """Enqueue → exec of ``n`` runs submitted one at a time to idle workers (ms: p50, p99)."""
    import psycopg

    lat = []
    stages: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + timeout
    with psycopg.connect(workers.dsn, autocommit=True) as conn:
        for _ in range(n):
            (run_id,), _ = _submit(workers.dsn, 1, key_file)
            while True:
                row = conn.execute("SELECT a.started_at_ms - r.created_at_ms, r.status, l.claimed_at_ms - r.created_at_ms,"
                                   " l.started_at_ms - l.claimed_at_ms, a.started_at_ms - l.started_at_ms"
                                   " FROM ql_run r JOIN ql_run_attempt a ON a.run_id = r.id"
                                   " JOIN ql_attempt_lease l ON l.attempt_id = a.id WHERE r.id = %s",
                                   (run_id,)).fetchone()
                if row is not None and row[0] is not None and row[1] in TERMINAL:
                    lat.append(float(row[0]))
                    stages.append(row[2:5])
                    break
                workers.check_alive()
                if time.monotonic() > deadline:
                    raise _fail("latency", timeout, f"{len(lat)} of {n} runs measured")
                time.sleep(0.01)
    lat.sort()
    return {"p50_ms": statistics.median(lat), "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            # where the time goes (p50 of each step): enqueue -> claim -> start call -> process start
            "claim_p50_ms": statistics.median(s[0] for s in stages),
            "start_p50_ms": statistics.median(s[1] for s in stages),
            "spawn_p50_ms": statistics.median(s[2] for s in stages)}


def one_round(dsn: str, args: argparse.Namespace, tmp: Path, key_file: Path,
              res: dict[str, Any] | None) -> dict[str, Any]:
    """The embedded host, then each worker count (fresh ``ql worker`` processes in ``tmp``): one
    round's rates. ``res``: the last round, which also runs the burst and the latency phases into it."""
    timeout = args.phase_timeout
    out: dict[str, Any] = {"embedded_per_s": embedded(args.embedded_n, tmp, timeout, args.warmup_n), "workers": []}
    print(f"  embedded host: {out['embedded_per_s']:.0f}/s", file=sys.stderr, flush=True)
    for k in args.worker_counts:
        workers = Workers(dsn, k, tmp, key_file, tag=f"-{tmp.name}")
        try:
            workers.wait_registered(timeout)
            if args.warmup_n > 0:
                warm, _ = _submit(dsn, args.warmup_n * k, key_file)
                workers.drain(warm, f"warm-up of {k} ql workers", timeout)
            cpu0 = workers.cpu_s()
            rate = end_to_end(workers, args.e2e_n, key_file, timeout)
            cpu1 = workers.cpu_s()
            out["workers"].append({"workers": k, "completions_per_s": rate,
                                   "worker_cpu_ms": [round((b - a) * 1000 / args.e2e_n, 2)
                                                     for a, b in zip(cpu0, cpu1)],
                                   "runs_per_claim": round(runs_per_claim(dsn, workers.last_runs), 2)})
            print(f"  {k} ql workers: {rate:.0f}/s", file=sys.stderr, flush=True)
            if res is not None and k == max(args.worker_counts):
                if args.burst_n > 0:  # --burst-n 0: no burst phase (nor its goal)
                    res["burst"] = dict(burst(workers, args.burst_n, key_file, timeout), n=args.burst_n)
                if args.latency_n > 0:  # --latency-n 0: no latency phase (nor its goal)
                    res["latency"] = dict(latency(workers, args.latency_n, key_file, timeout), n=args.latency_n)
        finally:
            workers.stop()
    return out


def _rate(one: dict[str, Any], j: int) -> float:
    """The ``j``-th worker count's completions/s in the round ``one``."""
    return one["workers"][j]["completions_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor-n", type=int, default=1000, help="floor updates per client")
    parser.add_argument("--protocol-n", type=int, default=1000, help="runs per protocol measurement")
    parser.add_argument("--calls", choices=("batch", "single"), default="batch",
                        help="protocol clients: one transaction per claim's batch, or one call per attempt")
    parser.add_argument("--claim-batch", type=int, default=MAX_CLAIM,
                        help=f"protocol clients: runs per claim (default {MAX_CLAIM}, the most one claim takes; "
                             "the clients register 64 slots)")
    # 1000, not 200: 200 runs took ~1 s with 4 workers, a window a moment's load on a shared machine moved by a
    # third (4 workers against 1: 0.89x-1.66x in three runs of the same code).
    parser.add_argument("--embedded-n", type=int, default=1000, help="tasks of the embedded host")
    parser.add_argument("--e2e-n", type=int, default=1000, help="runs per ql worker measurement")
    parser.add_argument("--warmup-n", type=int, default=16,
                        help="runs per worker drained before each worker measurement, and tasks of the embedded host "
                             "before its own, not measured")
    parser.add_argument("--burst-n", type=int, default=1000, help="runs of the burst (the issue's goal: 10000; 0: no burst phase)")
    parser.add_argument("--latency-n", type=int, default=40, help="runs of the latency measurement (0: no latency phase)")
    parser.add_argument("--phase-timeout", type=float, default=600.0, help="seconds before a phase fails loudly")
    parser.add_argument("--protocol-only", action="store_true", help="only the floor and the protocol clients")
    parser.add_argument("--protocol-clients", type=lambda v: tuple(int(k) for k in v.split(",")),
                        default=PROTOCOL_COUNTS, help="client counts of the floor and protocol phases (e.g. 4 or 1,4)")
    parser.add_argument("--workers-only", action="store_true",
                        help="skip the floor and the protocol clients (the embedded host and ql workers only)")
    parser.add_argument("--worker-counts", type=lambda v: tuple(int(k) for k in v.split(",")), default=WORKER_COUNTS,
                        help="how many ql workers each worker phase runs (e.g. 1 for an A/B of one worker; the burst "
                             "and the latency go to the largest)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the embedded host and the worker phases, alternated; rates and the "
                             "goals' ratios are the medians of the rounds' (1: one round, as before)")
    parser.add_argument("--worker-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a [plugin.cluster-fenced] setting of every worker, as TOML (repeatable; e.g. "
                             "claim_ahead=0 for an A/B of claiming ahead)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for setting in args.worker_setting:
        key, eq, value = setting.partition("=")
        if not eq or not key.strip() or not value.strip():
            parser.error(f"--worker-setting wants KEY=VALUE, not {setting!r}")
        WORKER_SETTINGS[key.strip()] = value.strip()
    import psycopg

    from ql_plugins.cluster_fenced.sealing import new_key_file

    t_start = time.monotonic()
    timeout = args.phase_timeout
    header = (f"# python bench/bench_cluster.py {' '.join(sys.argv[1:])}\n# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  "
              f"{os.cpu_count()} CPUs  load {os.getloadavg()[0]:.2f}  python {sys.version.split()[0]}")
    print(header, flush=True)
    res: dict[str, Any] = {"protocol": [], "workers": []}
    with scratch_database() as (_url, dsn):
        tmp = Path(tempfile.mkdtemp(prefix="ql-bench-cluster-"))
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE bench_floor (id integer PRIMARY KEY, n integer NOT NULL)")
                conn.execute("INSERT INTO bench_floor SELECT g, 0 FROM generate_series(0, %s) g",
                             (args.floor_n * max(args.protocol_clients),))
            for k in () if args.workers_only else args.protocol_clients:
                floor, floor_cpu = floor_rate(dsn, k, args.floor_n, timeout)
                done, done_cpu = protocol(dsn, k, args.protocol_n, args.calls, args.claim_batch, timeout)
                res["protocol"].append({"clients": k, "floor_per_s": floor, "completions_per_s": done,
                                        "floor_cpu_ms": _ms(floor_cpu), "completion_cpu_ms": _ms(done_cpu)})
                print(f"  protocol x{k}: floor {floor:.0f}/s, completions {done:.0f}/s", file=sys.stderr, flush=True)
            if args.protocol_only:
                return report_protocol(res, args)
            key_file = tmp / "spec.key"  # the workers open the specs with the submitter's key
            new_key_file(key_file)
            rounds: list[dict[str, Any]] = []
            for i in range(args.rounds):
                last = i == args.rounds - 1
                here = tmp / f"round{i}"
                here.mkdir()
                rounds.append(one_round(dsn, args, here, key_file, res if last else None))
            res["rounds"] = rounds
            res["embedded_per_s"] = statistics.median(r["embedded_per_s"] for r in rounds)
            # Each worker count's rate, and its ratios as the goals take them: each round's ratio
            # (both sides under the same moment's load), then their median — not the medians' ratio.
            res["workers"] = [dict(r, completions_per_s=statistics.median(_rate(x, j) for x in rounds),
                                   vs_embedded=statistics.median(_rate(x, j) / x["embedded_per_s"] for x in rounds),
                                   vs_first=statistics.median(_rate(x, j) / _rate(x, 0) for x in rounds))
                              for j, r in enumerate(rounds[-1]["workers"])]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = time.monotonic() - t_start
    if args.json:
        print(json.dumps(res))
        return
    report(res, args)


def _ms(cpu: tuple[float, float | None]) -> list[float | None]:
    """(client, server) CPU seconds -> milliseconds."""
    return [cpu[0] * 1000, None if cpu[1] is None else cpu[1] * 1000]


def _cpu_text(ms: list[float | None]) -> str:
    client, server = ms
    return f"{client:.3f}+{'?' if server is None else f'{server:.3f}'}"


def report_protocol(res: dict[str, Any], args: argparse.Namespace) -> None:
    # CPU ms (client + server backend) per floor row and per completion: the load-independent cost
    # (wall rates on a shared machine move with everyone else's load; CPU per unit does not).
    print(f"\n{'protocol clients':>16} {'floor/s':>9} {'completions/s':>14} {'vs floor':>9}   "
          f"{'CPU ms/row':>12} {'CPU ms/completion':>18} {'CPU vs floor':>12}   ({args.calls} calls, {args.claim_batch} per claim)")
    for r in res["protocol"]:
        f, c = r["floor_cpu_ms"], r["completion_cpu_ms"]
        ratio = "" if None in (f[1], c[1]) else f"{(f[0] + f[1]) / (c[0] + c[1]):>11.3f}x"
        print(f"{r['clients']:>16} {r['floor_per_s']:>9.0f} {r['completions_per_s']:>14.0f} "
              f"{r['completions_per_s'] / r['floor_per_s']:>8.3f}x   {_cpu_text(f):>12} {_cpu_text(c):>18} {ratio:>12}")


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    if res["protocol"]:  # none with --workers-only
        report_protocol(res, args)
    emb = res["embedded_per_s"]
    rounds = res["rounds"]
    print(f"\nembedded host, 4 in flight: {emb:.0f} tasks/s")
    first = f"vs {res['workers'][0]['workers']} worker"
    print(f"{'ql workers (4 slots)':>20} {'completions/s':>14} {'vs embedded':>12} {first:>12} {'runs/claim':>11}"
          f"  CPU ms/task (workers + their launchers and tasks + their PostgreSQL backends)"
          + (f"\n{'':>20} (rates: medians of {len(rounds)} rounds; ratios: medians of each round's ratios; "
             f"runs/claim and CPU: the last round's)"
             if len(rounds) > 1 else ""))
    for r in res["workers"]:
        c = r["completions_per_s"]
        own, children, server = r["worker_cpu_ms"]
        print(f"{r['workers']:>20} {c:>14.0f} {r['vs_embedded']:>11.3f}x {r['vs_first']:>11.2f}x "
              f"{r['runs_per_claim']:>11.2f}"
              f"  {own:.2f} + {children:.2f} + {server:.2f}")
    if len(rounds) > 1:
        print("rounds, tasks/s:  embedded " + " / ".join(f"{r['embedded_per_s']:.0f}" for r in rounds) + "; "
              + "; ".join(f"{w['workers']} worker{'s' if w['workers'] > 1 else ''} "
                          + " / ".join(f"{_rate(r, j):.0f}" for r in rounds)
                          for j, w in enumerate(res["workers"])))
    b, lat = res.get("burst"), res.get("latency")
    most = res["workers"][-1]["workers"]
    four = rounds[-1]["workers"][-1]["completions_per_s"]  # the burst's own round: the same moment's load
    if b is not None:
        print(f"\nburst of {b['n']} runs to {most} idle workers: submitted in {b['submit_s']:.2f}s "
              f"({b['n'] / b['submit_s']:.0f}/s), drained in {b['drain_s']:.1f}s ({b['drain_per_s']:.0f}/s, "
              f"{b['drain_per_s'] / four:.2f}x the {most}-worker rate)")
    if lat is not None:
        print(f"enqueue -> exec, idle workers, {lat['n']} runs: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms "
              f"(p50 of each step: enqueue -> claim {lat['claim_p50_ms']:.1f}, claim -> start {lat['start_p50_ms']:.1f}, "
              f"start -> process {lat['spawn_p50_ms']:.1f} ms)")
    print(f"(whole bench: {res['seconds']:.0f}s)")
    p4 = next((r for r in res["protocol"] if r["clients"] == 4), None)
    goals = [] if p4 is None else [  # None: --workers-only
        (f"protocol, 4 clients >= 0.5 of the floor with 4 clients ({p4['completions_per_s'] / p4['floor_per_s']:.3f})",
         p4["completions_per_s"] >= 0.5 * p4["floor_per_s"]),
    ]
    counts = [r["workers"] for r in res["workers"]]
    of = f", the median of {len(rounds)} rounds' ratios" if len(rounds) > 1 else ""
    if counts[0] == 1:
        vs_emb = res["workers"][0]["vs_embedded"]
        goals.append((f"1 ql worker (4 slots) >= 0.5 of one embedded host at 4 in flight ({vs_emb:.3f}{of})",
                      vs_emb >= 0.5))
    if counts[0] == 1 and most == 4:
        vs_one = res["workers"][-1]["vs_first"]
        goals.append((f"4 ql workers >= 1.5x 1 worker ({vs_one:.2f}x{of})", vs_one >= 1.5))
    if b is not None:
        goals.append((f"burst drained at >= 0.5 of the {most}-worker steady rate ({b['drain_per_s'] / four:.2f}x"
                      + (f"; the goal's burst is 10000 runs, this one {b['n']})" if b["n"] < 10_000 else ")"),
                      b["drain_per_s"] >= 0.5 * four))
    if lat is not None:
        goals.append((f"enqueue -> exec p50 with idle workers <= 10 ms ({lat['p50_ms']:.1f} ms)", lat["p50_ms"] <= 10.0))
    print("\ngoals (issue 24 acceptance)")
    for label, ok in goals:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")


if __name__ == "__main__":
    main()
