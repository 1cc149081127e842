"""Where one ``ql worker``'s CPU goes per task: cProfile in every thread, and CPU by thread role.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/worker_profile.py --n 400

One worker (4 slots) runs ``true`` tasks under this script's ``--child`` wrapper, which profiles
every thread of the worker with its own ``cProfile.Profile`` (a profiler sees only its own thread)
and notes each thread's CPU (``time.thread_time``) when it ends. ``--n`` runs are queued and
drained after a warm-up, the worker is stopped (SIGTERM: its threads end), and the report is CPU ms
per task by thread role, then the top functions by own time over all threads. The profiler slows
the worker (about 2x here): read the shares, not the absolute numbers (``bench_cluster.py`` has those).

``--no-profile``: no profiler; each thread's CPU per task from ``/proc``, each of the worker's
PostgreSQL backends', and the control-database calls per task by function (``track_functions``,
when the role may set it) with the server's time in each, per task and per call, and the
database's transactions per task. The counts, unlike CPU times, do not move with other load on a
shared machine: compare them first.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import pstats
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(out: Path, argv: list[str]) -> None:
    """The worker itself, every thread profiled (``argv``: ``python -m ql_core.cli.main worker``)."""
    import cProfile
    import threading

    live: dict[int, tuple[cProfile.Profile, threading.Thread]] = {}

    def dump(prof: cProfile.Profile, ident: int, name: str) -> None:
        prof.create_stats()
        stem = out / f"{os.getpid()}-{ident}"
        prof.dump_stats(f"{stem}.prof")
        # CPU of the thread = the profiler's total on its thread-CPU clock.
        cpu = sum(v[2] for v in prof.stats.values())  # type: ignore[attr-defined]
        # The role, not the attempt: runner threads rename themselves per attempt.
        Path(f"{stem}.json").write_text(json.dumps({"name": re.sub(r"ql-attempt-.*", "ql-attempt", name),
                                                    "cpu_s": cpu}))

    original = threading.Thread.run
    if os.environ.get("BENCH_WORKER_NO_PROFILE"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

        def named(self: threading.Thread) -> None:
            # The kernel's name of the thread (its role): /proc/PID/task/TID/stat says its CPU.
            libc.prctl(15, re.sub(r"ql-attempt-.*", "ql-attempt", self.name)[:15].encode(), 0, 0, 0)
            original(self)

        threading.Thread.run = named  # type: ignore[method-assign]
        from ql_core.cli.main import main as ql_main


        os._exit(ql_main(argv[argv.index("-m") + 2:]))

    def own_cpu_clock() -> Any:
        # The calling thread's CPU clock, by its id — not time.thread_time, which reads the clock of
        # whichever thread calls it: a thread still running at the end is dumped from the main
        # thread, and its open calls were then timed as main-thread CPU minus its own (garbage:
        # seconds per idle waiting thread). Waits (locks, fsync, the network) cost nothing here.
        return functools.partial(time.clock_gettime, time.pthread_getcpuclockid(threading.get_ident()))

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile(own_cpu_clock())
        live[threading.get_ident()] = (prof, self)
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()
            live.pop(threading.get_ident(), None)
            dump(prof, threading.get_ident(), self.name)

    threading.Thread.run = run  # type: ignore[method-assign]
    from ql_core.cli.main import main as ql_main

    prof = cProfile.Profile(own_cpu_clock())
    prof.enable()
    try:
        ql_main(argv[argv.index("-m") + 2:])
    finally:
        prof.disable()
        dump(prof, 0, "main (control loop)")
        for ident, (p, thread) in list(live.items()):  # still running (daemon threads): as they are now
            dump(p, ident, thread.name)
        os._exit(0)


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each of the process's threads, summed by name (``/proc/PID/task``)."""
    by: collections.Counter[str] = collections.Counter()
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        by[name] += (int(fields[11]) + int(fields[12])) / tick
    return dict(by)


def _backend_cpu(dsn: str) -> dict[tuple[int, str], float]:
    """CPU seconds of every other client backend of the database, by (pid, application_name)."""
    import psycopg
    from bench_cluster import _backend_cpu_s

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
                            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchall()
    return {(pid, name): cpu for pid, name in rows if (cpu := _backend_cpu_s(pid)) is not None}


