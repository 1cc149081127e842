"""Helpers for the log and wake-up tests (imported by name: tests/logs is on sys.path)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ql_core.testing.executor import wait_until

PY = sys.executable


def write_config(directory: Path, *, profile: str = "standalone", plugins: tuple[str, ...] = (),
                 limits: dict[str, Any] | None = None) -> Path:
    lines = [f'profile = "{profile}"', f"plugins = {list(plugins)!r}".replace("'", '"')]
    if limits:
        lines.append("[limits]")
        lines += [f"{k} = {v}" for k, v in limits.items()]
    path = directory / "ql.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """ql_core.testing's poller (``wait_until``), with this folder's argument order."""
    return wait_until(predicate, "the condition", timeout, interval=interval)


def thread_names() -> set[str]:
    return {t.name for t in threading.enumerate()}


def reap(sub: Any) -> None:
    """Reap a launcher we are the parent of (no zombie, no ResourceWarning), the executor's way
    (through its pidfd, which goes with it)."""
    if sub.task is not None:
        assert sub.task.live.child.wait(60) is not None


def lines_script(n: int, delay: float, *, exit_code: int = 0, prefix: str = "line") -> list[str]:
    """argv of a task printing ``n`` numbered lines with ``delay`` s between them."""
    code = ("import sys, time\n"
            f"for i in range({n}):\n"
            f"    sys.stdout.write('{prefix} %05d\\n' % i); sys.stdout.flush(); time.sleep({delay})\n"
            f"sys.exit({exit_code})\n")
    return [PY, "-c", code]


def lines_output(n: int, prefix: str = "line") -> bytes:
    return b"".join(f"{prefix} {i:05d}\n".encode() for i in range(n))
