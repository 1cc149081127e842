"""A throw-away host for the adversarial kill loop: submits mixed tasks, then waits for them.

    python kill_host.py DATA_DIR SEED N

Each run's name records what it was asked to do — ``code=C dur=D timeout=T`` (T = 0: none) — in
the create commit, so the test can judge every run's verdict even if this host dies at any moment.
Durations and timeouts never sit close together: a timeout is either far below or far above the
task's duration, so "timed out or not" is never a judgement call.
"""

from __future__ import annotations

import random
import sys

from ql_core.config import load_config
from ql_core.runtime import Runtime


def main() -> None:
    data_dir, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    print("open", flush=True)
    subs = []
    for _ in range(n):
        code = rng.choice([0, 0, 0, 1, 2, 3, 42, 255])
        duration = rng.choice([0.0, 0.05, 0.2, 0.4, 0.8])
        timeout = rng.choice([0.0, 0.0, 0.0, 3.0, 0.1 if duration >= 0.4 else 3.0])
        name = f"code={code} dur={duration} timeout={timeout}"
        subs.append(rt.submit([f"sleep {duration}; exit {code}"], shell=True, name=name,
                              timeout_s=timeout or None))
    print("submitted", flush=True)
    for sub in subs:
        rt.wait(sub)
    print("done", flush=True)


if __name__ == "__main__":
    main()
