"""Run one benchmark script against two checkouts of ql, interleaved, and print the ratio of each figure.

    python bench/bench_before_after.py --before /path/to/old/checkout [--reps 3] -- bench/bench_completion.py --n 300

Each checkout runs *its own copy* of the named script (``<tree>/bench/...``;
with ``--same-script``, the newer checkout's copy for both) with ``PYTHONPATH=<tree>`` (so its ``ql_core`` is imported, ahead of the
installed one) and ``--json``; runs alternate old, new, old, new... so load
changes hit both alike. For every numeric key of the JSON output it prints
the median before, the median after and after/before. Keys only one side
prints are shown with a dash. Nested objects are flattened (``a.b``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def _flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}{key}."))
    elif isinstance(obj, list):  # e.g. bench_cluster's "workers": one entry per worker count
        for i, value in enumerate(obj):
            out.update(_flatten(value, f"{prefix}{i}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix.rstrip(".")] = float(obj)
    return out


def run_once(tree: Path, script: Path, args: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, str(script), *args, "--json"], env=env, capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed in {tree}:\n{proc.stderr[-2000:]}")
    return _flatten(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path, help="the older checkout")
    parser.add_argument("--after", default=HERE, type=Path, help="the newer checkout (default: this one)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--normalize", metavar="KEY",
                        help="divide every figure by KEY of the same run (e.g. a floor measured in that run), "
                             "so machine load cancels out")
    parser.add_argument("--same-script", action="store_true",
                        help="run the newer checkout's copy of the script against both trees")
    parser.add_argument("script", help="e.g. bench/bench_completion.py")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = [a for a in opts.args if a != "--"]
    samples: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for _ in range(opts.reps):
        for side, tree in (("before", opts.before), ("after", opts.after)):
            script = (opts.after if opts.same_script else tree).resolve() / opts.script
            figures = run_once(tree.resolve(), script, args)
            floor = figures.get(opts.normalize) if opts.normalize else None
            for key, value in figures.items():
                if floor:
                    value = value / floor
                samples[side].setdefault(key, []).append(value)
    keys = sorted(set(samples["before"]) | set(samples["after"]))
    print(f"{opts.script} {' '.join(args)}: median of {opts.reps} interleaved runs per side"
          + (f"; every figure divided by {opts.normalize} of its own run" if opts.normalize else ""))
    print(f"{'figure':<52} {'before':>12} {'after':>12} {'after/before':>13}")
    for key in keys:
        b = statistics.median(samples["before"][key]) if key in samples["before"] else None
        a = statistics.median(samples["after"][key]) if key in samples["after"] else None
        ratio = f"{a / b:>12.2f}x" if a is not None and b else f"{'-':>13}"
        print(f"{key[:52]:<52} {b if b is not None else '-':>12.6g} {a if a is not None else '-':>12.6g} {ratio}"
              if a is not None and b is not None else
              f"{key[:52]:<52} {('%.6g' % b) if b is not None else '-':>12} {('%.6g' % a) if a is not None else '-':>12} {ratio}")


if __name__ == "__main__":
    main()
