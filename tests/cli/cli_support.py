"""Helpers for the `ql` command tests: run the real command as this user or as nobody."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.as_nobody import AS_NOBODY, nobody_env
from tests.conftest import POSTGRES_DSN_ENV, QL


def can_switch_user() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def clean_env(home: Path | str, **extra: str) -> dict[str, str]:
    """The test process's environment without QL_* settings, with its own HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_") or k == POSTGRES_DSN_ENV}
    env.pop("XDG_STATE_HOME", None)
    env["HOME"] = str(home)
    env.update(extra)
    return env


def ql_proc(args: list[str], env: dict[str, str], *, user: str | None = None, close_stdout: bool = False,
            timeout: float = 60, cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `ql` command (optionally as nobody, optionally with stdout closed)."""
    argv = list(QL) + args
    if close_stdout:
        argv = ["sh", "-c", 'exec "$@" >&-', "sh", *argv]
    if user == "nobody":
        argv = AS_NOBODY + argv
        env = nobody_env(env)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd or "/")


def seed_data_dir(path: Path, env: dict[str, str], *runs: list[str]) -> None:
    """A used data dir: ``ql run`` each command (``true`` when none given)."""
    path.mkdir(mode=0o700, exist_ok=True)
    for command in runs or (["true"],):
        out = ql_proc(["--data-dir", str(path), "run", "--", *command], env)
        assert out.returncode in (0, 3), out.stderr




def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
