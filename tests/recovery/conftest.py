"""Fixtures of the recovery tests (ADR-0007 §2.6, §2.7; DESIGN.md §2): real processes, real SQLite.

``data_dir`` and ``ql_env`` come from ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from tests.recovery.recovery_support import kill_group  # noqa: E402


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups a test started; each is SIGKILLed at teardown (tasks must not outlive tests)."""
    started: list[int] = []
    yield started
    for pgid in started:
        kill_group(pgid)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A long-lived process in its own session: a *live* identity for rows inserted by a test.

    Rows that point at it classify as ``running``; it is its own group leader, so even a
    mistaken signal could only ever reach this sleeper.
    """
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def sleeper_handle(sleeper: subprocess.Popen[bytes]) -> dict[str, Any]:
    from ql_executors.local_process.identity import capture_handle

    h = capture_handle(sleeper.pid)
    assert h is not None
    return {"boot_id": h.boot_id, "pid": h.pid, "pgid": h.pgid, "start_time": h.start_time}


@pytest.fixture
def rt_factory(data_dir: Path) -> Iterator[Any]:
    """Open runtimes on this test's data dir with limit overrides: ``rt_factory(page_size=3, ...)``."""
    from tests.recovery.recovery_support import open_runtime

    opened: list[Any] = []

    def make(profile: str = "edge", **limits: Any) -> Any:
        rt = open_runtime(data_dir, profile, **limits)
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()
