"""What a one-shot ``ql run`` may import (issue 25 item 3: its CPU is mostly imports).

A later ``ql run -- true`` on the plain edge configuration pays for the modules that submit, wait
and complete a task, and nothing else: no entry-point scan (the plugin cache answers), no ORM or
migration machinery, no supervisor, metrics or web module, no dataclass it does not use.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import run_ql

#: Runs ``main()`` in-process, then names every module it imported that a run must not need.
PROBE = ("import sys\n"
         "from ql_core.cli.main import main\n"
         "rc = main(sys.argv[1:])\n"
         "heavy = ('sqlalchemy', 'sqlmodel', 'alembic', 'pydantic', 'psycopg', 'loguru', 'asyncio', 'stevedore',\n"
         "         'email', 'concurrent', 'multiprocessing')\n"
         "ours = ('importlib.metadata', 'ql_core.plugin_records', 'ql_core.supervisor', 'ql_core.follow',\n"
         "        'ql_core.metrics', 'ql_core.audit', 'ql_core.web', 'ql_core.cli.quick_read', 'ql_core.cli.run_many',\n"
         "        'ql_core.db.migrations', 'ql_plugins.cluster_fenced')\n"
         "found = sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(ours))\n"
         "sys.stderr.write('HEAVY=' + ','.join(found) + '\\n')\n"
         "sys.exit(rc)\n")


def test_a_later_ql_run_imports_only_what_runs_the_task(ql_env: dict[str, str]) -> None:
    first = run_ql(["run", "--", "true"], ql_env)  # the data dir's first use; it fills the plugin cache
    assert first.returncode == 0, first.stderr
    # The same interpreter and import path as the probe: the cache entry the probe looks up.
    warm = subprocess.run([sys.executable, "-c", PROBE, "run", "--", "true"], env=ql_env, capture_output=True,
                          text=True, timeout=60)
    assert warm.returncode == 0, warm.stderr
    out = subprocess.run([sys.executable, "-c", PROBE, "run", "--", "true"], env=ql_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    heavy = [line for line in out.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy == ["HEAVY="], out.stderr
