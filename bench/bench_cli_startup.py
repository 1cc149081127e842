"""Wall time of `ql --help` and `ql plugins` against `python -c pass`, measured in one run.

    python bench/bench_cli_startup.py [--n 20]

Prints medians and the ratio to the interpreter's own start-up; also which
heavy modules (sqlalchemy, sqlmodel, alembic) each command imported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROBE = ("import sys; from ql_core.cli.main import main\n"
         "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy','sqlmodel','alembic'))),"
         " file=sys.stderr)\n")


def median_wall(argv: list[str], n: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        env = dict(os.environ, QL_DATA_DIR=data_dir)
        ql = [sys.executable, "-m", "ql_core.cli.main"]
        rows = [
            ("python -c pass", [sys.executable, "-c", "pass"]),
            ("ql --help", ql + ["--help"]),
            ("ql plugins", ql + ["plugins"]),
            ("ql list (opens the database)", ql + ["list"]),
        ]
        base = None
        print(f"{'command':<32} {'median ms':>10} {'vs python':>10}")
        for label, argv in rows:
            wall = median_wall(argv, args.n, env)
            base = base or wall
            print(f"{label:<32} {wall * 1000:>10.1f} {wall / base:>9.2f}x")
        for label, extra in (("ql --help", ["--help"]), ("ql plugins", ["plugins"])):
            heavy = subprocess.run([sys.executable, "-c", PROBE, *extra], env=env, capture_output=True,
                                   text=True).stderr.strip().rpartition("\n")[2]
            print(f"{label}: heavy modules imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
