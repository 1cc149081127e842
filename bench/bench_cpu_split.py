"""Where an embedded task's CPU goes: the host process vs its launchers (and the tasks they run).

    python bench/bench_cpu_split.py [--n 400] [--rounds 3] [--dir /var/tmp] [--src CHECKOUT ...]

``bench_edge.py --cpu-only`` gives one figure per awaited ``rt.run(["true"])`` (host, launchers
and tasks together, against a ``Popen`` host). This splits it, from ``getrusage``: the host's own
user and system time (``RUSAGE_SELF``), the launchers' with their tasks (``RUSAGE_CHILDREN``: the
standbys are the host's children; the factory counts once the runtime has closed and reaped it; a
publisher that outlives its launcher is nobody's child and is not counted), the host's voluntary
and involuntary context switches and the minor page faults on each side — per task, one line a
round. Use it for an A/B of two checkouts: ``--src A --src B`` runs each round of A, then of B, in
fresh interpreters (the machine's load moves every figure; compare the alternating rounds, and
prefer the fault and switch counts, which it moves less).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ONE = r"""
import json, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from ql_core.config import load_config
from ql_core.runtime import Runtime

n, where = int(sys.argv[2]), sys.argv[3]
data = Path(tempfile.mkdtemp(dir=where, prefix="ql-bench-split-")) / "d"
rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=data.parent))
for _ in range(20):
    rt.run(["true"])

def sample():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return [s.ru_utime, s.ru_stime, c.ru_utime, c.ru_stime, s.ru_nvcsw, s.ru_nivcsw, s.ru_minflt, c.ru_minflt]

a = sample()
for _ in range(n):
    rt.run(["true"])
rt.close()  # reaps the factory: its forks count
b = sample()
print(json.dumps([(y - x) / n for x, y in zip(a, b)]))
"""


def one_round(src: str, n: int, where: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "QL_DATA_DIR"}
    done = subprocess.run([sys.executable, "-c", _ONE, src, str(n), where], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp", help="where data dirs live (a real disk)")
    parser.add_argument("--src", action="append", help="a checkout to measure (repeat for an A/B); "
                                                       "default: this one")
    args = parser.parse_args()
    sources = [str(Path(s).resolve()) for s in (args.src or [str(ROOT)])]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ql-bench-split-") as where:
        print(f"# {args.n} awaited `true` tasks a round, load {os.getloadavg()[0]:.2f}; per task: ms of CPU, "
              f"switches, minor faults")
        print(f"{'checkout':40s} {'host u':>7s} {'host s':>7s} {'launch u':>8s} {'launch s':>8s} {'total':>7s} "
              f"{'vcsw':>5s} {'ivcsw':>5s} {'flt h':>6s} {'flt l':>6s}")
        for _ in range(args.rounds):
            for src in sources:
                d = one_round(src, args.n, where)
                ms = [x * 1e3 for x in d[:4]]
                print(f"{src[-40:]:40s} {ms[0]:7.3f} {ms[1]:7.3f} {ms[2]:8.3f} {ms[3]:8.3f} {sum(ms):7.3f} "
                      f"{d[4]:5.1f} {d[5]:5.1f} {d[6]:6.1f} {d[7]:6.1f}")


if __name__ == "__main__":
    main()
