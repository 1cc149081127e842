"""Deployment hardening: with `[plugin.local] run_as`, a task runs as another user and cannot read its
launcher (which holds the token) — the same-user forgery the callback token cannot stop."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.as_nobody import AS_NOBODY, nobody_env
from tests.conftest import QL, run_ql

pytestmark = pytest.mark.root


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true runs as root with setpriv (util-linux)")
        pytest.skip("needs root and setpriv")


def test_a_task_runs_as_the_configured_user_and_cannot_read_its_launcher(root: None, ql_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    toml = tmp_path / "ql.toml"
    toml.write_text('[plugin.local]\nrun_as = "nobody"\n')
    script = ('id -u; if cat "/proc/$PPID/environ" >/dev/null 2>&1; then echo READ; else echo DENIED; fi; '
              'if head -c1 "/proc/$PPID/mem" >/dev/null 2>&1; then echo READ; else echo DENIED; fi')
    out = run_ql(["--config", str(toml), "run", "--cwd", "/", "--", "sh", "-c", script], ql_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(nobody.pw_uid), "DENIED", "DENIED"]


def test_run_as_needs_a_root_host(root: None) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ql-run-as-"))  # not under pytest's 0700 tmp tree: nobody reads it
    try:
        base.chmod(0o755)
        data = base / "data"
        data.mkdir()
        data.chmod(0o777)
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(data, nobody.pw_uid, nobody.pw_gid)  # writers refuse a data dir of another user
        toml = base / "ql.toml"
        toml.write_text('[plugin.local]\nrun_as = "nobody"\n')
        toml.chmod(0o644)
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        env.update(QL_DATA_DIR=str(data), QL_CONFIG=str(toml), HOME=str(base))
        out = subprocess.run([*AS_NOBODY, *QL, "run", "--", "true"], env=nobody_env(env), capture_output=True,
                             text=True, timeout=60, cwd=str(base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert out.returncode == 2, out.stderr
    assert "run_as needs the ql host to run as root" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("value, fragment", [("root", "must not be root"), ("no-such-user-ql", "no user"),
                                             ("", "must be a user name")])
def test_bad_run_as_values_are_one_line_errors(root: None, ql_env: dict[str, str], tmp_path: Path, value: str,
                                               fragment: str) -> None:
    toml = tmp_path / "ql.toml"
    toml.write_text(f'[plugin.local]\nrun_as = "{value}"\n')
    out = run_ql(["--config", str(toml), "run", "--", "true"], ql_env)
    assert out.returncode == 2 and fragment in out.stderr and "Traceback" not in out.stderr
