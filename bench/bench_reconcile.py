"""Reconciler throughput at startup, and the idle supervisor's CPU and memory cost.

Run: ``python bench/bench_reconcile.py [--n 10000] [--idle-seconds 60] [--dir /var/tmp]``.

1. **Startup reconciliation with N pending receipts.** A host died after N tasks finished: the
   database holds N running attempts (inserted in one transaction, each with a known token whose
   SHA-256 is stored, a handle naming no live process) and the receipt store holds N valid receipts
   published with :class:`~ql_core.receipts.FileReceiptStore` (fsync on). Timed: one
   ``Reconciler.full_pass()`` under the *standalone* profile (rounds of 4 pages × 32), which must
   apply all N (one terminal commit each, then the receipt is deleted with a directory fsync).
   Baselines measured in the same run, on the same file system:
   - N bare SQLite ``UPDATE`` + ``COMMIT`` (WAL, ``synchronous=FULL``), one transaction each — the
     floor for "one durable commit per attempt";
   - the same plus ``unlink`` + ``fsync(dir)`` of one small file per commit — the floor for "commit,
     then delete the receipt durably".
2. **Idle supervisor.** Three child processes open the same kind of runtime on an idle data dir; one
   starts a standalone supervisor (5 s interval), one does nothing (baseline), one ran a single
   reconciliation round in its main thread and then does nothing ("warm": ql's model layer, loaded on
   the first query, is resident — the delta to it is the supervisor itself). After the startup round,
   each measures its own CPU time (``resource.getrusage``) over ``--idle-seconds`` and reads VmRSS /
   VmHWM from ``/proc/self/status``. The difference is what the idle supervisor costs.

The default directory is a fresh temp dir under /var/tmp (normally the disk that holds data dirs;
/tmp is often a tmpfs where fsync is free and the comparison would flatter us).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


# -- 1. startup reconciliation ------------------------------------------------------------


def open_runtime(data_dir: Path, profile: str = "standalone", **limits: Any) -> Any:
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    config = load_config(data_dir=data_dir, profile=profile, environ={}, cwd=data_dir)
    if limits:
        config = dataclasses.replace(config, profile=config.profile.with_overrides(limits))
    return Runtime.open(config)


def dead_handle() -> dict[str, Any]:
    from ql_executors.local_process.identity import read_boot_id

    child = subprocess.Popen(["true"])
    child.wait()
    return {"boot_id": read_boot_id(), "pid": child.pid, "pgid": child.pid, "start_time": 1}


def insert_running(rt: Any, n: int) -> list[tuple[str, str, str]]:
    """N runs + running attempts + logs + journal rows in one transaction; returns (run, attempt, token)."""
    from sqlalchemy import insert

    from ql_core.completion import hash_token
    from ql_core.db.engine import session_scope
    from ql_core.db.models import CompletionReceiptJournal, LogArtifact, Run, RunAttempt, RunEvent
    from ql_core.ids import new_id
    from ql_core.paths import log_relative_path

    now = int(time.time() * 1000) - 1_000
    handle = dead_handle()
    out, runs, attempts, logs, events, journal = [], [], [], [], [], []
    for _ in range(n):
        run_id, attempt_id, log_id, token = new_id(), new_id(), new_id(), secrets.token_urlsafe(32)
        out.append((run_id, attempt_id, token))
        runs.append(dict(id=run_id, name=None, status="running", exit_code=None, reason=None, version=1, event_seq=2,
                         current_attempt_id=attempt_id, created_at_ms=now, updated_at_ms=now, finished_at_ms=None,
                         deadline_at_ms=None, cancel_reason=None, cancel_requested_at_ms=None))
        attempts.append(dict(id=attempt_id, run_id=run_id, attempt_no=1, executor_type="local_process",
                             runtime_owner=rt.node_id, status="running", exit_code=None, reason=None,
                             log_artifact_id=log_id, callback_token_hash=hash_token(token), callback_sequence=0,
                             deadline_at_ms=None, created_at_ms=now, started_at_ms=now, finished_at_ms=None,
                             boot_id=handle["boot_id"], pid=handle["pid"], pgid=handle["pgid"],
                             process_start_time=handle["start_time"], version=2))
        logs.append(dict(id=log_id, run_id=run_id, attempt_id=attempt_id, relative_path=log_relative_path(log_id),
                         max_bytes=1 << 20, size_bytes=None, truncated=False, created_at_ms=now, deleted_at_ms=None))
        events += [dict(run_id=run_id, seq=1, type="run.created", attempt_id=attempt_id, status=None, exit_code=None,
                        reason=None, at_ms=now),
                   dict(run_id=run_id, seq=2, type="attempt.spawned", attempt_id=attempt_id, status="running",
                        exit_code=None, reason=None, at_ms=now)]
        journal.append(dict(attempt_id=attempt_id, run_id=run_id, state="pending",
                            receipt_ref=rt.receipts.relative_ref(attempt_id), quarantine_reason=None,
                            registered_at_ms=now, updated_at_ms=now, terminal_seen_at_ms=None))
    with session_scope(rt.engine) as session:
        for model, values in ((Run, runs), (RunAttempt, attempts), (LogArtifact, logs), (RunEvent, events),
                              (CompletionReceiptJournal, journal)):
            session.execute(insert(model.__table__), values)
    return out


def publish_receipts(rt: Any, rows: list[tuple[str, str, str]]) -> None:
    from ql_core.receipts.codec import Receipt

    now = int(time.time() * 1000)
    for i, (run_id, attempt_id, token) in enumerate(rows):
        rt.receipts.publish(Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                                    token=token, started_at_ms=now - 900, finished_at_ms=now, exit_code=i % 3),
                            fsync=True)


def bench_startup(work: Path, n: int) -> dict[str, Any]:
    from ql_core.reconciler import Reconciler

    rt = open_runtime(work / "data")
    try:
        t0 = time.perf_counter()
        rows = insert_running(rt, n)
        t1 = time.perf_counter()
        publish_receipts(rt, rows)
        t2 = time.perf_counter()
        class Timed(Reconciler):
            logs_s = 0.0

            def _logs(self, report: Any) -> None:
                started = time.perf_counter()
                super()._logs(report)
                Timed.logs_s += time.perf_counter() - started

        rec = Timed(rt)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        report, rounds = rec.full_pass()
        t3 = time.perf_counter()
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        applied = report.counts["applied"]
        if applied != n:
            raise AssertionError(f"expected {n} applied, got {dict(report.counts)}")
        leftover = sum(1 for _, a, _ in rows[:200] if rt.receipts.exists(a))
        if leftover:
            raise AssertionError("receipts left behind after their commits")
        return {"n": n, "insert_s": t1 - t0, "publish_s": t2 - t1, "reconcile_s": t3 - t2, "rounds": rounds,
                "logs_s": Timed.logs_s,
                "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
                "per_round": rt.profile.page_size * rt.profile.pages_per_round,
                "counts": {k: v for k, v in report.as_dict().items() if v}}
    finally:
        rt.close()


def bench_sqlite_baseline(work: Path, n: int, *, with_unlink: bool) -> float:
    """N x (UPDATE one row + COMMIT) with WAL + synchronous=FULL [+ unlink a file + fsync(dir)]; ops/s."""
    path = work / ("baseline_unlink.db" if with_unlink else "baseline.db")
    files = work / "baseline_files"
    files.mkdir(exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, status TEXT, exit_code INTEGER, version INTEGER)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t (status, version) VALUES ('running', 1)", [()] * n)
    conn.execute("COMMIT")
    if with_unlink:
        for i in range(n):
            (files / f"{i}.json").write_bytes(b"{}")
    dir_fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY)
    try:
        start = time.perf_counter()
        for i in range(1, n + 1):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE t SET status='succeeded', exit_code=0, version=version+1 WHERE id=? AND version=1",
                         (i,))
            conn.execute("COMMIT")
            if with_unlink:
                os.unlink(f"{i - 1}.json", dir_fd=dir_fd)
                os.fsync(dir_fd)
        return n / (time.perf_counter() - start)
    finally:
        os.close(dir_fd)
        conn.close()


# -- 2. idle supervisor ---------------------------------------------------------------------

_CHILD = "--idle-child"


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def idle_child(data_dir: str, mode: str, seconds: float) -> None:
    """One measured process: open a runtime, optionally supervise, idle, report CPU and RSS as JSON."""
    rt = open_runtime(Path(data_dir))
    sup = None
    if mode == "warm":
        # The same runtime after one reconciliation round in the main thread: ql's model layer
        # (SQLModel/pydantic, loaded on first query) is resident, no supervisor thread.
        from ql_core.reconciler import Reconciler

        Reconciler(rt.node).round()
    if mode == "supervisor":
        sup = rt.supervisor()  # standalone profile: 5 s interval
        sup.start()
        deadline = time.monotonic() + 30
        while sup.rounds < 1 and time.monotonic() < deadline:  # the startup round is not "idle"
            time.sleep(0.01)
    before = resource.getrusage(resource.RUSAGE_SELF)
    rss_before = _status_kib("VmRSS")
    rounds_before = sup.rounds if sup else 0
    time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "mode": mode,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "rss_kib_start": rss_before,
        "rss_kib": _status_kib("VmRSS"),
        "hwm_kib": _status_kib("VmHWM"),
        "threads": _status_kib("Threads"),
        "rounds": (sup.rounds - rounds_before) if sup else 0,
    }
    if sup is not None:
        result["drained"] = sup.stop()
    rt.close()
    print(json.dumps(result), flush=True)


def bench_idle(work: Path, seconds: float) -> dict[str, dict[str, Any]]:
    data_dir = work / "idle"
    rt = open_runtime(data_dir)  # create and migrate once, outside the measurement
    rt.close()
    procs = {mode: subprocess.Popen([sys.executable, __file__, _CHILD, str(data_dir), mode, str(seconds)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in ("baseline", "warm", "supervisor")}
    out = {}
    for mode, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"idle child {mode} failed: {stderr}")
        out[mode] = json.loads(stdout.strip().splitlines()[-1])
    return out


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="pending receipts at startup (default 10000)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle window measured (default 60)")
    parser.add_argument("--dir", default="/var/tmp", help="parent of the temp dir (default /var/tmp)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ql-bench-reconcile-", dir=args.dir))
    try:
        print(f"work dir {work} (file system of {args.dir}); python {sys.version.split()[0]}; "
              f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
        startup = bench_startup(work, args.n)
        floor = bench_sqlite_baseline(work, args.n, with_unlink=False)
        floor_unlink = bench_sqlite_baseline(work, args.n, with_unlink=True)
        rate = args.n / startup["reconcile_s"]
        print(f"\n1. startup reconciliation, {args.n} pending receipts (standalone: {startup['per_round']} "
              f"attempts/round)")
        print(f"   setup: insert {startup['insert_s']:.2f} s, publish receipts (fsync) {startup['publish_s']:.2f} s")
        receipts_s = startup["reconcile_s"] - startup["logs_s"]
        print(f"   full pass: {startup['reconcile_s']:.2f} s in {startup['rounds']} rounds -> {rate:,.0f} attempts/s "
              f"(process CPU {startup['cpu_s']:.2f} s)")
        print(f"     of which receipts/identities/journal {receipts_s:.2f} s -> {args.n / receipts_s:,.0f} attempts/s; "
              f"log finalization (LogKeeper, one commit per ended log) {startup['logs_s']:.2f} s")
        print(f"   counts: {startup['counts']}")
        print(f"   baseline UPDATE+COMMIT (WAL, synchronous=FULL):          {floor:,.0f} ops/s "
              f"-> full pass at {rate / floor:.1%}, receipts alone at {args.n / receipts_s / floor:.1%}")
        print(f"   baseline UPDATE+COMMIT + unlink + fsync(dir):            {floor_unlink:,.0f} ops/s "
              f"-> full pass at {rate / floor_unlink:.1%}, receipts alone at {args.n / receipts_s / floor_unlink:.1%}")

        idle = bench_idle(work, args.idle_seconds)
        base, warm, sup = idle["baseline"], idle["warm"], idle["supervisor"]
        print(f"\n2. idle supervisor over {args.idle_seconds:g} s (standalone, 5 s interval, empty data dir)")
        for row in (base, warm, sup):
            print(f"   {row['mode']:<10} cpu {row['cpu_s'] * 1000:8.1f} ms ({row['cpu_s'] / args.idle_seconds:.3%}) "
                  f"rss {row['rss_kib'] / 1024:6.1f} MiB (hwm {row['hwm_kib'] / 1024:6.1f} MiB) "
                  f"threads {row['threads']} rounds {row['rounds']}")
        print(f"   supervisor cost: +{(sup['cpu_s'] - base['cpu_s']) * 1000:.1f} ms CPU per "
              f"{args.idle_seconds:g} s ({(sup['cpu_s'] - base['cpu_s']) * 1000 / max(sup['rounds'], 1):.1f} ms "
              f"per round), {(sup['rss_kib'] - base['rss_kib']) / 1024:+.1f} MiB RSS vs a fresh runtime, "
              f"{(sup['rss_kib'] - warm['rss_kib']) / 1024:+.1f} MiB vs one that already reconciled once "
              f"(model layer loaded); drained={sup.get('drained')}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        idle_child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        main()
