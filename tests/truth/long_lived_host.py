"""A long-lived embedding host for tests/truth/test_long_lived_host.py: one short-lived thread per
batch of tasks, half of its submissions never waited for (kept, as the README's "or don't wait").

    python long_lived_host.py DATA_DIR THREADS TASKS_PER_THREAD CONCURRENT NOFILE

Runs under ``RLIMIT_NOFILE`` = NOFILE (0: unchanged). Prints one JSON line: the descriptors and
children it had after warming up, the same after its own bounded clean-up (one supervisor round,
then one more task), every run's final status, and how many submits failed.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
from pathlib import Path

from ql_core.config import load_config
from ql_core.runtime import Runtime


def fds() -> list[str]:
    """This process's open descriptors, as what they point at (for a readable failure)."""
    out = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{entry}"))
        except OSError:
            pass  # the listing's own descriptor, closed already
    return sorted(out)


def children() -> list[tuple[int, str]]:
    """This process's child processes (pid, state): launchers, standby, zombies."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        if int(fields[1]) == me:
            out.append((int(entry), fields[0].decode()))
    return sorted(out)


def main() -> None:
    data_dir, threads, per_thread, concurrent, nofile = sys.argv[1], *map(int, sys.argv[2:6])
    if nofile:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    # Warm up at this host's own concurrency: the ready standby, and SQLite's descriptors. SQLite
    # keeps the descriptor of a closed connection open while another connection of the process
    # holds a lock on the file (closing it would drop that lock: POSIX locks are per process) and
    # reuses it for the next connection — so a host holds at most one per thread it ever ran *at
    # once*, never one per thread it ran. So the warm-up must reach that peak for sure: every
    # warmer keeps its thread (and its connection) until all have run a task; otherwise, on a loaded
    # machine, an early warmer's descriptor is handed to a late one and the peak is reached only later.
    barrier, ran = threading.Barrier(concurrent), threading.Barrier(concurrent)

    def warm() -> None:
        barrier.wait()
        rt.run(["true"])
        ran.wait()

    for _ in range(2):
        warmers = [threading.Thread(target=warm) for _ in range(concurrent)]
        for t in warmers:
            t.start()
        for t in warmers:
            t.join()
    before = {"fds": fds(), "children": children()}
    kept: list = []  # never waited for, never dropped
    run_ids: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    def task_thread(index: int) -> None:
        for n in range(per_thread):
            try:
                if (index + n) % 2:
                    sub = rt.submit(["true"])
                    with lock:
                        kept.append(sub)
                else:
                    sub = rt.submit(["true"], awaited=True)
                    rt.wait(sub)
                with lock:
                    run_ids.append(sub.run_id)
            except Exception as exc:  # noqa: BLE001 - counted and reported: the test fails on any
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")

    started = 0
    while started < threads:
        batch = [threading.Thread(target=task_thread, args=(started + i,))
                 for i in range(min(concurrent, threads - started))]
        for t in batch:
            t.start()
        for t in batch:
            t.join()
        started += len(batch)
    during = {"fds": len(fds()), "children": len(children())}
    # The host's own bounded clean-up: supervisor rounds (each bounded by the profile) until the
    # unwaited runs ended from their receipts, then one more task (its launcher start reaps exited
    # launchers, as every start does).
    supervisor, rounds = rt.supervisor(), 0
    while rt.list_runs(status="running", limit=1) and rounds < 1000:
        supervisor.run_round()
        rounds += 1
    rt.run(["true"])
    after = {"fds": fds(), "children": children()}
    statuses: dict[str, int] = {}
    for run_id in run_ids:
        status = rt.status(run_id).status
        statuses[status] = statuses.get(status, 0) + 1
    print(json.dumps({"before": before, "after": after, "during": during, "statuses": statuses,
                      "failures": failures[:5], "rounds": rounds, "failed": len(failures), "kept": len(kept),
                      "connections": rt.journal._db.open_connections()}))  # noqa: SLF001 - diagnostics
    rt.close()


if __name__ == "__main__":
    main()
