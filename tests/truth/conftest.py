"""Fixtures for the crash-truth tests: real runtimes, real `ql` processes, faults produced for real."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


@pytest.fixture
def open_rt(data_dir: Path) -> Iterator[Callable[..., Any]]:
    """``open_rt(**limits)``: a runtime on this test's data dir (closed, its children reaped, at teardown)."""
    import dataclasses

    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    opened: list[Any] = []
    subs: list[Any] = []

    def make(profile: str = "edge", **limits: Any) -> Any:
        config = load_config(data_dir=data_dir, profile=profile, environ={}, cwd=data_dir)
        if limits:
            config = dataclasses.replace(config, profile=config.profile.with_overrides(limits))
        rt = Runtime.open(config)
        real_submit = rt.submit

        def tracked(*args: Any, **kwargs: Any) -> Any:
            sub = real_submit(*args, **kwargs)
            subs.append(sub)
            return sub

        rt.submit = tracked  # type: ignore[method-assign]
        opened.append(rt)
        return rt

    yield make
    for sub in subs:
        process = sub.task.live.process if sub.task is not None else None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)
    for rt in opened:
        rt.close()


@pytest.fixture
def standby_rt(open_rt: Callable[..., Any]) -> Any:
    """A runtime whose executor keeps standby launchers: skipped without the compiled launcher (no
    C compiler), failed instead under CI=true, where the compiled launcher is required."""
    runtime = open_rt()
    from ql_executors.local_process.compiled import CompiledLauncherError

    try:
        if runtime.executor.compiled_launcher() is None:
            raise CompiledLauncherError("no C compiler")
    except CompiledLauncherError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the compiled launcher is required under CI=true: {exc}")
        pytest.skip(f"standby launchers need the compiled launcher: {exc}")
    return runtime
