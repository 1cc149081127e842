"""History is never lost silently, and kept only as long as the profile says (bounded, never a live run).

- a `ql.db` truncated to 0 bytes (or deleted) in a data dir that was used before is refused with
  the recovery step, never silently replaced by an empty history;
- `sqlite:///:memory:` is refused (runs would vanish with the process);
- a data dir deleted under a waiting host makes it fail loudly instead of carrying on;
- runs, events, dispatch records and logs are forgotten by age and by count, bounded per round,
  never a non-terminal run and never one whose receipt may still exist.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests import dbview
from tests.conftest import QL, json_lines, release_host, run_ql

BOUND_S = 60


def test_a_truncated_database_of_a_used_data_dir_is_refused(ql_env: dict[str, str], data_dir: Path) -> None:
    assert run_ql(["run", "--", "true"], ql_env).returncode == 0
    (data_dir / "ql.db").write_bytes(b"")
    for f in data_dir.glob("ql.db-*"):
        f.unlink()
    for args in (["list"], ["run", "--", "true"], ["reconcile"]):
        out = run_ql(args, ql_env)
        assert out.returncode != 0, args
        assert "history would be lost" in out.stderr and "Restore ql.db" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    assert (data_dir / "ql.db").stat().st_size == 0  # nothing was recreated over it


def test_an_in_memory_database_is_refused(ql_env: dict[str, str]) -> None:
    out = run_ql(["run", "--", "true"], dict(ql_env, QL_DATABASE_URL="sqlite:///:memory:"))
    assert out.returncode == 2 and "in-memory" in out.stderr and "Traceback" not in out.stderr


def test_a_data_dir_deleted_under_a_waiting_host_fails_loudly(ql_env: dict[str, str], data_dir: Path,
                                                             tmp_path: Path) -> None:
    go = tmp_path / "go"
    host = subprocess.Popen(QL + ["--json", "run", "--", "sh", "-c",
                                  f'while [ ! -e "{go}" ]; do sleep 0.02; done'],
                            env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        host.stdout.readline()  # type: ignore[union-attr]
        shutil.rmtree(data_dir)
        _out, err = host.communicate(timeout=BOUND_S)
    finally:
        release_host(host, go)
    assert host.returncode == 1
    assert "was deleted or replaced" in err and "Traceback" not in err
    assert not data_dir.exists()  # never recreated


def _finished_runs(rt, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for i in range(n):
        sub = rt.submit(["sh", "-c", f"echo {i}"])
        rt.wait(sub)
        ids.append(sub.run_id)
    return ids


def test_history_is_forgotten_by_age_bounded_per_round(open_rt) -> None:
    rt = open_rt(page_size=2, pages_per_round=1, history_retention_s=60.0, terminal_journal_retention_s=0.0)
    old = _finished_runs(rt, 5)
    for run_id in old:  # created and finished two minutes ago (SQLite reads ended runs by age in creation order)
        dbview.rows(rt, "UPDATE ql_run SET created_at_ms = created_at_ms - 120000, "
                        "finished_at_ms = finished_at_ms - 120000 WHERE id = ?", (run_id,))
    fresh = _finished_runs(rt, 1)
    go = Path(rt.config.data_dir) / "go"
    live = rt.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done'])
    try:
        from ql_core.reconciler import Reconciler

        rec = Reconciler(rt.node)
        purged = []
        for _ in range(10):
            report = rec.round()
            # Bounded by the round's retention_budget_ms, in pages (tests/recovery/test_recovery_retention.py).
            purged.append(report.counts.get("history_purged", 0))
            if sum(purged) == 5:
                break
        assert sum(purged) == 5
        assert all(rt.journal.view(r) is None for r in old)
        assert dbview.count(rt, "ql_run_event", "run_id IN (%s)" % ",".join("?" * 5), old) == 0
        assert dbview.count(rt, "ql_run_attempt", "run_id IN (%s)" % ",".join("?" * 5), old) == 0
        assert rt.status(fresh[0]).status == "succeeded"
        assert rt.status(live.run_id).status == "running"  # never a live run
        logs = list((Path(rt.config.data_dir) / "logs").rglob("*.log"))
        assert len(logs) == 2  # the fresh run's and the live run's
    finally:
        go.touch()
        rt.wait(live)


def test_history_is_bounded_by_count(open_rt, ql_env: dict[str, str]) -> None:
    rt = open_rt(history_max_runs=10, terminal_journal_retention_s=0.0)
    runs = _finished_runs(rt, 14)
    rt.reconcile()
    rt.reconcile()
    kept = [r for r in runs if rt.journal.view(r) is not None]
    assert kept == runs[-10:]
    out = json_lines(run_ql(["--json", "list"], ql_env).stdout)
    assert len(out) == 10
