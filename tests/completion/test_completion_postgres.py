"""The completion proofs on a real PostgreSQL run database (row locks instead of SQLite's single writer).

An edge runtime accepts a PostgreSQL URL; everything else — data dir, receipts,
tasks, the `ql` command — is as on SQLite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from completion_support import (
    assert_not_terminal,
    assert_one_terminal,
    create_with_receipts,
    detach,
    journal_row,
    plant,
    ql_crash,
    quarantine_path,
    receipt_bytes,
    receipt_path,
    reconcile,
    run_consume_workers,
    trigger_command,
    valid_receipt,
    wait_for,
    write_config,
)
from test_completion_cancel_order import race_cancel_and_completion
from test_completion_crashpoints import (
    Ctx,
    case_completion_before_commit,
    case_consumer_after_commit,
    case_consumer_after_delete,
    case_consumer_quarantine_after_journal,
)

pytestmark = pytest.mark.postgres


def _open(data_dir: Path, url: str) -> Any:
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    return Runtime.open(load_config(data_dir=data_dir, environ={"QL_DATABASE_URL": url}, cwd=data_dir))


@pytest.fixture
def pg_runtime(data_dir: Path, pg_url: str) -> Iterator[Any]:
    rt = _open(data_dir, pg_url)
    assert rt.engine.dialect.name == "postgresql"
    yield rt
    rt.close()


@pytest.fixture
def pg_env(ql_env: dict[str, str], pg_url: str) -> dict[str, str]:
    return dict(ql_env, QL_DATABASE_URL=pg_url)


@pytest.fixture
def pg_submit(pg_runtime: Any, tasks: list[Any]) -> Any:
    def do(command: list[str], **kwargs: Any) -> Any:
        sub = pg_runtime.submit(command, **kwargs)
        tasks.append(sub)
        return sub

    return do


PG_CASES = {
    "completion.before_commit[reconcile]": lambda c: case_completion_before_commit(c, "reconcile"),
    "completion.before_commit[run]": lambda c: case_completion_before_commit(c, "run"),
    "consumer.after_commit[reconcile]": lambda c: case_consumer_after_commit(c, "reconcile"),
    "consumer.after_delete[run]": lambda c: case_consumer_after_delete(c, "run"),
    "consumer.quarantine.after_journal": case_consumer_quarantine_after_journal,
}


@pytest.mark.parametrize("case", list(PG_CASES))
def test_crash_point_on_postgres(case: str, pg_env: dict[str, str], data_dir: Path, pg_runtime: Any,
                                 triggers: Any, pg_submit: Any, tmp_path: Path) -> None:
    c = Ctx(env=pg_env, data_dir=data_dir, rt=pg_runtime, trigger=triggers, submit=pg_submit, tmp_path=tmp_path)
    PG_CASES[case](c)
    assert not (data_dir / "ql.db").exists()  # really PostgreSQL, not a stray SQLite file


def test_parallel_consumers_on_postgres(pg_runtime: Any, data_dir: Path, tmp_path: Path,
                                        pg_env: dict[str, str]) -> None:
    subs = create_with_receipts(pg_runtime, 50)
    results = run_consume_workers(data_dir, [s.attempt_id for s in subs], 5, tmp=tmp_path, env=pg_env)
    assert sum(r.get("applied", 0) for r in results) == 50, results
    assert all(set(r) <= {"applied", "already_terminal", "missing"} for r in results), results
    for i, sub in enumerate(subs):
        assert_one_terminal(pg_runtime, sub.run_id, "succeeded" if i % 7 == 0 else "failed", i % 7)
        assert not receipt_path(data_dir, sub.attempt_id).exists()


def test_cancel_and_completion_raced_on_postgres(pg_runtime: Any) -> None:
    assert sum(race_cancel_and_completion(pg_runtime, 20).values()) == 20


def test_wrong_token_fails_closed_on_postgres(pg_runtime: Any, pg_submit: Any, triggers: Any,
                                              pg_env: dict[str, str], data_dir: Path) -> None:
    sub = pg_submit(trigger_command(triggers(), 7))
    plant(data_dir, sub.attempt_id, receipt_bytes(sub, exit_code=0, token="C" * 43))
    before = pg_runtime.events(sub.run_id)
    counts = reconcile(pg_env)
    assert (counts["quarantined"], counts["applied"]) == (1, 0)
    assert pg_runtime.events(sub.run_id) == before
    assert_not_terminal(pg_runtime, sub.run_id)
    assert journal_row(pg_runtime, sub.attempt_id)["quarantine_reason"] == "wrong_token"
    assert quarantine_path(data_dir, sub.attempt_id).exists()
    pg_runtime.receipts.publish(valid_receipt(sub, exit_code=7))
    assert reconcile(pg_env)["applied"] == 1
    assert_one_terminal(pg_runtime, sub.run_id, "failed", 7)


def test_another_node_never_purges_our_journal_rows(pg_url: str, tmp_path: Path,
                                                    ql_env: dict[str, str]) -> None:
    """Two edge nodes share one PostgreSQL database; each has its own data dir (receipts, node id)."""
    dir_a, dir_b = tmp_path / "node-a", tmp_path / "node-b"
    dir_a.mkdir(mode=0o700)
    dir_b.mkdir(mode=0o700)
    env_a = dict(ql_env, QL_DATA_DIR=str(dir_a), QL_DATABASE_URL=pg_url)
    env_b = dict(ql_env, QL_DATA_DIR=str(dir_b), QL_DATABASE_URL=pg_url)
    rt_b = _open(dir_b, pg_url)
    try:
        # Node B completes a task but dies before deleting its receipt.
        rec = detach(env_b, "sh", "-c", "exit 7")
        wait_for(lambda: receipt_path(dir_b, rec["attempt_id"]).exists(), what="B's receipt")
        ql_crash(env_b, "consumer.after_commit", "reconcile")
        assert journal_row(rt_b, rec["attempt_id"]) is not None
        # Node A's recovery must not touch B's row: A cannot see B's receipt directory.
        reconcile(env_a, config=write_config(tmp_path / "a.toml", terminal_journal_retention_s=0.0))
        assert journal_row(rt_b, rec["attempt_id"]) is not None
        # ... so B's own next pass still replays and cleans its receipt.
        assert reconcile(env_b)["already_terminal"] == 1
        assert not receipt_path(dir_b, rec["attempt_id"]).exists()
        assert_one_terminal(rt_b, rec["run_id"], "failed", 7)
    finally:
        rt_b.close()
