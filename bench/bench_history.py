"""What a history of N runs costs: rounds, idle `ql supervise`, purging, and `ql list --status`.

Run: ``python bench/bench_history.py [--sizes 0,100,10000,100000,1000000] [--idle-seconds 60]
[--dir /var/tmp]`` (prints the command it ran first).

For each size N, a fresh data dir gets N succeeded runs built by
:func:`ql_plugins.edge_sqlite.history_fill.fill_history`: the rows the journal's create and terminal commits write
(run, attempt, log artifact, 4 events, the log's recorded size; no journal row — consumed), written
with the edge-sqlite store's own prebuilt INSERT statements by ``executemany``, 20 000 runs per
transaction, instead of three commits and a process per task. Then, in one run of this script:

1. **idle round** — CPU (``time.process_time``) of one ``Reconciler.round()`` (standalone limits,
   history within ``history_max_runs``/``history_retention_s``: nothing to do), mean of 20 after a
   warm-up round; the goal is ≤ 2× the empty data dir's;
2. **idle `ql supervise`** — a real ``ql supervise`` process per profile (edge: 30 s rounds,
   standalone: 5 s), its CPU (``/proc/<pid>/stat`` utime+stime) over ``--idle-seconds`` after its
   startup round, as a share of one core; goals ≤ 0.2 % (edge) and ≤ 1 % (standalone) at 1M;
3. **purging** — ``history_max_runs`` lowered to N − P (P = min(N/2, 5 000); their P log files
   created on disk first), then rounds until nothing is left to purge: CPU and wall per round, runs
   purged per second of round wall time ("purge rate"), against the **embedded task rate** — the
   same host's ``Runtime.run(["true"])`` in a loop (200 tasks, standalone, wall) measured in this
   run; goal: purge rate ≥ 1× task rate. With the default ``retention_budget_ms`` a round stops at the
   budget and the supervisor's next round follows after a pause of the same length, so the
   sustained purge rate is at least half of the rate shown (printed as well);
4. **`ql list --status succeeded`** — the CPU of the child process (``RUSAGE_CHILDREN``; Python's
   startup included, so a loaded machine adds noise), median of 11 runs interleaved across the
   sizes at the end; and its store reads alone
   (``Runtime.list_runs(status="succeeded", limit=50)`` in-process, mean of 200); goal: at 1M
   ≤ 1.2× at 100.

Ratios are printed against their floor (the empty data dir, the 100-run one, the task rate).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QL = [sys.executable, "-m", "ql_core.cli.main"]
ROUNDS = 20


def open_runtime(data_dir: Path, profile: str = "standalone", **limits: Any) -> Any:
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    config = load_config(data_dir=data_dir, profile=profile, environ={}, cwd=data_dir)
    if limits:
        config = dataclasses.replace(config, profile=config.profile.with_overrides(limits))
    return Runtime.open(config)


def build(work: Path, n: int) -> tuple[Path, float]:
    from ql_plugins.edge_sqlite.history_fill import fill_history

    data = work / f"data-{n}"
    data.mkdir(mode=0o700)
    rt = open_runtime(data, history_max_runs=10_000_000)
    started = time.monotonic()
    # Created over the last n ms .. now - 60 s: inside every retention window, all kept.
    fill_history(rt.journal, n, owner=rt.node_id, start_ms=int(time.time() * 1000) - n - 60_000, log_bytes=64)
    took = time.monotonic() - started
    rt.close()
    return data, took


def idle_round_cpu(data: Path) -> float:
    from ql_core.reconciler import Reconciler

    rt = open_runtime(data, history_max_runs=10_000_000)
    try:
        rec = Reconciler(rt.node)
        rec.round()
        started = time.process_time()
        for _ in range(ROUNDS):
            report = rec.round()
        cpu = (time.process_time() - started) / ROUNDS
        assert report.counts["history_purged"] == 0
    finally:
        rt.close()
    return cpu


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def supervise_share(data: Path, work: Path, profile: str, seconds: float) -> float:
    config = work / f"{profile}.toml"
    config.write_text(f'profile = "{profile}"\n\n[limits]\nhistory_max_runs = 10000000\n'
                      f"history_retention_s = 31536000.0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    proc = subprocess.Popen(QL + ["--config", str(config), "--data-dir", str(data), "supervise"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "supervising" in line, (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        time.sleep(3.0)  # the startup round (a full round) is behind us
        cpu0, t0 = _proc_cpu(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = _proc_cpu(proc.pid), time.monotonic()
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    return (cpu1 - cpu0) / (t1 - t0)


def purge(data: Path, n: int) -> dict[str, Any]:
    from ql_core.paths import ensure_private_dir, log_path, logs_root
    from ql_core.reconciler import Reconciler

    p = min(n // 2, 5_000)
    if p == 0:
        return {}
    rt = open_runtime(data, history_max_runs=max(10, n - p))
    try:
        oldest = [r[0] for r in rt.journal._db.connection().execute(
            "SELECT l.id FROM ql_run r JOIN ql_log_artifact l ON l.run_id = r.id "
            "ORDER BY r.created_at_ms, r.id LIMIT ?", (p,))]
        ensure_private_dir(logs_root(data))
        for log_id in oldest:  # the files the purge deletes first
            path = log_path(data, log_id)
            ensure_private_dir(path.parent)
            path.write_bytes(b"x" * 64)
        rec = Reconciler(rt.node)
        rounds, purged, cpu, wall = 0, 0, 0.0, 0.0
        first_cpu = first_purged = 0
        while True:
            c0, w0 = time.process_time(), time.monotonic()
            report = rec.round()
            c1, w1 = time.process_time(), time.monotonic()
            got = report.counts["history_purged"]
            if rounds == 0:
                first_cpu, first_purged = c1 - c0, got
            if not got:
                break
            rounds += 1
            purged += got
            cpu += c1 - c0
            wall += w1 - w0
    finally:
        rt.close()
    return {"p": p, "rounds": rounds, "purged": purged, "cpu_s": cpu, "wall_s": wall,
            "first_cpu_s": first_cpu, "first_purged": first_purged}


def task_rate(work: Path, n: int = 200) -> tuple[float, float]:
    data = work / "tasks"
    data.mkdir(mode=0o700)
    rt = open_runtime(data)
    try:
        for _ in range(10):
            rt.run(["true"])
        c0, w0 = time.process_time(), time.monotonic()
        for _ in range(n):
            rt.run(["true"])
        return n / (time.monotonic() - w0), (time.process_time() - c0) / n
    finally:
        rt.close()


def list_views_cpu(data: Path, calls: int = 200) -> float:
    """The store's part of `ql list --status succeeded` in-process: runs + their attempts, 50 rows."""
    rt = open_runtime(data, history_max_runs=10_000_000)
    try:
        rt.list_runs(status="succeeded", limit=50)
        started = time.process_time()
        for _ in range(calls):
            rt.list_runs(status="succeeded", limit=50)
        return (time.process_time() - started) / calls
    finally:
        rt.close()


