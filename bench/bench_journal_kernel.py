"""CPU cost of the run store's hot path (SQLite), against a floor of bare durable commits.

Run: ``python bench/bench_journal_kernel.py [--n N] [--dir DIR] [--json]``; to compare two trees,
run it once per tree on the same machine back to back (``PYTHONPATH=<other tree> python ...``).

A task's life in the run store is three write commits (create, spawned, terminal) and a status
read. This replays that life N times straight on the ``edge-sqlite`` store (``SqliteJournal``: no
processes, no receipts), with decisions shaped like core's (attempt and run columns, two events,
the journal clock), and measures the process's CPU time (``getrusage``: user + system, so the
disk's fsync latency and other processes' load count for nothing). The floor is the same number
of durable commits with nothing in them but one ``INSERT`` each, on a fresh SQLite file with the
same pragmas (WAL, ``synchronous=FULL``): the ratio says what the store's logic costs over the
cheapest durable commit, and how two versions of the store compare on it.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sqlite3
import tempfile
from pathlib import Path


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _floor(path: Path, commits: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    start = _cpu_s()
    for i in range(commits):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (str(i),))
        conn.execute("COMMIT")
    spent = _cpu_s() - start
    conn.close()
    return spent


def _lifecycles(store: object, n: int) -> float:
    from ql_core.ports.journal import EventSpec, Transition
    from ql_core.testing.journal import new_run

    def spawned(snap):  # noqa: ANN001, ANN202 - the shape of core's decisions
        a = snap.attempt
        return None, Transition(attempt={"status": "running", "handle": '{"h":1}', "started_at_ms": snap.now_ms},
                                run={"status": "running"},
                                events=(EventSpec("attempt.spawned", attempt_id=a.id, status="running"),))

    def ended(snap):  # noqa: ANN001, ANN202
        a = snap.attempt
        return None, Transition(attempt={"status": "succeeded", "exit_code": 0, "finished_at_ms": snap.now_ms},
                                run={"status": "succeeded", "exit_code": 0, "finished_at_ms": snap.now_ms},
                                events=(EventSpec("attempt.succeeded", attempt_id=a.id, status="succeeded",
                                                  exit_code=0),
                                        EventSpec("run.succeeded", attempt_id=a.id, status="succeeded",
                                                  exit_code=0)), terminal=True)

    runs = [new_run() for _ in range(n)]
    start = _cpu_s()
    for new in runs:
        store.create(new)  # type: ignore[attr-defined]
        store.transition(new.attempt_id, spawned)  # type: ignore[attr-defined]
        store.transition(new.attempt_id, ended)  # type: ignore[attr-defined]
        store.note_consumed(new.attempt_id)  # type: ignore[attr-defined]
        store.view(new.run_id)  # type: ignore[attr-defined]
    return _cpu_s() - start


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default, text in (("--n", int, 500, "task lifecycles"),
                                      ("--dir", str, "/var/tmp", "parent of the temp dir")):
        parser.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    from ql_plugins.edge_sqlite.store import SqliteJournal

    work = Path(tempfile.mkdtemp(prefix="ql-bench-kernel-", dir=args.dir))
    try:
        store = SqliteJournal(f"sqlite:///{work / 'ql.db'}")
        try:
            _lifecycles(store, 20)  # warm: connection open, statements prepared
            spent = _lifecycles(store, args.n)
        finally:
            store.close()
        floor = _floor(work / "floor.db", 3 * args.n)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"n": args.n, "cpu_ms_per_lifecycle": 1000 * spent / args.n,
              "floor_cpu_ms_per_3_commits": 1000 * floor / args.n, "ratio": spent / floor if floor else None}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.n} task lifecycles (3 write commits + a view each) on edge-sqlite")
        print(f"  store: {result['cpu_ms_per_lifecycle']:.3f} ms CPU per lifecycle")
        print(f"  floor: {result['floor_cpu_ms_per_3_commits']:.3f} ms CPU per 3 bare durable commits")
        print(f"  ratio: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
