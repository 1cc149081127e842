"""Submit-to-exec latency: ql (Runtime.submit, and the `ql run --detach` command) vs bare Popen.

    python bench/bench_submit.py [--n 30]

"exec" = the moment the user command's first instruction runs: the command is
`date +%s%N > FILE` in every variant, so date's own start-up cost is in the
baseline too. Each variant's median and its ratio to the Popen baseline,
measured in the same run on the same machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wait_stamp(path: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.0005)
    raise TimeoutError(path)


def measure(label: str, start, n: int, tmp: Path) -> list[float]:
    samples = []
    for i in range(n):
        stamp = tmp / f"{label.replace(' ', '_')}-{i}"
        t0 = time.time_ns()
        start(["sh", "-c", f"date +%s%N > {stamp}"])
        samples.append((wait_stamp(stamp) - t0) / 1e6)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--json", action="store_true", help="print one JSON object of medians (ms)")
    args = parser.parse_args()
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        data = tmp / "data"
        rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=tmp))
        children: list[subprocess.Popen[bytes]] = []

        def popen(cmd: list[str]) -> None:
            children.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True))

        def ql_submit(cmd: list[str]) -> None:
            sub = rt.submit(cmd)
            # (ql before the plugin seams kept the launcher's Popen as sub.process)
            children.append(sub.task.live.process if hasattr(sub, "task") else sub.process)

        env = dict(os.environ, QL_DATA_DIR=str(data))

        def ql_cli(cmd: list[str]) -> None:
            subprocess.run([sys.executable, "-m", "ql_core.cli.main", "run", "--detach", "--", *cmd], env=env,
                           stdout=subprocess.DEVNULL, check=True)

        results = {
            "bare subprocess.Popen": measure("popen", popen, args.n, tmp),
            "ql Runtime.submit": measure("submit", ql_submit, args.n, tmp),
            "ql run --detach (CLI)": measure("cli", ql_cli, max(5, args.n // 3), tmp),
        }
        for child in children:
            child.wait()
        rt.reconcile()
        rt.close()
    base = statistics.median(results["bare subprocess.Popen"])
    if args.json:
        import json

        print(json.dumps({f"{label} median ms": statistics.median(v) for label, v in results.items()}))
        return
    print(f"{'variant':<26} {'median ms':>10} {'p90 ms':>8} {'vs Popen':>9}")
    for label, samples in results.items():
        med = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) >= 10 else max(samples)
        print(f"{label:<26} {med:>10.2f} {p90:>8.2f} {med / base:>8.1f}x")
    print("(Runtime.submit: with the compiled launcher, one SQLite commit with synchronous=FULL (the create "
          "commit, holding a standby launcher's handle), the receipt shard, the log artifact and the hand-over "
          "before the command runs; the classic path (launcher.sh, [plugin.local] standby = false) adds a "
          "launcher spawn and a second commit; the CLI adds the Python interpreter start-up and imports)")


if __name__ == "__main__":
    main()
