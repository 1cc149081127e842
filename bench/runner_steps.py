"""How long each step of running one task takes in a ``ql worker`` beside the embedded host that
does the same steps: the worker's cost per step under its own threads' load, measured in-process.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/runner_steps.py --n 800

Both run ``true`` with 4 in flight: the embedded host (one ``Runtime``, ``submit(awaited=True)`` /
``wait``, one thread) and one worker (4 slots: a runner thread per attempt beside the control loop).
A ``sitecustomize`` on their ``PYTHONPATH`` (written here, into a temporary directory) times the
calls both make per task — take a standby launcher, the create commit, the start (the hand-over),
the wait for the launcher's exit, and the completion (the terminal commit) — on the monotonic clock,
per call, and each process writes its timings to a file once a second. Printed: p50 and mean per step
in ms, and the worker's p50 over the host's. "wait for the exit" is not a cost of either: the host
waits for the oldest of its 4 tasks, which has usually ended by then; a runner waits for its own
task right after handing it over, so that row holds the task's own run.

Why: the worker does these same steps through the same functions, yet one worker runs well under
half the embedded host's rate (``bench_cluster.py``). This shows whether a step itself costs more
in the worker (it does: each waits for the others' threads and processes on the machine), which is
what a change to the worker's structure has to move — and what a change to one step cannot.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cluster import HOST, Workers, _submit
from pg_scratch import scratch_database

#: The steps timed, in the order a task takes them: (label, module, attribute path).
STEPS = (
    ("take a standby launcher", "ql_core.submit", "take_standby"),
    ("create commit", "ql_core.submit", "create"),
    ("start (hand-over)", "ql_core.submit", "start"),
    ("wait for the exit", "ql_executors.local_process.executor", "LocalProcessExecutor.wait"),
    ("completion (terminal commit)", "ql_core.wait", "complete_from_wait"),
)

#: The tracer each timed process imports at start-up (``BENCH_STEPS_OUT``: where its timings go).
SITECUSTOMIZE = r'''
import os
if os.environ.get("BENCH_STEPS_OUT"):
    import importlib, json, threading, time
    _out = os.environ["BENCH_STEPS_OUT"]
    _steps = json.loads(os.environ["BENCH_STEPS"])
    _times = {label: [] for label, _m, _a in _steps}
    _lock = threading.Lock()

    def _dump():
        with _lock:
            data = json.dumps(_times)
        with open(f"{_out}.{os.getpid()}.json", "w") as f:
            f.write(data)

    def _timed(label, fn):
        def timed(*a, **k):
            t = time.monotonic_ns()
            try:
                return fn(*a, **k)
            finally:
                d = time.monotonic_ns() - t
                with _lock:
                    _times[label].append(d)
        return timed

    for label, module, attr in _steps:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, _timed(label, getattr(owner, name)))

    def _flush():
        while True:
            time.sleep(1.0)
            _dump()

    threading.Thread(target=_flush, daemon=True, name="bench-steps").start()
    import atexit
    atexit.register(_dump)
'''


def _collect(prefix: Path) -> dict[str, list[int]]:
    """Every timed process's calls under ``prefix``, merged."""
    merged: dict[str, list[int]] = {label: [] for label, _m, _a in STEPS}
    for f in prefix.parent.glob(prefix.name + ".*.json"):
        for label, durations in json.loads(f.read_text()).items():
            merged[label].extend(durations)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=800)
    parser.add_argument("--warmup-n", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()

    from ql_plugins.cluster_fenced.sealing import new_key_file

    tmp = Path(tempfile.mkdtemp(prefix="ql-bench-steps-"))
    try:
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp / "site"), os.environ.get("PYTHONPATH")]))
        env["BENCH_STEPS"] = json.dumps(STEPS)

        # The embedded host, 4 in flight (bench_cluster's own host script).
        env["BENCH_STEPS_OUT"] = str(tmp / "host")
        host = subprocess.run([sys.executable, "-c", HOST, str(args.n), str(tmp / "embedded"), "4",
                               str(args.warmup_n)], env=env, capture_output=True, text=True, timeout=args.timeout)
        if host.returncode != 0:
            raise SystemExit(f"runner_steps: the embedded host failed: {host.stderr.strip().splitlines()[-1:]}")
        host_rate = float(host.stdout.strip().splitlines()[-1])

        # One worker (4 slots); Workers passes this process's environment on (QL_* aside).
        saved = dict(os.environ)
        os.environ.update({"PYTHONPATH": env["PYTHONPATH"], "BENCH_STEPS": env["BENCH_STEPS"],
                           "BENCH_STEPS_OUT": str(tmp / "worker")})
        try:
            with scratch_database() as (_url, dsn):
                key_file = tmp / "spec.key"
                new_key_file(key_file)
                workers = Workers(dsn, 1, tmp, key_file)
                try:
                    workers.wait_registered(args.timeout)
                    warm, _ = _submit(dsn, args.warmup_n, key_file)
                    workers.drain(warm, "warm-up", args.timeout)
                    time.sleep(1.5)  # the tracer's next write holds the whole warm-up
                    warm_calls = {label: len(d) for label, d in _collect(tmp / "worker").items()}
                    started = time.monotonic()
                    runs, _ = _submit(dsn, args.n, key_file)
                    workers.drain(runs, "steps", args.timeout)
                    worker_rate = args.n / (time.monotonic() - started)
                    time.sleep(1.5)  # one more write of the tracer's, past the last task
                finally:
                    workers.stop()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        # The warm-ups' calls out: the worker's as counted after its warm-up; the host's first
        # ``--warmup-n`` calls of each step (its warm-up runs one task at a time before the rest).
        host_steps = {label: d[args.warmup_n:] for label, d in _collect(tmp / "host").items()}
        worker_steps = {label: d[warm_calls[label]:] for label, d in _collect(tmp / "worker").items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"# python bench/runner_steps.py --n {args.n}: `true`, 4 in flight; the embedded host {host_rate:.0f} tasks/s "
          f"one worker ~{worker_rate:.0f} tasks/s (submission included)")
    print(f"  {'step, ms':>30}  {'host p50':>8} {'mean':>6}  {'worker p50':>10} {'mean':>6}  {'worker/host p50':>15}")
    for label, _m, _a in STEPS:
        h = [d / 1e6 for d in host_steps[label]]
        w = [d / 1e6 for d in worker_steps[label]]
        if not h or not w:
            print(f"  {label:>30}  (not called: host {len(h)}, worker {len(w)})")
            continue
        ratio = statistics.median(w) / statistics.median(h) if statistics.median(h) > 0 else float("inf")
        print(f"  {label:>30}  {statistics.median(h):8.2f} {statistics.mean(h):6.2f}  {statistics.median(w):10.2f} "
              f"{statistics.mean(w):6.2f}  {ratio:14.1f}x")


if __name__ == "__main__":
    main()
