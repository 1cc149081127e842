"""CompletionService throughput on the edge SQLite database, and commits per task lifecycle.

Run: ``python bench/bench_completion.py [--n N] [--dir DIR] [--json]``.

1. **Completions applied per second.** N attempts are created through the
   runtime's own create path (``ql_core.submit.create``: run, attempt, log artifact,
   event, journal row and token hash in one commit — no process is spawned),
   each gets its valid receipt published by the real ``FileReceiptStore``
   (fsync on), then ``ReceiptConsumer.consume`` applies them one by one: read
   and validate the file, the terminal transaction (claim checks, run + attempt
   compare-and-set, two events, journal clock; ``synchronous=FULL``), delete
   and fsync the shard directory. A second batch goes through the recovery
   path (``Reconciler.full_pass``), which adds paging and identity-free
   bookkeeping. Baseline, measured in the same run on the same file system:
   N bare ``INSERT`` + ``COMMIT`` transactions on a fresh SQLite file with the
   same pragmas (WAL, ``synchronous=FULL``). The ratio says what the protocol
   costs over the cheapest durable commit SQLite can do. One more consumer batch
   runs while an idle connection to the database is held open: closing the
   *last* connection of a WAL database checkpoints it. The difference between
   the two consumer rows shows whether that still costs anything (the store
   keeps its own connections open, so it should not).
2. **Commits per task lifecycle.** One real ``submit`` + ``wait`` of
   ``sh -c 'exit 0'`` with the run store's statement trace on; each
   commit is listed with the statements that changed data in it. The target is
   three: create, spawned, terminal (DESIGN.md §3.6). Read-only transactions
   (BEGIN … COMMIT with no write: no WAL frame, no fsync) are counted apart.

The default directory is a fresh temp dir under /var/tmp (normally the disk
that holds a real data dir; /tmp is often a tmpfs where fsync is free).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from ql_core.clock import now_ms_ceil
from ql_core.config import load_config
from ql_core.consumer import ConsumeOutcome
from ql_core.receipts import Receipt
from ql_core.runtime import Runtime
from ql_core.submit import create


class CommitLog:
    """Every COMMIT of the runtime's run store with the INSERT/UPDATE/DELETE statements in it.

    Uses the edge-sqlite store's statement trace (sqlite3 trace callbacks on its real connections).
    """

    _WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE)\b(?:\s+OR\s+\w+)?(?:\s+INTO|\s+FROM)?\s+\"?(\w+)", re.I)

    def __init__(self, rt: Runtime) -> None:
        self.commits: list[list[str]] = []
        self._open: dict[int, list[str]] = {}
        self._store = rt.journal
        self._store.trace(self._on)

    def close(self) -> None:
        self._store.trace(None)

    def _on(self, conn: int, statement: str) -> None:
        head = statement.lstrip().upper()
        if head.startswith("BEGIN"):
            self._open[conn] = []
        elif head.startswith("COMMIT"):
            self.commits.append(self._open.pop(conn, []))
        elif (match := self._WRITE.match(statement)) is not None:
            self._open.setdefault(conn, []).append(f"{match.group(1).upper()} {match.group(2)}")


def open_runtime(data_dir: Path) -> Runtime:
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))


def prepare(rt: Runtime, n: int) -> tuple[list[Any], float, float]:
    """N created attempts with published receipts; returns (subs, creates/s, publishes/s)."""
    start = time.perf_counter()
    subs = [create(rt.node) for _ in range(n)]
    created = time.perf_counter() - start
    start = time.perf_counter()
    assert rt.receipts is not None
    for i, sub in enumerate(subs):
        rt.receipts.publish(Receipt(1, sub.run_id, sub.attempt_id, sub.callback_sequence, sub.token,
                                    sub.started_at_ms, max(now_ms_ceil(), sub.started_at_ms), i % 3))
    published = time.perf_counter() - start
    return subs, n / created, n / published


def consume_all(rt: Runtime, subs: list[Any]) -> float:
    assert rt.consumer is not None
    start = time.perf_counter()
    for sub in subs:
        outcome = rt.consumer.consume(sub.attempt_id).outcome
        if outcome is not ConsumeOutcome.APPLIED:
            raise AssertionError(f"benchmark completion was {outcome}, not applied")
    return len(subs) / (time.perf_counter() - start)


def reconcile_all(rt: Runtime, n: int) -> float:
    start = time.perf_counter()
    counts = rt.reconcile()
    elapsed = time.perf_counter() - start
    if counts["applied"] != n:
        raise AssertionError(f"recovery applied {counts['applied']} of {n}")
    return n / elapsed


def baseline_inserts(path: Path, n: int) -> float:
    """N bare INSERT+COMMIT transactions, WAL + synchronous=FULL (the engine's pragmas)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row-{i}",))
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - start)
    conn.close()
    return rate


