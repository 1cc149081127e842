"""Item 9 through the real `ql` command: an early SIGTERM, a log that cannot be created, E2BIG,
and `ql plugins` problems (duplicates, a disabled but selected plugin)."""

from __future__ import annotations

import fcntl
import os
import resource
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env, json_lines, ql_proc
from tests.conftest import QL


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home", QL_DATA_DIR=str(tmp_path / "data"))


def _wait_for_open(pid: int, suffix: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(suffix) for fd in os.listdir(f"/proc/{pid}/fd")):
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never opened *{suffix}")


def test_supervise_stops_cleanly_on_a_sigterm_while_it_is_still_starting(env, tmp_path: Path) -> None:
    """The TERM arrives while `ql supervise` waits to create the database: exit 0, not 143."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    lock_path = data / "ql.db.migrate-lock"
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the first start's migration waits for this
    proc = subprocess.Popen([*QL, "--json", "supervise"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_open(proc.pid, "ql.db.migrate-lock")  # it is blocked inside Runtime.open
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert proc.poll() is None  # not killed by the signal
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json_lines(out) == [{"type": "stopped", "drained": True, "rounds": 0}]


def test_a_log_that_cannot_be_created_ends_the_run_failed_saying_nothing_ran(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert ql_proc(["run", "--", "true"], env).returncode == 0
    import shutil

    shutil.rmtree(data / "logs")
    (data / "logs").write_text("not a directory")
    marker = tmp_path / "ran"
    out = ql_proc(["run", "--", "touch", str(marker)], env)
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert "nothing ran" in line and "marked failed" in line
    assert not marker.exists()
    newest = json_lines(ql_proc(["--json", "list", "--limit", "1"], env).stdout)[0]
    assert (newest["status"], newest["reason"]) == ("failed", "LOG_ARTIFACT_UNAVAILABLE")


def test_e2big_says_the_argument_list_is_too_long(env, tmp_path: Path) -> None:
    """Our own exec fits; the task's does not (its stack limit was lowered under us): E2BIG."""
    data = tmp_path / "data"
    assert ql_proc(["run", "--", "true"], env).returncode == 0
    config = tmp_path / "ql.toml"
    config.write_text("[limits]\nbusy_timeout_ms = 60000\n")
    holder = sqlite3.connect(data / "ql.db", isolation_level=None, timeout=10)
    holder.execute("BEGIN IMMEDIATE")  # ql cannot commit the run (nor spawn) until we let it
    args = ["x" * 2000] * 300  # 600 KB: fine under 8 MiB of stack (2 MiB of arguments), not under 1 MiB
    proc = subprocess.Popen([*QL, "--config", str(config), "run", "--", "echo", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_open(proc.pid, "ql.db")  # its runtime is open; the create commit waits for our lock
        time.sleep(0.3)
        _soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_STACK)
        resource.prlimit(proc.pid, resource.RLIMIT_STACK, (1 << 20, hard))
    finally:
        holder.execute("COMMIT")
        holder.close()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    (line,) = err.splitlines()
    assert "argument list" in line and "too long" in line and "E2BIG" in line
    assert "--cwd" not in line and "nothing ran" in line
    newest = json_lines(ql_proc(["--json", "list", "--limit", "1"], env).stdout)[0]
    assert (newest["status"], newest["reason"]) == ("failed", "SPAWN_FAILED")


def _fake_distribution(root: Path, name: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ql.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)


TWIN = ("from ql_core.hookspecs import hookimpl\n\n"
        "@hookimpl\n"
        "def ql_register_executors(register):\n"
        "    register('local', lambda context: None)\n")


def test_plugins_reports_a_name_declared_twice(env, tmp_path: Path) -> None:
    site = tmp_path / "site"
    _fake_distribution(site, "ql_impostor", {"local": "ql_impostor_mod"}, {"ql_impostor_mod": TWIN})
    out = ql_proc(["--json", "plugins"], dict(env, PYTHONPATH=str(site)))
    assert out.returncode == 1, out.stdout + out.stderr
    problems = [r for r in json_lines(out.stdout) if "problem" in r]
    assert any(p["problem"] == "duplicate_plugin" and p["name"] == "local" and "ql_impostor" in p["detail"]
               for p in problems), problems
    assert "Traceback" not in out.stderr


def test_plugins_reports_a_seam_registered_twice(env, tmp_path: Path) -> None:
    site = tmp_path / "site"
    _fake_distribution(site, "ql_twin", {"twin": "ql_twin_mod"}, {"ql_twin_mod": TWIN})
    config = tmp_path / "ql.toml"
    config.write_text('plugins = ["twin"]\n')
    out = ql_proc(["--config", str(config), "--json", "plugins"], dict(env, PYTHONPATH=str(site)))
    assert out.returncode == 1
    problems = {r["problem"]: r for r in json_lines(out.stdout) if "problem" in r}
    assert "registered twice" in problems["duplicate_registration"]["detail"]
    text = ql_proc(["--config", str(config), "plugins"], dict(env, PYTHONPATH=str(site))).stdout
    assert "problem: executor 'local' is registered twice" in text


@pytest.mark.parametrize("how", ["config", "environment"])
def test_plugins_reports_a_disabled_plugin_the_config_selects(env, tmp_path: Path, how: str) -> None:
    config = tmp_path / "ql.toml"
    config.write_text('disable_plugins = ["local"]\n' if how == "config" else "")
    run_env = dict(env, QL_DISABLE_PLUGINS="local") if how == "environment" else env
    out = ql_proc(["--config", str(config), "--json", "plugins"], run_env)
    assert out.returncode == 1
    (problem,) = [r for r in json_lines(out.stdout) if "problem" in r]
    assert (problem["problem"], problem["name"]) == ("disabled_but_selected", "local")
    assert "disabled by " + ("disable_plugins" if how == "config" else "QL_DISABLE_PLUGINS") in problem["detail"]
    assert ql_proc(["--json", "plugins"], env).returncode == 0  # the default set has no problem
