"""What every journal contract suite shares: the backend fixture, a fresh ``NewRun``, two owners.

A suite subclass provides ``make_backend(tmp_path)`` returning a fresh, empty, migrated backend;
:class:`JournalFixtures` turns it into the ``store`` fixture each test gets (closed afterwards).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from ql_core.ids import new_id
from ql_core.ports.journal import ConflictError, JournalBackend, StoreBusyError
from ql_core.records import NewRun

__all__ = ["OWNER", "OTHER", "JournalFixtures", "new_run", "retrying"]

#: The node whose attempts the suites page and reconcile.
OWNER = "01a00000-0000-7000-8000-00000000000a"
#: Another node sharing the store (its attempts must never show in OWNER's pages).
OTHER = "01a00000-0000-7000-8000-00000000000b"


def new_run(*, owner: str = OWNER, deadline_at_ms: int | None = None, created_at_ms: int | None = None,
            name: str | None = None, executor: str = "test-executor") -> NewRun:
    """A NewRun with fresh ids (what core's create commit hands the backend)."""
    run_id, attempt_id, log_id = new_id(), new_id(), new_id()
    return NewRun(run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id, name=name, executor=executor,
                  runtime_owner=owner, callback_token_hash="0" * 64,
                  created_at_ms=created_at_ms if created_at_ms is not None else time.time_ns() // 1_000_000,
                  deadline_at_ms=deadline_at_ms, log_relative_path=f"{log_id[-2:]}/{log_id}.log",
                  log_max_bytes=1 << 20, receipt_ref=f"{attempt_id[-2:]}/{attempt_id}.json")


def retrying(call: Callable[[], Any], tries: int = 200) -> Any:
    """``call()`` until it stops losing to a concurrent writer (what core's bounded retry does)."""
    for _ in range(tries):
        try:
            return call()
        except (ConflictError, StoreBusyError):
            time.sleep(0.002)
    raise AssertionError("still conflicting after many tries")


class JournalFixtures:
    """The fixtures of every journal suite: subclass a suite and provide ``make_backend``."""

    @pytest.fixture
    def make_backend(self) -> Callable[[Path], JournalBackend]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide a make_backend fixture")

    @pytest.fixture
    def store(self, make_backend: Callable[[Path], JournalBackend], tmp_path: Path) -> Any:
        backend = make_backend(tmp_path)
        yield backend
        close = getattr(backend, "close", None)  # a store tested by parts may not have it yet
        if close is not None:
            close()
