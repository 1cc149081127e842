"""`ql run --env K=V` / `--env K` on a local run: what the task sees, and the mistakes (exit 2, one
line, never the value)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env, ql_proc


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home", QL_DATA_DIR=str(tmp_path / "data"), QL_T_COPIED="from-the-submitter")


def test_env_options_add_to_the_tasks_environment(env: dict[str, str]) -> None:
    script = ('test "$QL_T_SET" = "a b=c" && test "$QL_T_COPIED" = from-the-submitter && test "$QL_T_TWICE" = 2 '
              '&& test -n "$HOME"')  # added on top of ql's own environment
    out = ql_proc(["--json", "run", "--env", "QL_T_SET=a b=c", "--env", "QL_T_COPIED", "--env", "QL_T_TWICE=1",
                   "--env", "QL_T_TWICE=2", "--", "sh", "-c", script], env)
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout.splitlines()[0])["run_id"]
    events = ql_proc(["--json", "events", run_id], env)
    assert events.returncode == 0 and "a b=c" not in events.stdout and "from-the-submitter" not in events.stdout


@pytest.mark.parametrize("args, says", [
    (["--env", "1BAD=x"], "the 1st --env needs NAME=VALUE or NAME"),
    (["--env", "OK=1", "--env", "=secretvalue"], "the 2nd --env needs NAME=VALUE or NAME"),
    (["--env", "BAD-NAME=secretvalue"], "the 1st --env needs NAME=VALUE or NAME"),
    (["--env", "QL_T_NOT_SET_ANYWHERE"], "the 1st --env names a variable that is not set in ql's environment"),
])
def test_a_malformed_env_option_is_a_usage_error_that_never_shows_the_value(env: dict[str, str], tmp_path: Path,
                                                                            args: list[str], says: str) -> None:
    marker = tmp_path / "ran"
    out = ql_proc(["run", *args, "--", "touch", str(marker)], env)
    assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "secretvalue" not in out.stderr and not marker.exists()
