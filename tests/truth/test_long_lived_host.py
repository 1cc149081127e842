"""A long-lived embedding host stays bounded: descriptors, connections, children.

A real host process (``long_lived_host.py``) runs many ``true`` tasks from short-lived threads —
half awaited, half submitted and never waited for (kept, never dropped) — under a 256-descriptor
``RLIMIT_NOFILE``. After its own bounded clean-up (supervisor rounds until no run is running, then
one more task) it must hold exactly the descriptors and child processes it held after warming up,
no submit may have failed, and every run must have ended ``succeeded`` (an unwaited run through
its receipt, whether or not its launcher was reaped before the round).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

HOST = Path(__file__).with_name("long_lived_host.py")


def _kind(target: str) -> str:
    """A descriptor by what it points at, without the inode (the standby's channel is a new one)."""
    return re.sub(r"\[\d+\]$", "", target)


def _run_host(data_dir: Path, threads: int, per_thread: int, *, concurrent: int = 8, nofile: int = 256) -> Any:
    done = subprocess.run([sys.executable, str(HOST), str(data_dir), str(threads), str(per_thread),
                           str(concurrent), str(nofile)], capture_output=True, timeout=1800, cwd=data_dir)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _check(report: Any, tasks: int) -> None:
    assert report["failed"] == 0, report["failures"]
    assert report["statuses"] == {"succeeded": tasks}, report["statuses"]
    assert report["kept"] == tasks // 2
    assert report["connections"] == 1  # the main thread's: every task thread's closed with it
    before, after = report["before"], report["after"]
    assert Counter(map(_kind, after["fds"])) == Counter(map(_kind, before["fds"])), (before["fds"], after["fds"])
    # The same number of children, none a zombie: the ready standby (a new one: each hand-over
    # replaces it), nothing else.
    assert [state for _pid, state in after["children"]] == [state for _pid, state in before["children"]]
    assert all(state != "Z" for _pid, state in after["children"]), after["children"]


def test_a_host_of_short_lived_threads_ends_with_what_it_started_with(data_dir: Path) -> None:
    """100 threads × 4 tasks, half never waited for, under RLIMIT_NOFILE = 256."""
    _check(_run_host(data_dir, 100, 4), 400)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # as long as the host's own bound: 10,000 tasks on a loaded 2-core
def test_ten_thousand_tasks_from_a_thousand_threads_leak_nothing(data_dir: Path) -> None:
    """The issue's scale: 1,000 short-lived threads × 10 tasks, half never waited for, 256 fds."""
    _check(_run_host(data_dir, 1000, 10), 10_000)