def _track_functions(dsn: str) -> bool:
    """Have the database count each worker function's calls (``pg_stat_user_functions``): needs a
    role that may set ``track_functions``; False (no counts) otherwise."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            db = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute(f'ALTER DATABASE "{db}" SET track_functions = \'all\'')
    except psycopg.Error:
        return False
    return True


def _calls(dsn: str) -> tuple[dict[str, tuple[int, float]], int]:
    """Calls of each ``ql_`` function so far (batched ones count once per batch) with the server's
    total time in it (ms, the functions it calls included), and the database's committed + rolled
    back transactions. The counts are what other load does not move; the times say which
    function a round's wait is spent in (the control loop waits for each call)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls = {fn: (int(n), float(ms)) for fn, n, ms in conn.execute(
            "SELECT funcname, sum(calls)::bigint, sum(total_time) FROM pg_stat_user_functions"
            " WHERE funcname LIKE 'ql%%' AND funcname NOT LIKE 'ql\\_\\_%%' GROUP BY funcname").fetchall()}
        xacts = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                             " WHERE datname = current_database()").fetchone()[0]
    return calls, int(xacts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="tasks to run")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-profile", action="store_true",
                        help="no cProfile: each thread's CPU from /proc (threads named by role), each "
                             "backend's, and the control-database calls per task by function")
    parser.add_argument("--save", help="also write the merged profile here (for pstats: print_callees ...)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_cluster import Workers, end_to_end
    from pg_scratch import scratch_database

    from ql_plugins.cluster_fenced.sealing import new_key_file

    if args.no_profile:
        os.environ["BENCH_WORKER_NO_PROFILE"] = "1"

    with scratch_database() as (_url, dsn):
        tmp = Path(tempfile.mkdtemp(prefix="ql-bench-profile-"))
        out = tmp / "profiles"
        out.mkdir()
        try:
            key_file = tmp / "spec.key"
            new_key_file(key_file)
            counting = args.no_profile and _track_functions(dsn)  # before the worker connects
            workers = Workers(dsn, 1, tmp, key_file, prefix=(sys.executable, __file__, "--child", str(out)))
            try:
                workers.wait_registered(args.timeout)
                end_to_end(workers, 8, key_file, args.timeout)
                if counting:
                    time.sleep(0.6)  # the statistics collector's delay: the warm-up's counts are in
                    calls0, xacts0 = _calls(dsn)
                before = _thread_cpu(workers.procs[0].pid)
                backends0 = _backend_cpu(dsn)
                rate = end_to_end(workers, args.n, key_file, args.timeout)
                after = _thread_cpu(workers.procs[0].pid)
                backends1 = _backend_cpu(dsn)
                if counting:
                    time.sleep(0.6)
                    calls1, xacts1 = _calls(dsn)
                if args.no_profile:
                    print(f"# CPU ms per task by thread, {args.n} tasks at {rate:.0f}/s, no profiler "
                          f"(/proc/PID/task; a runner thread that ended mid-run is missing)")
                    for name in sorted(after, key=lambda k: -(after[k] - before.get(k, 0.0))):
                        print(f"  {name:>28}: {(after[name] - before.get(name, 0.0)) * 1000 / args.n:7.3f}")
                    print(f"  {'all':>28}: {(sum(after.values()) - sum(before.values())) * 1000 / args.n:7.3f}")
                    print("# CPU ms per task of the worker's PostgreSQL backends, by connection (application_name)")
                    for (pid, name), cpu in sorted(backends1.items(), key=lambda kv: kv[0][1]):
                        if (pid, name) in backends0:  # connected for the whole measurement
                            print(f"  {name or '(unnamed)':>28}: {(cpu - backends0[(pid, name)]) * 1000 / args.n:7.3f}")
                    if counting:
                        # ql_submit is this script's own queueing; the transactions include its
                        # drain polls (one every 50 ms) and the statistics reads.
                        print("# control-database calls per task, by function (a batched function counts once per batch; pipelined calls and the functions a call runs count each), the server's ms in each per task and per call, and transactions")
                        for fn in sorted(calls1):
                            n = calls1[fn][0] - calls0.get(fn, (0, 0.0))[0]
                            ms = calls1[fn][1] - calls0.get(fn, (0, 0.0))[1]
                            if n:
                                print(f"  {fn:>28}: {n / args.n:7.3f}   {ms / args.n:6.3f} ms/task   {ms / n:6.3f} ms/call")
                        print(f"  {'transactions':>28}: {(xacts1 - xacts0) / args.n:7.3f}")
                    return
            finally:
                workers.stop()
            by_role: collections.Counter[str] = collections.Counter()
            for meta in out.glob("*.json"):
                d = json.loads(meta.read_text())
                by_role[d["name"]] += d["cpu_s"]
            stats = pstats.Stats(*[str(p) for p in out.glob("*.prof")], stream=sys.stdout)
            if args.save:
                stats.dump_stats(args.save)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    n = args.n + 8
    print(f"# python bench/worker_profile.py --n {args.n}: {rate:.0f}/s under the profiler; CPU ms per task "
          f"by thread (whole worker life, {n} tasks incl. warm-up)")
    for name, cpu in by_role.most_common():
        print(f"  {name:>28}: {cpu * 1000 / n:7.3f}")
    print(f"  {'all threads':>28}: {sum(by_role.values()) * 1000 / n:7.3f}")
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumtime").print_stats(args.top)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), sys.argv[3:])
    else:
        main()