def lifecycle_commits(rt: Runtime) -> dict[str, Any]:
    log = CommitLog(rt)
    view = rt.wait(rt.submit(["sh", "-c", "exit 0"]))
    log.close()
    if view.status != "succeeded":
        raise AssertionError(f"lifecycle task ended {view.status}")
    writes = [c for c in log.commits if c]
    return {"write_commits": len(writes), "read_only_commits": len(log.commits) - len(writes),
            "writes": [{"name": _name(c), "statements": c} for c in writes]}


def _name(statements: list[str]) -> str:
    if "INSERT ql_run" in statements:
        return "create"
    if statements.count("INSERT ql_run_event") >= 2:
        return "terminal"
    if "INSERT ql_run_event" in statements:
        return "spawned"
    return "extra"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="completions per measurement (default 500)")
    parser.add_argument("--dir", default="/var/tmp", help="parent of the temp dir (default /var/tmp)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ql-bench-completion-", dir=args.dir))
    try:
        rt = open_runtime(work / "data")
        try:
            baseline = baseline_inserts(work / "baseline.db", args.n)
            subs, creates, publishes = prepare(rt, args.n)
            consumed = consume_all(rt, subs)
            _subs, _c, _p = prepare(rt, args.n)
            recovered = reconcile_all(rt, args.n)
            keeper = sqlite3.connect(work / "data" / "ql.db")
            try:
                keeper.execute("SELECT count(*) FROM ql_run").fetchall()
                subs, creates_kept, _p = prepare(rt, args.n)
                consumed_kept = consume_all(rt, subs)
            finally:
                keeper.close()
            lifecycle = lifecycle_commits(rt)
        finally:
            rt.close()
    finally:
        shutil.rmtree(work)
    result = {"n": args.n, "dir": args.dir, "baseline_insert_commit_per_s": baseline,
              "create_commits_per_s": creates, "receipt_publish_per_s": publishes,
              "completions_consumer_per_s": consumed, "completions_reconcile_per_s": recovered,
              "create_commits_per_s_connection_held": creates_kept,
              "completions_consumer_per_s_connection_held": consumed_kept,
              "lifecycle": lifecycle}
    if args.json:
        print(json.dumps(result))
    else:
        report(result)


def report(r: dict[str, Any]) -> None:
    base = r["baseline_insert_commit_per_s"]
    print(f"completion benchmark: n={r['n']} per measurement, edge SQLite (WAL, synchronous=FULL), "
          f"dir={r['dir']}")
    rows = [
        ("baseline: bare INSERT+COMMIT", base),
        ("create (run+attempt+log+event+journal)", r["create_commits_per_s"]),
        ("receipt publish (fsync)", r["receipt_publish_per_s"]),
        ("completions applied: consumer.consume", r["completions_consumer_per_s"]),
        ("completions applied: reconcile pass", r["completions_reconcile_per_s"]),
        ("create, idle connection held open", r["create_commits_per_s_connection_held"]),
        ("consumer.consume, idle connection held", r["completions_consumer_per_s_connection_held"]),
    ]
    print(f"{'measurement':<42} {'per s':>9} {'ms each':>9} {'vs baseline':>12}")
    for name, rate in rows:
        print(f"{name:<42} {rate:>9.0f} {1000 / rate:>9.2f} {base / rate:>11.2f}x")
    life = r["lifecycle"]
    print(f"commits per task lifecycle (submit + wait): {life['write_commits']} write "
          f"(+{life['read_only_commits']} read-only, no fsync); target 3 = create, spawned, terminal")
    for i, commit in enumerate(life["writes"], 1):
        runs: list[list[Any]] = []
        for statement in commit["statements"]:  # "DELETE t" x 200 reads better as one item
            if runs and runs[-1][0] == statement:
                runs[-1][1] += 1
            else:
                runs.append([statement, 1])
        print(f"  {i}. {commit['name']:<9} " + ", ".join(s if n == 1 else f"{s} x{n}" for s, n in runs))


if __name__ == "__main__":
    main()
