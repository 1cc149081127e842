"""A throw-away host for the adversarial kill loop: submits mixed tasks, then waits for them.

    python kill_host.py DATA_DIR SEED N MARKS KEY_PREFIX

Each run is asked for what ``kill_loop_tasks.choose`` picks (recorded in its name in the create
commit, so the test can judge every run's verdict even if this host dies at any moment); about half
are ``awaited`` (the acknowledged path: the task's receipt is held back while this host waits, as
for ``ql run``), the others publish their receipts themselves. For every run it waited for it prints
``waited RUN_ID STATUS EXIT_CODE``: what the waiting host was told, which the test compares with
how the run really ended.

Under libfaketime (``LD_PRELOAD`` set: the loop steps this host's wall clock) the tasks get an
environment without it: a task's sleep is the real duration the loop is about.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from kill_loop_tasks import choose, script

from ql_core.config import load_config
from ql_core.runtime import Runtime


def main() -> None:
    data_dir, seed, n, marks, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
    rng = random.Random(seed)
    task_env = None
    if "LD_PRELOAD" in os.environ:
        task_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("FAKETIME")}
    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    print("open", flush=True)
    subs = []
    for i in range(n):
        asked = choose(rng, f"{prefix}-{i}")
        subs.append(rt.submit([script(asked, marks)], shell=True, name=asked.name, timeout_s=asked.timeout or None,
                              env=task_env, awaited=rng.random() < 0.5))
    print("submitted", flush=True)
    for sub in subs:
        view = rt.wait(sub)
        print(f"waited {sub.run_id} {view.status} {view.exit_code}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