LIST_ROUNDS = 11


def list_cpu(data: Path, tries: int = 5) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    best = float("inf")
    for _ in range(tries):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(QL + ["--data-dir", str(data), "--json", "list", "--status", "succeeded"], env=env,
                             capture_output=True, text=True, timeout=300)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert out.returncode == 0, out.stderr
        best = min(best, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,100,10000,100000,1000000")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("$ python " + " ".join(sys.argv), flush=True)
    work = Path(tempfile.mkdtemp(prefix="ql-bench-history-", dir=args.dir))
    try:
        print(f"work dir {work}; python {sys.version.split()[0]}; {os.cpu_count()} cpus; "
              f"idle window {args.idle_seconds:g} s", flush=True)
        rate, task_cpu = task_rate(work)
        print(f"embedded task rate (standalone, Runtime.run(['true']) x200): {rate:,.1f} tasks/s, "
              f"{task_cpu * 1000:.2f} ms CPU per task", flush=True)
        rows: dict[int, dict[str, Any]] = {}
        for n in sizes:
            data, fill_s = build(work, n)
            row: dict[str, Any] = {"fill_s": fill_s, "db_mb": (data / "ql.db").stat().st_size / 1e6}
            row["idle_round_ms"] = idle_round_cpu(data) * 1000
            row["data"] = data
            row["edge_share"] = supervise_share(data, work, "edge", args.idle_seconds)
            row["standalone_share"] = supervise_share(data, work, "standalone", args.idle_seconds)
            row["purge"] = purge(data, n)
            rows[n] = row
            pr = row["purge"]
            purge_txt = "-"
            if pr:
                per_run = pr["cpu_s"] / max(1, pr["purged"])
                prate = pr["purged"] / pr["wall_s"] if pr["wall_s"] else float("inf")
                row["purge_rate"] = prate
                purge_txt = (f"purged {pr['purged']} in {pr['rounds']} rounds, first round {pr['first_purged']} runs "
                             f"{pr['first_cpu_s'] * 1000:.0f} ms CPU; {per_run * 1000:.3f} ms CPU/run; "
                             f"rate {prate:,.0f} runs/s = {prate / rate:.1f}x task rate "
                             f"(sustained >= {prate / 2 / rate:.1f}x)")
            print(f"\nN={n:>9,}: built in {fill_s:.1f} s, ql.db {row['db_mb']:.0f} MB\n"
                  f"  idle round      {row['idle_round_ms']:8.3f} ms CPU\n"
                  f"  ql supervise    edge {row['edge_share']:.3%} of a core, standalone {row['standalone_share']:.3%}\n"
                  f"  ql list --status succeeded: measured at the end, interleaved across sizes\n"
                  f"  purge           {purge_txt}", flush=True)
        # The `ql list` processes last, interleaved across sizes (a shared machine's load drifts over
        # the minutes each size takes; sequential samples would compare different loads).
        samples: dict[int, list[float]] = {n: [] for n in rows}
        reads: dict[int, list[float]] = {n: [] for n in rows}
        for _ in range(LIST_ROUNDS):
            for n, row in rows.items():
                samples[n].append(list_cpu(row["data"], tries=1) * 1000)
                reads[n].append(list_views_cpu(row["data"]) * 1000)
        print(f"\nql list --status succeeded, {LIST_ROUNDS} interleaved samples per size (medians): process CPU "
              f"(startup included) | its reads in-process (Runtime.list_runs, 50 rows, mean of 200 calls)")
        for n, row in rows.items():
            v, r = sorted(samples[n]), sorted(reads[n])
            row["list_ms"], row["list_views_ms"] = v[len(v) // 2], r[len(r) // 2]
            print(f"  N={n:>9,}: {row['list_ms']:.0f} ms (min {v[0]:.0f}) | {row['list_views_ms']:.3f} ms")
        floor = rows.get(0) or rows[min(rows)]
        ref = rows.get(100) or rows[min(rows)]
        print("\nratios (goal)")
        for n, row in rows.items():
            print(f"  N={n:>9,}: idle round {row['idle_round_ms'] / floor['idle_round_ms']:.2f}x empty (<= 2); "
                  f"list {row['list_ms'] / ref['list_ms']:.2f}x N=100 (<= 1.2; reads alone "
                  f"{row['list_views_ms'] / ref['list_views_ms']:.2f}x); "
                  f"supervise edge {row['edge_share']:.3%} (<= 0.2 %), standalone {row['standalone_share']:.3%} "
                  f"(<= 1 %); purge " + (f"{row['purge_rate'] / rate:.1f}x task rate (>= 1)" if "purge_rate" in row
                                         else "-"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
