"""The read commands' quick path (issue 25 item 3): a terminal run is shown without loading plugins.

``ql status``, ``list``, ``events`` and ``logs`` on the plain edge configuration read the SQLite file
with prebuilt statements (``ql_core.cli.quick_read``); these tests pin what they may import, that
they print exactly what the full path (``Runtime.open(create=False)``) prints, and that a run that
still needs settling goes the full path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import json_lines, published_receipt, run_ql

#: Runs ``main()`` in-process, then names the heavy modules it imported.
PROBE = ("import sys\n"
         "from ql_core.cli.main import main\n"
         "rc = main(sys.argv[1:])\n"
         "heavy = ('sqlalchemy', 'sqlmodel', 'alembic', 'pluggy', 'stevedore', 'loguru', 'asyncio', 'subprocess',\n"
         "         'psycopg', 'ql_plugins', 'ql_executors')\n"
         "ours = ('ql_core.plugins', 'ql_core.node', 'ql_core.runtime', 'ql_core.db.journal_kernel',\n"
         "        'ql_core.ports.journal', 'ql_core.submit', 'ql_core.wait', 'importlib.metadata')\n"
         "found = sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in ours)\n"
         "sys.stderr.write('HEAVY=' + ','.join(found) + '\\n')\n"
         "sys.exit(rc)\n")

#: Prints what a full-path reader shows (the output the quick path must reproduce byte for byte).
FULL = ("import sys\n"
        "import ql_core.cli.quick_read as quick\n"
        "quick.quick_reader = lambda args: None\n"
        "quick.quick_reader_for_run = lambda args, attr='run_id': None\n"
        "from ql_core.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n")


def _probe(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60)
    heavy = [line for line in out.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy, out.stderr
    return out, [m for m in heavy[-1][len("HEAVY="):].split(",") if m]


def _full(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", FULL, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def ended(ql_env: dict[str, str]) -> str:
    """A run that ended (it printed two lines), in the test's data dir."""
    out = run_ql(["--json", "run", "--name", "two\nlines", "--", "sh", "-c", "echo one; echo two"], ql_env)
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)[0]["run_id"]


READS = [["status", "{run}"], ["--json", "status", "{run}"], ["list"], ["--json", "list"], ["events", "{run}"],
         ["--json", "events", "last"], ["logs", "{run}"], ["--json", "logs", "{run}"], ["logs", "{prefix}"],
         ["--json", "logs", "--offset", "4", "{run}"], ["list", "--status", "succeeded", "--limit", "1"]]


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a))
def test_a_read_of_an_ended_run_loads_no_plugin_and_prints_what_the_full_path_prints(
        ql_env: dict[str, str], ended: str, args: list[str]) -> None:
    argv = [a.format(run=ended, prefix=ended[:13]) for a in args]
    quick, heavy = _probe(ql_env, *argv)
    assert quick.returncode == 0, quick.stderr
    assert heavy == []
    full = _full(ql_env, *argv)
    assert full.returncode == 0, full.stderr
    assert quick.stdout == full.stdout and quick.stdout
    assert [line for line in quick.stderr.splitlines() if not line.startswith("HEAVY=")] == full.stderr.splitlines()


def test_a_run_that_needs_settling_takes_the_full_path(ql_env: dict[str, str], data_dir: Path) -> None:
    """A run whose task ended unseen (submitted with --detach) is still running in the store: status
    settles it from its receipt on the full path, as before."""
    out = run_ql(["--json", "run", "--detach", "--", "true"], ql_env)
    assert out.returncode == 0, out.stderr
    first = json_lines(out.stdout)[0]
    published_receipt(data_dir, first["attempt_id"])
    status, heavy = _probe(ql_env, "--json", "status", first["run_id"])
    assert status.returncode == 0 and json_lines(status.stdout)[0]["status"] == "succeeded", status.stderr
    assert "pluggy" in heavy  # settled by the node


@pytest.mark.parametrize("args", [["status", "0190ab"], ["events", "last"], ["logs", "nope!"]],
                         ids=lambda a: " ".join(a))
def test_what_the_quick_path_cannot_answer_is_explained_by_the_full_path(ql_env: dict[str, str],
                                                                       args: list[str]) -> None:
    quick, _ = _probe(ql_env, *args)
    full = _full(ql_env, *args)
    assert (quick.returncode, quick.stdout) == (full.returncode, full.stdout) and quick.returncode != 0
    assert [line for line in quick.stderr.splitlines() if not line.startswith("HEAVY=")] == full.stderr.splitlines()


def test_a_config_that_names_a_plugin_takes_the_full_path(ql_env: dict[str, str], ended: str) -> None:
    _, heavy = _probe(dict(ql_env, QL_DISABLE_PLUGINS="watchfiles"), "status", ended)
    assert "pluggy" in heavy


def test_the_quick_path_uses_the_edge_profiles_busy_timeout() -> None:
    from ql_core.db.sqlite_reads import EDGE_BUSY_TIMEOUT_MS
    from ql_core.profiles import PROFILES

    assert EDGE_BUSY_TIMEOUT_MS == PROFILES["edge"].busy_timeout_ms


def test_a_ql_toml_in_the_working_directory_is_read_by_the_quick_path_too(ql_env: dict[str, str], ended: str,
                                                                         data_dir: Path, tmp_path: Path) -> None:
    """./ql.toml naming the data dir: the reader loads the config (no QL_DATA_DIR) and finds the run."""
    env = {k: v for k, v in ql_env.items() if k != "QL_DATA_DIR"}
    (tmp_path / "ql.toml").write_text(f'data_dir = "{data_dir}"\n')
    out = subprocess.run([sys.executable, "-c", PROBE, "--json", "status", ended], env=env, capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and json_lines(out.stdout)[0]["run_id"] == ended, out.stderr
