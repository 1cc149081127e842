"""Fixtures for the log and wake-up tests: runtimes with a chosen profile, limits and plugins."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from tests.logs.logs_support import write_config


@pytest.fixture
def make_runtime(data_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make_runtime(profile=..., plugins=(...), limits={...})`` -> an open Runtime on ``data_dir``."""
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    opened: list[Any] = []

    def make(*, profile: str = "standalone", plugins: tuple[str, ...] = (),
             limits: dict[str, Any] | None = None) -> Any:
        config = write_config(tmp_path, profile=profile, plugins=plugins, limits=limits)
        rt = Runtime.open(load_config(config_path=config, data_dir=data_dir, environ={}, cwd=tmp_path),
                          environ={})
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()
