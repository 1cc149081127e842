"""The read commands answer from the SQLite file without SQLAlchemy, Alembic or plugin loading, and
still settle a run whose task ended when no supervisor runs (docs/cli.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("sqlalchemy", "sqlmodel", "alembic", "pluggy", "stevedore")

PROBE = ("import sys\nfrom ql_core.cli.main import main\n"
         "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
         f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})), file=sys.stderr)\n"
         "sys.exit(code)\n").replace("import sys", "import json, sys", 1)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("QL_")}


def ql(data: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ql_core.cli.main", "--data-dir", str(data), "--json", *argv],
                          env=env(), capture_output=True, text=True, timeout=120, check=False)


def probe(data: Path, *argv: str) -> tuple[int, str, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, "--data-dir", str(data), "--json", *argv], env=env(),
                          capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stdout, json.loads(done.stderr.strip().splitlines()[-1])


def test_status_list_events_of_ended_runs_import_no_heavy_module(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = ql(data, "run", "--", "true")
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout.splitlines()[0])["run_id"]
    for argv in (["status", run_id], ["list"], ["events", run_id]):
        code, stdout, heavy = probe(data, *argv)
        assert code == 0, argv
        assert heavy == [], argv
        assert run_id in stdout
    code, stdout, heavy = probe(data, "status", "no-such-run")
    assert code != 0 and heavy == []


def test_a_reader_still_settles_a_run_whose_task_ended(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # A detached submit from a host that exits at once: nobody waits, no supervisor runs.
    host = ("import sys\nfrom pathlib import Path\nfrom ql_core.config import load_config\n"
            "from ql_core.runtime import Runtime\n"
            f"rt = Runtime.open(load_config(data_dir=Path({str(data)!r}), environ={{}}, cwd=Path('/')))\n"
            "sub = rt.submit(['sh', '-c', 'exit 3'])\nprint(sub.run_id)\nrt.close()\n")
    done = subprocess.run([sys.executable, "-c", host], env=env(), capture_output=True, text=True, timeout=120,
                          check=True)
    run_id = done.stdout.strip()
    from ql_core.testing.executor import wait_until

    def ended() -> bool:
        status = ql(data, "status", run_id)
        assert status.returncode == 0, status.stderr
        return json.loads(status.stdout)["status"] == "failed"

    wait_until(ended, "ql status settles the ended run", timeout=60, interval=0.2)
    view = json.loads(ql(data, "status", run_id).stdout)
    assert view["exit_code"] == 3
