"""Where the embedded submit → exec time goes, and the floor under it, measured in one run.

    python bench/bench_submit_floor.py [--n 300] [--warm 1500] [--dir /var/tmp]

ADR-0007 §2.2 fixes the order of a task's start: a durable *create* commit before any side effect
of the run, the launcher's durable handle before the command starts, the go-ahead last. ql starts a
task one of two ways (docs/launcher.md):

- **standby** (the default with the compiled launcher): a launcher started ahead of the run, so its
  handle is known first and the create commit records it — one durable commit, then the hand-over
  (the run's spec and the go-ahead in one message) and the command's exec;
- **classic** (``[plugin.local] standby = false``, or launcher.sh): create commit, launcher spawn,
  handle capture, *spawned* commit, go-ahead — two durable commits and two process starts.

This script measures, on the same file system and machine, in one run: the floor of the figure
(``Popen([stamp])`` from the call to the stamp's first instruction); the parts nobody can remove
(one SQLite commit in WAL mode with ``synchronous=FULL``, what ql commits with, and one ``Popen``
of the compiled launcher); and both paths of an embedded ``Runtime.submit(..., awaited=True)``,
step by step (timestamps taken when each step returns, by wrapping the runtime's collaborators),
each as a median and as a multiple of the floor. ``--warm`` tasks run first so that every receipt
and log shard exists (a new shard costs a directory fsync once).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The same stamp helper as bench_peers (its submit → exec figure is the one this script explains).
from bench_peers import STAMP_C, read_stamp  # noqa: E402

def build_stamp(work: Path) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("needs a C compiler for the stamp helper (cc or gcc)")
    src, out = work / "stamp.c", work / "stamp"
    src.write_text(STAMP_C)
    subprocess.run([cc, "-O2", "-o", str(out), str(src)], check=True)
    return str(out)


def median_ms(values: list[int]) -> float:
    return statistics.median(values) / 1e6


def floor_popen(stamp: str, work: Path, n: int) -> list[int]:
    out = []
    for i in range(n):
        path = work / f"floor-{i}"
        t0 = time.time_ns()
        proc = subprocess.Popen([stamp, str(path)])
        proc.wait()
        out.append(read_stamp(str(path))[0] - t0)
    return out


def sqlite_commit(work: Path, n: int) -> list[int]:
    db = sqlite3.connect(work / "floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (body) VALUES (?)", ("x" * 300,))
        db.execute("COMMIT")
        out.append(time.perf_counter_ns() - t0)
    db.close()
    return out


def launcher_popen(launcher: str, n: int) -> list[int]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        proc = subprocess.Popen([launcher], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
        out.append(time.perf_counter_ns() - t0)
        proc.wait()
    return out


def ql_phases(stamp: str, work: Path, n: int, warm: int, *, standby: bool) -> dict[str, list[int]]:
    import dataclasses

    from ql_core import logs
    from ql_core.config import load_config
    from ql_core.runtime import Runtime
    from ql_executors.local_process import executor as local

    data = work / ("data-standby" if standby else "data-classic")
    config = load_config(data_dir=data, environ={}, cwd=work)
    settings: dict[str, object] = {"standby": standby}
    if os.environ.get("QL_BENCH_CONTAINMENT"):  # compare: process-group | auto (docs/launcher.md)
        settings["containment"] = os.environ["QL_BENCH_CONTAINMENT"]
    config = dataclasses.replace(config, plugin_settings={"local": settings})
    rt = Runtime.open(config)
    marks: list[tuple[str, int]] = []

    def mark(owner: object, name: str, label: str) -> None:
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def wrapped(*args: object, **kwargs: object) -> object:
            result = inner(*args, **kwargs)
            marks.append((label, time.time_ns()))
            return result

        setattr(owner, name, wrapped)

    if standby:
        mark(rt.executor, "standby", "standby taken")
        mark(rt.journal, "create_running", "create commit (+handle)")
    else:
        mark(rt.journal, "create", "create commit")
    mark(rt.receipts, "prepare", "receipt shard")
    mark(logs, "open_log_artifact", "log file")
    if standby:
        mark(local, "hand_over", "hand-over")
    else:  # (the standby path captures its next standby's handle after the hand-over: not marked)
        mark(local, "spawn_launcher", "launcher spawn")
        mark(local.identity, "capture_handle", "handle capture")
        mark(rt.completion, "record_spawned", "spawned commit")
        mark(rt.executor, "release", "release")
    for _ in range(warm):
        rt.wait(rt.submit(["true"], awaited=True))
    phases: dict[str, list[int]] = {}
    for i in range(n):
        marks.clear()
        path = work / f"ql-{'s' if standby else 'c'}-{i}"
        t0 = time.time_ns()
        rt.wait(rt.submit([stamp, str(path)], awaited=True))
        started = read_stamp(str(path))[0]
        previous = t0
        for label, at in marks:
            if at > started:
                break  # after the command started (a standby kept ready for the next task)
            phases.setdefault(label, []).append(at - previous)
            previous = at
        phases.setdefault("go-ahead → exec", []).append(started - previous)
        phases.setdefault("TOTAL", []).append(started - t0)
    rt.close()
    return phases


def print_phases(title: str, phases: dict[str, list[int]], base: float) -> float:
    print(title)
    for label, values in phases.items():
        if label != "TOTAL":
            print(f"  {label:<24} {median_ms(values):7.3f} ms")
    total = median_ms(phases["TOTAL"])
    print(f"  {'TOTAL':<24} {total:7.3f} ms  ({total / base:.2f}× the floor)")
    print()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--warm", type=int, default=1500)
    parser.add_argument("--dir", default="/var/tmp", help="where the data dir lives (a real disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ql-bench-floor-") as tmp:
        work = Path(tmp)
        stamp = build_stamp(work)
        from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher

        try:
            launcher: str | None = compiled_launcher(os.environ)
        except CompiledLauncherError as exc:
            launcher = None
            print(f"# no compiled launcher ({exc}): ql runs launcher.sh; its start is not measured bare")
        floor_popen(stamp, work, 20)  # warm the page cache for the stamp
        floor = floor_popen(stamp, work, args.n)
        commit = sqlite_commit(work, args.n)
        spawn = launcher_popen(launcher, args.n) if launcher else []
        standby = ql_phases(stamp, work, args.n, args.warm, standby=True)
        classic = ql_phases(stamp, work, args.n, args.warm, standby=False)
        floor2 = floor_popen(stamp, work, args.n)  # again after: the machine did not drift
        base = median_ms(floor + floor2)

        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {os.cpu_count()} CPUs  python {sys.version.split()[0]}  "
              f"n={args.n}  data dir on {args.dir}  launcher: {'compiled' if launcher else 'launcher.sh'}")
        print(f"floor: Popen([stamp]) call → first instruction  {base:.3f} ms  (1.00×)")
        print()
        total = print_phases("ql embedded submit → exec, standby path (the default), by step "
                             "(each: from the previous step's return)", standby, base)
        print_phases("classic path ([plugin.local] standby = false), by step", classic, base)
        c = median_ms(commit)
        s = median_ms(spawn) if spawn else float("nan")
        g = median_ms(standby["go-ahead → exec"])
        irreducible = c + g
        print("parts ADR-0007 §2.2 makes mandatory, measured bare in this run")
        print(f"  SQLite commit, WAL + synchronous=FULL   {c:.3f} ms  (standby path: 1 before exec; classic: 2)")
        print(f"  Popen of the compiled launcher (→ return) {s:.3f} ms  (classic path only: standby's is off the path)")
        print(f"  hand-over → the command's first instruction {g:.3f} ms  (wake-up, fork, exec, loader)")
        print(f"  standby sum {irreducible:.3f} ms = {irreducible / base:.2f}× the floor; everything else ql does "
              f"(ids, token hash, SQL, shard and log checks, the spec message): {total - irreducible:.3f} ms")


if __name__ == "__main__":
    main()
