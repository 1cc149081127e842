"""The `ql` command skeleton: usage errors, --json, doctor, db upgrade, plugins, lazy imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ql_core.db.migrate import SCHEMA_HEAD
from tests.conftest import QL, json_lines, run_ql


def test_help_and_plugins_do_not_import_sqlalchemy(ql_env: dict[str, str]) -> None:
    probe = ("import sys, runpy; sys.argv = ['ql'] + sys.argv[1:]\n"
             "from ql_core.cli.main import main\n"
             "rc = main(sys.argv[1:])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel', 'alembic'))\n"
             "print('HEAVY=' + ','.join(heavy))\n")
    for args in (["plugins"], ["plugins", "--json"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], env=ql_env, capture_output=True, text=True)
        assert "HEAVY=\n" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", probe.replace("rc = main(sys.argv[1:])",
                          "import contextlib\nwith contextlib.suppress(SystemExit): main(['--help'])")],
                         env=ql_env, capture_output=True, text=True)
    assert "HEAVY=\n" in out.stdout


def test_usage_error_is_one_line_exit_2(ql_env: dict[str, str]) -> None:
    out = run_ql(["frobnicate"], ql_env)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_config_error_is_one_line_exit_2(ql_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\npage_size = 0\n")
    out = run_ql(["--config", str(bad), "doctor"], ql_env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "ql: error: limits.page_size = 0 is out of range; allowed 1 to 256"]


def test_cluster_profile_refuses_sqlite_on_the_command_line(ql_env: dict[str, str]) -> None:
    out = run_ql(["--profile", "cluster-worker", "doctor"], ql_env)
    assert out.returncode == 2 and "needs database_url" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.fresh_data_dir  # doctor on a data dir nothing has used; `ql db upgrade` migrates it
def test_doctor_and_db_upgrade(ql_env: dict[str, str], data_dir: Path) -> None:
    out = run_ql(["doctor", "--json"], ql_env)
    assert out.returncode == 0, out.stderr
    checks = {r["check"]: r["result"] for r in json_lines(out.stdout) if "check" in r}
    assert checks == {"plugins": "ok", "data_dir": "ok", "owner": "ok", "permissions": "ok", "hard_links": "ok",
                      "o_append": "ok", "fsync": "ok", "database": "skipped", "schema": "skipped",
                      "containment": "ok", "launcher": "ok"}  # the local executor's (ql_doctor_checks)
    assert json_lines(out.stdout)[-1]["checks"] == checks and json_lines(out.stdout)[-1]["healthy"] is True
    assert list(data_dir.iterdir()) == []  # doctor created nothing, not even the database
    up = run_ql(["db", "upgrade", "--json"], ql_env)
    assert up.returncode == 0 and json_lines(up.stdout)[0]["revision"] == SCHEMA_HEAD
    assert (data_dir / "ql.db").stat().st_mode & 0o777 == 0o600
    out = run_ql(["doctor", "--json"], ql_env)
    checks = {r["check"]: r["result"] for r in json_lines(out.stdout) if "check" in r}
    assert out.returncode == 0 and checks["database"] == "ok" and checks["schema"] == "ok", out.stdout
    assert not any(p.name.startswith(".doctor-") for p in data_dir.iterdir())


def test_doctor_flags_loose_permissions(ql_env: dict[str, str], data_dir: Path) -> None:
    data_dir.chmod(0o755)
    out = run_ql(["doctor"], ql_env)
    assert out.returncode == 1 and "chmod 700" in out.stdout


def test_plugins_lists_active_and_errors(ql_env: dict[str, str]) -> None:
    out = run_ql(["plugins", "--json"], ql_env)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json_lines(out.stdout)}
    assert rows["local"]["state"] == "active" and rows["edge-sqlite"]["state"] == "active"
    env = dict(ql_env, QL_PLUGINS="local")
    out = run_ql(["plugins", "--json"], env)
    rows = {r["name"]: r for r in json_lines(out.stdout) if "state" in r}
    assert rows["edge-sqlite"]["state"] == "installed"
    # ...and the journal and receipt store the profile selects are then registered by nothing: problems.
    problems = {r["name"]: r["problem"] for r in json_lines(out.stdout) if "problem" in r}
    assert problems == {"file": "disabled_but_selected", "edge-sqlite": "disabled_but_selected"}
    assert out.returncode == 1


def test_version(ql_env: dict[str, str]) -> None:
    out = subprocess.run(QL + ["--version"], env=ql_env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ql ")
