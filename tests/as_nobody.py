"""Running ql as user ``nobody`` from a test running as root, wherever the checkout lives.

A checkout (or its venv) under a directory ``nobody`` cannot search — any clone under ``/root``, a
0700 temp dir — gives a ``nobody`` process ``ModuleNotFoundError``. Then :func:`nobody_env` makes
world-readable copies (a temp dir removed at exit) of what ql imports — its packages and, when the
venv too is out of reach, the venv's site-packages — and names them in PYTHONPATH. Where even that
does not give a working ``import``, :func:`require_nobody` skips with the reason.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

__all__ = ["AS_NOBODY", "nobody_env", "require_nobody"]

#: Run a command as user nobody (no supplementary groups).
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

_PACKAGES = ("ql_core", "ql_executors", "ql_plugins")
_PROBE = "import ql_core.cli.main, ql_executors.local_process.plugin, ql_plugins"


def _checkout() -> Path:
    import ql_core

    return Path(ql_core.__file__).resolve().parent.parent


def _probe(pythonpath: list[str]) -> str | None:
    """None when ``nobody`` imports ql with this PYTHONPATH, else the last line of its error."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    try:
        out = subprocess.run([*AS_NOBODY, sys.executable, "-c", _PROBE], env=env, cwd="/", capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if out.returncode == 0:
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {out.returncode}"


def _readable_copy(sources: list[Path]) -> Path:
    base = Path(tempfile.mkdtemp(prefix="ql-test-nobody-"))
    atexit.register(shutil.rmtree, base, True)
    for src in sources:
        shutil.copytree(src, base / src.name, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(base):
        for name in dirs + files:
            p = Path(root, name)
            if not p.is_symlink():
                mode = p.stat().st_mode
                p.chmod(mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
                        | (stat.S_IXGRP | stat.S_IXOTH if mode & stat.S_IXUSR or p.is_dir() else 0))
    base.chmod(0o755)
    return base


@functools.cache
def _pythonpath() -> tuple[list[str], str | None]:
    """(PYTHONPATH entries for a ``nobody`` ql process, None) or ([], why it cannot be had)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return [], "needs root and setpriv (util-linux) to run ql as nobody"
    first = _probe([])
    if first is None:
        return [], None
    checkout = _checkout()
    packages = _readable_copy([checkout / name for name in _PACKAGES])
    if _probe([str(packages)]) is None:
        return [str(packages)], None
    site = Path(sysconfig.get_paths()["purelib"])
    deps = _readable_copy([site])
    path = [str(packages), str(deps / site.name)]
    why = _probe(path)
    if why is None:
        return path, None
    return [], (f"user nobody cannot import ql from {checkout} nor from readable copies "
                f"(a directory above it that nobody cannot search?): {first}; with copies: {why}")


def require_nobody() -> None:
    """Skip (naming why) unless a ``nobody`` ql process can be had here; under CI=true, fail."""
    _path, why = _pythonpath()
    if why is not None:
        if os.environ.get("CI") == "true" and "needs root" in why:
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)


def nobody_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a ql process run as nobody (skips the test when none can be had)."""
    require_nobody()
    path, _why = _pythonpath()
    if not path:
        return env
    out = dict(env, PYTHONDONTWRITEBYTECODE="1")
    out["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    return out
