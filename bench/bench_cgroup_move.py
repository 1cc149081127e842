"""What a task's cgroup costs, step by step: mkdir, moving a forked child in, rmdir.

    python bench/bench_cgroup_move.py [--n 300]

Needs a writable cgroup v2 parent (as ql's containment finds it: root, or a delegated cgroup).
Moving a process by writing to ``cgroup.procs`` waits for an RCU grace period on most kernels:
that is why the compiled launcher forks its child straight into the cgroup (``clone3`` with
``CLONE_INTO_CGROUP``) and moves it only where ``clone3`` is refused (docs/launcher.md,
"Containment").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ql_executors.local_process.containment import find_containment  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    n = parser.parse_args().n
    found = find_containment("auto")
    if found.parent is None:
        raise SystemExit(f"no cgroup v2 containment here: {found.reason}")
    made = moved = removed = 0.0
    for _ in range(n):
        path = os.path.join(found.parent, str(uuid.uuid4()))
        t = time.perf_counter()
        os.mkdir(path)
        made += time.perf_counter() - t
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            t = time.perf_counter()
            fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)
            os.write(w, repr(time.perf_counter() - t).encode())
            os._exit(0)
        os.close(w)
        moved += float(os.read(r, 100))
        os.close(r)
        os.waitpid(pid, 0)
        t = time.perf_counter()
        os.rmdir(path)
        removed += time.perf_counter() - t
    print(f"n={n} parent={found.parent}: mkdir {made / n * 1e3:.3f} ms, move by cgroup.procs "
          f"{moved / n * 1e3:.3f} ms, rmdir {removed / n * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
