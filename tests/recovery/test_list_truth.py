"""`ql list --status running` never claims a run is running that it has not checked (docs/cli.md).

300 quick detached runs (submitted as ``ql run --detach`` does: not awaited, so recovery settles
them); once every task has exited and one supervisor round has passed, each row `ql list` prints is
either settled (verified: the state after a settle) or marked unverified (``verified: false`` and a
``?`` after the status in text) — none is a verified claim that a finished task is running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recovery.recovery_support import ql, ql_json, wait_until, write_config

from ql_core.reconciler import Reconciler

N = 300


@pytest.mark.slow  # 300 launchers
def test_list_running_after_300_quick_detached_runs_is_truthful(rt_factory, ql_env: dict[str, str],
                                                                tmp_path: Path) -> None:
    rt = rt_factory("standalone")
    subs = [rt.submit(["true"], awaited=False) for _ in range(N)]
    runs = [sub.run_id for sub in subs]
    receipts = Path(rt.config.data_dir) / "receipts"
    wait_until(lambda: len(list(receipts.glob("*/*.json"))) >= N, timeout=300, interval=0.2,
               message="every detached task published its receipt")
    for sub in subs:  # every launcher has exited (reaped here: they are this process's children)
        sub.task.live.process.wait(timeout=60)
    report = Reconciler(rt.node).round()  # one round: settles at most page_size * pages_per_round of them
    assert 0 < report.attempts_touched < N  # the round alone does not settle them all

    config = write_config(tmp_path / "ql.toml", "standalone")
    rows = ql_json(["list", "--status", "running", "--limit", "1000"], ql_env, config=config, timeout=300)
    still = N - report.attempts_touched
    assert len(rows) == still and {r["run_id"] for r in rows} <= set(runs)
    verified = [r for r in rows if r["verified"]]
    unverified = [r for r in rows if not r["verified"]]
    assert len(verified) == rt.profile.page_size  # settled by this read, as much as its budget allows
    assert all(r["status"] == "succeeded" for r in verified)  # no verified "running"
    assert unverified and all(r["status"] == "running" for r in unverified)

    text = ql(["list", "--status", "running", "--limit", "1000"], ql_env, config=config, timeout=300).stdout
    marked = [line.split()[1] for line in text.splitlines() if line.strip()]
    assert "running?" in marked and "running" not in marked  # every running row carries the marker

    # Reading again and again drains them: each read settles its budget; never a verified "running".
    for _ in range(N):
        rows = ql_json(["list", "--status", "running", "--limit", "1000"], ql_env, config=config, timeout=300)
        assert not [r for r in rows if r["verified"] and r["status"] == "running"]
        if not rows:
            break
    assert rows == []
    assert {v.status for v in rt.list_runs(limit=1000)} == {"succeeded"}
