"""Where a ``ql worker`` slot's time goes between two tasks: the steps of each attempt, from the
control database's own timestamps (one clock), medians over ``--n`` ``true`` tasks.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/worker_timeline.py --n 400

Steps: claim (the lease's ``claimed_at_ms``) -> start answered (``started_at_ms``) -> the process
started (the attempt's ``started_at_ms``: the worker's clock, translated) -> it finished
(``finished_at_ms``) -> the completion committed (the run's ``updated_at_ms``); and the slot's
refill: from a task's finish to the next claim (the slot is idle then). Also the busy share: the
sum over tasks of claim -> finish over (slots x wall time).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_cluster import Workers, _submit
from pg_scratch import scratch_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    import psycopg

    from ql_plugins.cluster_fenced.sealing import new_key_file

    with scratch_database() as (_url, dsn):
        tmp = Path(tempfile.mkdtemp(prefix="ql-bench-timeline-"))
        try:
            key_file = tmp / "spec.key"
            new_key_file(key_file)
            workers = Workers(dsn, 1, tmp, key_file)
            try:
                workers.wait_registered(args.timeout)
                warm, _ = _submit(dsn, 8, key_file)
                workers.drain(warm, "warm-up", args.timeout)
                runs, _ = _submit(dsn, args.n, key_file)
                workers.drain(runs, "timeline", args.timeout)
                time.sleep(0.5)
            finally:
                workers.stop()
            with psycopg.connect(dsn) as conn:
                rows = conn.execute(
                    "SELECT l.claimed_at_ms, l.started_at_ms, a.started_at_ms, a.finished_at_ms, r.updated_at_ms"
                    " FROM ql_run r JOIN ql_run_attempt a ON a.run_id = r.id"
                    " JOIN ql_attempt_lease l ON l.attempt_id = a.id WHERE r.id = ANY(%s)", (runs,)).fetchall()
                unspawned = conn.execute(
                    "SELECT count(*) FROM ql_run r WHERE r.id = ANY(%s) AND NOT EXISTS (SELECT 1 FROM ql_run_event e"
                    " WHERE e.run_id = r.id AND e.type = 'attempt.spawned')", (runs,)).fetchone()[0]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    steps = {"claim -> start answered": [], "start answered -> process start": [],
             "process start -> finish": [], "finish -> completion committed": []}
    for claimed, started, p_start, p_end, done in rows:
        steps["claim -> start answered"].append(started - claimed)
        steps["start answered -> process start"].append(p_start - started)
        steps["process start -> finish"].append(p_end - p_start)
        steps["finish -> completion committed"].append(done - p_end)
    claims = sorted(r[0] for r in rows)
    finishes = sorted(r[3] for r in rows)
    # the refill: each finish to the first claim at or after it (the slot it freed, taken again)
    refill = _gaps_after(finishes[:-8], claims)
    # the slot's idle time: each finish to the first process start at or after it (the refill as the
    # slot sees it, whichever claim its next run came from)
    respawn = _gaps_after(finishes[:-8], sorted(r[2] for r in rows))
    wall = max(r[4] for r in rows) - min(claims)
    busy = sum(r[3] - r[0] for r in rows)
    running = sum(r[3] - r[2] for r in rows)
    print(f"# python bench/worker_timeline.py --n {args.n}: one ql worker (4 slots), {len(rows)} `true` tasks, "
          f"{len(rows) / (wall / 1000):.0f}/s; ms, p50 / mean / p90")
    for name, v in steps.items():
        v.sort()
        print(f"  {name:>34}: {statistics.median(v):6.1f} {statistics.mean(v):6.1f} {v[int(len(v) * 0.9)]:6.1f}")
    refill.sort()
    print(f"  {'a finish -> the next claim':>34}: {statistics.median(refill):6.1f} {statistics.mean(refill):6.1f} "
          f"{refill[int(len(refill) * 0.9)]:6.1f}")
    respawn.sort()
    print(f"  {'a finish -> the next process start':>34}: {statistics.median(respawn):6.1f} "
          f"{statistics.mean(respawn):6.1f} {respawn[int(len(respawn) * 0.9)]:6.1f}")
    print(f"  runs whose attempt.spawned never reached the control plane (completed before `running`): {unspawned}")
    print(f"  slots busy (claim -> finish) {100 * busy / (4 * wall):.0f}%, running a process (start -> finish) "
          f"{100 * running / (4 * wall):.0f}% of 4 x {wall} ms")


def _gaps_after(finishes: list[int], later: list[int]) -> list[int]:
    """For each of the sorted ``finishes``, the time to the first of the sorted ``later`` at or after it."""
    gaps = []
    j = 0
    for f in finishes:
        while j < len(later) and later[j] < f:
            j += 1
        if j < len(later):
            gaps.append(later[j] - f)
    return gaps


if __name__ == "__main__":
    main()
