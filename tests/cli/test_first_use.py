"""Fifty `ql run` processes start at once on a data dir that does not exist yet: every one succeeds.

The first use creates the data dir, its node id and the database, and migrates it (in a child
process, under a file lock); the others wait for that instead of failing with "database is locked".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import QL

N = 50


@pytest.mark.slow  # fifty `ql` processes migrate-or-wait at once
def test_fifty_first_uses_at_once_all_succeed(tmp_path: Path, ql_env: dict[str, str]) -> None:
    data = tmp_path / "fresh" / "data"
    env = dict(ql_env, QL_DATA_DIR=str(data))
    procs = [subprocess.Popen([*QL, "run", "--", "sh", "-c", f"exit {3 + i % 3}"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(N)]
    results = []
    for i, proc in enumerate(procs):
        _out, err = proc.communicate(timeout=300)
        results.append((3 + i % 3, proc.returncode, err.strip()))
    assert [r for r in results if r[0] != r[1]] == []
    out = subprocess.run([*QL, "--json", "list", "--limit", "100"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    runs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(runs) == N
    assert sorted(r["exit_code"] for r in runs) == sorted(3 + i % 3 for i in range(N))
    assert (data / "ql.db").stat().st_mode & 0o777 == 0o600
    assert data.stat().st_mode & 0o777 == 0o700
