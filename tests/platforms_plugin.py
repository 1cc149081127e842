"""Collects, during the test run, which portability claims passed on which platform (ADR gate 11).

Every test of ``tests/launcher`` and ``tests/powerloss`` is recorded with its platform: the launcher
shell, that shell's architecture and libc, the launcher's start mode, the identity source, and its
outcome. At the end of the session the results go to ``.ql-platforms/results.json`` and, for a full
run (``python -m pytest`` with no arguments, no ``-k``/``-m``), are rendered with
``tests/platforms_render.py`` and compared with the committed ``docs/platforms.md``:

- ``QL_PLATFORMS_UPDATE=1``: the committed file is rewritten;
- ``CI=true``: a difference fails the run, with the command that regenerates the file;
- otherwise: a difference is reported in the terminal summary.

The hooks are re-exported by ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .platforms_render import render

__all__ = [
    "pytest_runtest_logreport",
    "pytest_collection_modifyitems",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
]

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / ".ql-platforms"
DOC = ROOT / "docs" / "platforms.md"
REGENERATE = "QL_PLATFORMS_UPDATE=1 python -m pytest   # then commit docs/platforms.md"

GROUPS = {
    "test_launcher_signals.py": "signals",
    "test_launcher_exit.py": "exit codes + publication",
    "test_launcher_enospc.py": "ENOSPC (tmpfs)",
    "test_launcher_secrecy.py": "token secrecy",
    "test_launcher_host_death.py": "host SIGKILL",
    "test_launcher_busybox_only.py": "busybox-only PATH",
    "test_launcher_identity.py": "process identity",
    "test_powerloss_replay.py": "power-loss replay",
    "test_crash_model.py": "power-loss model",
}

_records: dict[str, dict[str, Any]] = {}
_meta: dict[str, Any] = {}


@functools.cache
def _shell_platform(shell: str) -> dict[str, str]:
    """Architecture, libc, version and default launcher mode of one launcher shell."""
    from .launcher.conftest import _shell_argv, launcher_mode

    info = {"shell": shell, "arch": platform.machine(), "libc": "glibc", "version": "?", "mode": "?"}
    if shell == "compiled-aarch64":  # the AArch64 wheel's launcher: built by a session fixture, not here
        return {**info, "arch": "aarch64 (qemu-user)", "libc": "glibc (static)", "version": "launcher.c, static (wheel)",
                "mode": "async"}
    argv, _why = _shell_argv(shell)
    libc, libc_version = platform.libc_ver()
    info["libc"] = f"{libc} {libc_version}".strip() or "?"
    if argv is None:
        return info
    binary = argv[1] if shell == "busybox-aarch64" else shutil.which(argv[0]) or argv[0]
    if shell == "busybox-aarch64":
        info["arch"] = "aarch64 (qemu-user)"
        blob = Path(binary).read_bytes()
        info["libc"] = "musl (static)" if b"musl" in blob else "glibc (static)"
    info["version"] = _version(shell, argv)
    info["mode"] = launcher_mode(argv)
    return info


def _version(shell: str, argv: list[str]) -> str:
    if shell in ("compiled", "compiled-standby", "compiled-factory"):
        # launcher.c as this machine's compiler built it: static unless it names a loader.
        head = Path(argv[0]).read_bytes()[:4096]
        return "launcher.c, " + ("dynamic" if b"ld-linux" in head or b"ld-musl" in head else "static")
    try:
        if shell.startswith("busybox"):
            out = subprocess.run([*argv[:-1]], capture_output=True, text=True, timeout=30).stdout
            return out.split()[1] if out.startswith("BusyBox") else "?"
        if shell.startswith("bash"):
            out = subprocess.run([argv[0], "--version"], capture_output=True, text=True, timeout=30)
            return out.stdout.split()[3].split("(")[0]
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", shell], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip() or "?"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def _dimensions(item: pytest.Item) -> dict[str, str] | None:
    group = GROUPS.get(Path(str(item.fspath)).name)
    if group is None:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    shell = params.get("shell")
    dims = {"group": group, "shell": "-", "arch": platform.machine(), "libc": "-", "mode": "-",
            "version": "-"}
    if isinstance(shell, str):
        dims.update(_shell_platform(shell))
    if group == "process identity":
        dims["group"] = f"identity: {params.get('source', 'either (handles, codec)')}"
    if group.startswith("power-loss"):
        dims["libc"] = "-"
    return dims


#: The user property that carries a test's platform dimensions from where it runs (this process, or
#: a pytest-xdist worker) to where the results are collected (this process, or the xdist controller):
#: reports cross that boundary with their user properties, items do not.
DIMS_PROPERTY = "ql_platform"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    for item in items:
        dims = _dimensions(item)
        if dims is not None:
            item.user_properties.append((DIMS_PROPERTY, json.dumps(dims, sort_keys=True)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    if DIMS_PROPERTY not in props:
        return
    dims = json.loads(props[DIMS_PROPERTY])
    rec = _records.setdefault(report.nodeid, {**dims, "outcome": "passed", "extra": {}})
    if report.skipped:
        rec["outcome"] = "skipped"
    elif report.failed:
        rec["outcome"] = "failed"
    for key, value in report.user_properties:
        if key != DIMS_PROPERTY:
            rec["extra"][key] = value


def _full_run(config: pytest.Config) -> bool:
    return (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and not config.getoption("keyword")
        and not config.getoption("markexpr")
        and not config.getoption("deselect")
        # ``lf`` is the cache provider's: absent under ``-p no:cacheprovider``.
        and not config.getoption("lf", default=False)
    )


def _features() -> dict[str, str]:
    pidfd = "no"
    if hasattr(os, "pidfd_open"):
        try:
            os.close(os.pidfd_open(os.getpid()))
            pidfd = "yes (not used by ql)"
        except OSError:
            pass
    return {
        "kernel": platform.system(),
        "/proc identity": "yes" if os.path.exists("/proc/self/stat") else "no",
        "pidfd_open": pidfd,
        "root (tmpfs mounts)": "yes" if os.geteuid() == 0 else "no",
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _records or hasattr(session.config, "workerinput"):
        return  # nothing recorded, or an xdist worker: the controller collects every worker's reports
    OUT_DIR.mkdir(exist_ok=True)
    results = {"features": _features(), "tests": [
        {"nodeid": k, **v} for k, v in sorted(_records.items())
    ]}
    (OUT_DIR / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if not _full_run(session.config):
        _meta["doc"] = "partial run: docs/platforms.md not compared"
        return
    text = render(results)
    (OUT_DIR / "platforms.md").write_text(text)
    committed = DOC.read_text() if DOC.exists() else ""
    if text == committed:
        _meta["doc"] = "docs/platforms.md matches this run"
    elif os.environ.get("QL_PLATFORMS_UPDATE") == "1":
        DOC.write_text(text)
        _meta["doc"] = "docs/platforms.md rewritten from this run"
    elif os.environ.get("CI") == "true":
        _meta["doc"] = (f"FAILED: docs/platforms.md does not match this run "
                        f"(rendered: .ql-platforms/platforms.md); regenerate: {REGENERATE}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        _meta["doc"] = f"docs/platforms.md differs from this run; regenerate: {REGENERATE}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if "doc" in _meta:
        terminalreporter.write_line(f"platforms: {_meta['doc']}")
