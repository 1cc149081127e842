"""Local fsyncs per task of one ``ql worker`` (4 slots) running ``true``: strace, not a guess.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/worker_fsyncs.py --n 200

One worker runs under ``strace -f -y -e trace=fsync,fdatasync`` (the launchers too: ``-f``); ``--n``
runs are queued, drained, and the worker is stopped (SIGTERM). Reported: the fsync/fdatasync calls
per task, by file (``worker.db-wal`` is the worker's durable local commits; receipts and logs are
the launchers'), after the ones of an idle warm-up (registering, schema) are subtracted. Run it
from a checkout of the code to measure (``PYTHONPATH`` a second checkout to measure that one).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cluster import Workers, end_to_end
from pg_scratch import scratch_database

_CALL = re.compile(r"^\d+\s+(fsync|fdatasync)\((\d+)<([^>]*)>")


def _count(trace: Path) -> collections.Counter[str]:
    """fsync calls by the kind of file they were made on."""
    by = collections.Counter[str]()
    for line in trace.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        path = m.group(3)
        name = Path(path).name
        if name.endswith("-wal") or name.endswith(".db"):
            kind = name
        elif "/receipts" in path or "receipt" in name:
            kind = "receipts"
        elif "/logs/" in path:
            kind = "logs"
        else:  # a directory or another file: named by its place in the data dir
            kind = "other: " + re.sub(r"[0-9a-f]{8,}", "*", path.split("/w1-0/", 1)[-1])[-40:]
        by[kind] += 1
    return by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="tasks to run")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if shutil.which("strace") is None:
        sys.exit("worker_fsyncs: needs strace")
    from ql_plugins.cluster_fenced.sealing import new_key_file

    with scratch_database() as (_url, dsn):
        tmp = Path(tempfile.mkdtemp(prefix="ql-bench-fsyncs-"))
        try:
            key_file = tmp / "spec.key"
            new_key_file(key_file)
            trace = tmp / "strace.txt"
            prefix = ("strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(trace))
            workers = Workers(dsn, 1, tmp, key_file, prefix=prefix)
            try:
                workers.wait_registered(args.timeout)
                end_to_end(workers, 4, key_file, args.timeout)  # the first tasks: connections, caches
                time.sleep(1.0)
                warm = _count(trace)
                rate = end_to_end(workers, args.n, key_file, args.timeout)
                time.sleep(1.0)  # the last answers and log finalizes
                done = _count(trace)
            finally:
                # The worker itself, not strace (which would only detach and leave it running).
                for p in workers.procs:
                    try:
                        children = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
                    except OSError:
                        children = []  # strace is gone (and took the worker with it)
                    for child in children:
                        os.kill(int(child), signal.SIGTERM)
                for p in workers.procs:
                    try:
                        p.wait(60)
                    except subprocess.TimeoutExpired:
                        pass
                workers.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# python bench/worker_fsyncs.py --n {args.n}: one ql worker (4 slots), {args.n} `true` tasks "
          f"({rate:.0f}/s under strace)")
    total = 0
    for kind in sorted(set(done) | set(warm)):
        n = done[kind] - warm[kind]
        total += n
        print(f"  {kind:>16}: {n:6d} fsyncs  {n / args.n:6.2f} per task")
    print(f"  {'all':>16}: {total:6d} fsyncs  {total / args.n:6.2f} per task")


if __name__ == "__main__":
    main()
