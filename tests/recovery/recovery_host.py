"""A throw-away host for the crash loop: submits short tasks with known exit codes, then waits.

    python recovery_host.py DATA_DIR SEED N

Each task is ``echo ran; sleep 0.XX; exit CODE`` with CODE recorded in the run's name (``code=CODE``) in the
create commit, so the test knows every run's true exit code even if this host dies at any moment.
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
        duration = rng.randint(0, 60)
        # "ran" in the log is the proof that the command started (a run ended without its status
        # must show an empty log when nothing ran).
        subs.append(rt.submit([f"echo ran; sleep {duration / 100:.2f}; exit {code}"], shell=True,
                              name=f"code={code}"))
    print("submitted", flush=True)
    for sub in subs:
        rt.wait(sub)
    print("done", flush=True)


if __name__ == "__main__":
    main()
