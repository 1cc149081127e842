"""Fixtures for the completion tests: tasks that are always cleaned up, a private PostgreSQL database."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.conftest import clone_postgres


@pytest.fixture
def triggers(tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """``new_trigger()`` → a fresh path; at teardown every trigger is created so no task lingers."""
    made: list[Path] = []

    def new_trigger() -> Path:
        path = tmp_path / f"go-{len(made)}"
        made.append(path)
        return path

    yield new_trigger
    for path in made:
        path.touch()


@pytest.fixture
def tasks() -> Iterator[list[Any]]:
    """Submissions started in this process; at teardown each launcher group still alive is killed and reaped.

    We are the launcher's parent and reap it only here, so its pid (= its process
    group id) cannot have been reused when we signal it.
    """
    subs: list[Any] = []
    yield subs
    for sub in subs:
        process = sub.task.live.process if sub.task is not None else None
        if process is None or process.poll() is not None:
            continue
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)


@pytest.fixture
def submit(runtime: Any, tasks: list[Any]) -> Callable[..., Any]:
    """``submit(cmd, **kw)``: rt.submit through the real executor, tracked for cleanup."""

    def do(command: list[str], **kwargs: Any) -> Any:
        sub = runtime.submit(command, **kwargs)
        tasks.append(sub)
        return sub

    return do


@pytest.fixture
def pg_url(postgres_url: str, postgres_template: str) -> Iterator[str]:
    """A PostgreSQL database of this test's own (other tests' nodes share none of its rows), cloned
    from the session's migrated template."""
    with clone_postgres(postgres_url, postgres_template, "ql_completion_") as url:
        yield url
