"""The completion proofs on a real PostgreSQL run store (row locks instead of SQLite's single writer).

A standalone node with ``journal = "cluster-fenced"`` and a PostgreSQL ``database_url`` keeps its
whole run store in PostgreSQL (the cluster-fenced plugin's ``PostgresJournal``); everything else —
data dir, receipts, tasks, the `ql` command — is as on SQLite. The cases are the SQLite ones
(tests/completion/test_completion_crashpoints.py and friends), run against that node: crash points,
parallel consumers, the cancel-vs-completion race, a wrong token, two nodes sharing one database.

The shared helpers read rows with ``tests.dbview`` (stdlib sqlite3); here they read the same rows
from PostgreSQL instead (psycopg, a separate connection) — the thing under test is untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from tests.completion.completion_support import (
    assert_not_terminal,
    assert_one_terminal,
    create_with_receipts,
    detach,
    host_gone,
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
)
from tests.completion.test_completion_cancel_order import race_cancel_and_completion
from tests.completion.test_completion_crashpoints import (
    Ctx,
    case_completion_before_commit,
    case_completion_before_commit_lost,
    case_consumer_after_commit,
    case_consumer_after_delete,
    case_consumer_quarantine_after_journal,
    case_create_before_commit,
    case_spawn_after_log_created_standby,
    case_spawn_before_handle_commit,
    case_start_after_hand_over,
    case_wait_after_ack,
    case_wait_after_exit,
    case_wait_before_ack,
)

from ql_core.submit import create
from tests import dbview

# A PostgreSQL node: its data dir holds no run database (the tests check none appears).
pytestmark = [pytest.mark.postgres, pytest.mark.fresh_data_dir]

BASE = 'profile = "standalone"\njournal = "cluster-fenced"\n'
_KEYS = {"ql_run": "id", "ql_run_attempt": "id", "ql_log_artifact": "id", "ql_receipt_journal": "attempt_id",
         "ql_cancel_dispatch": "run_id"}


def _node_config(path: Path, url: str, **limits: Any) -> Path:
    body = BASE + f'database_url = "{url}"\n'
    if limits:
        body += "[limits]\n" + "".join(f"{k} = {v!r}\n" for k, v in limits.items())
    path.write_text(body)
    return path


@pytest.fixture(autouse=True)
def _rows_from_postgres(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> None:
    """Make the shared row helpers read PostgreSQL, and their config files name this node's store."""
    import psycopg
    from psycopg.rows import dict_row

    from tests.completion import test_completion_crashpoints

    original = dbview.row

    def row(rt: Any, table: str, key: str) -> dict[str, Any] | None:
        url = rt if isinstance(rt, str) else rt.config.database_url
        if not url.startswith("postgresql"):
            return original(rt, table, key)
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), row_factory=dict_row) as conn:
            found = conn.execute(f"SELECT * FROM {table} WHERE {_KEYS[table]} = %s", (key,)).fetchone()
        return None if found is None else dbview.Row(found)

    original_update = dbview.update

    def update(rt: Any, table: str, key: str, **values: Any) -> int:
        url = rt if isinstance(rt, str) else rt.config.database_url
        if not url.startswith("postgresql"):
            return original_update(rt, table, key, **values)
        sets = ", ".join(f"{column} = %s" for column in values)
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            return conn.execute(f"UPDATE {table} SET {sets} WHERE {_KEYS[table]} = %s",
                                (*values.values(), key)).rowcount

    def write_config(path: Path, **limits: Any) -> Path:
        return _node_config(path, pg_url, **limits)

    monkeypatch.setattr(dbview, "row", row)
    monkeypatch.setattr(dbview, "update", update)
    monkeypatch.setattr(test_completion_crashpoints, "write_config", write_config)


def _open(data_dir: Path, config: Path) -> Any:
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    return Runtime.open(load_config(config_path=config, data_dir=data_dir, environ={}, cwd=data_dir))


@pytest.fixture
def node_config(data_dir: Path, pg_url: str) -> Path:
    # In the data dir too: helper processes that open a Runtime with cwd = data dir pick it up.
    return _node_config(data_dir / "ql.toml", pg_url)


@pytest.fixture
def pg_runtime(data_dir: Path, node_config: Path) -> Iterator[Any]:
    from ql_plugins.cluster_fenced.pg_store import PostgresJournal

    rt = _open(data_dir, node_config)
    assert isinstance(rt.journal, PostgresJournal)
    yield rt
    rt.close()


@pytest.fixture
def pg_env(ql_env: dict[str, str], node_config: Path) -> dict[str, str]:
    return dict(ql_env, QL_CONFIG=str(node_config))


@pytest.fixture
def pg_submit(pg_runtime: Any, tasks: list[Any]) -> Any:
    def do(command: list[str], **kwargs: Any) -> Any:
        sub = pg_runtime.submit(command, **kwargs)
        tasks.append(sub)
        return sub

    return do


PG_CASES = {
    "create.before_commit": case_create_before_commit,
    "spawn.after_log_created[standby]": case_spawn_after_log_created_standby,
    "spawn.before_handle_commit": case_spawn_before_handle_commit,
    "start.after_hand_over": case_start_after_hand_over,
    "completion.before_commit[reconcile]": lambda c: case_completion_before_commit(c, "reconcile"),
    "completion.before_commit[run]": lambda c: case_completion_before_commit(c, "run"),
    "completion.before_commit[lost]": case_completion_before_commit_lost,
    "consumer.after_commit[reconcile]": lambda c: case_consumer_after_commit(c, "reconcile"),
    "consumer.after_delete[reconcile]": lambda c: case_consumer_after_delete(c, "reconcile"),
    "wait.after_exit": case_wait_after_exit,
    "wait.before_ack": case_wait_before_ack,
    "wait.after_ack": case_wait_after_ack,
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
    host_gone(pg_runtime, sub.attempt_id)  # nobody waits: the live launcher's receipt is not deferred
    pg_runtime.receipts.publish(valid_receipt(sub, exit_code=7))
    assert reconcile(pg_env)["applied"] == 1
    assert_one_terminal(pg_runtime, sub.run_id, "failed", 7)


def test_another_node_never_purges_our_journal_rows(pg_url: str, tmp_path: Path,
                                                    ql_env: dict[str, str]) -> None:
    """Two standalone nodes share one PostgreSQL database; each has its own data dir (receipts, node id)."""
    dir_a, dir_b = tmp_path / "node-a", tmp_path / "node-b"
    dir_a.mkdir(mode=0o700)
    dir_b.mkdir(mode=0o700)
    config = _node_config(tmp_path / "node.toml", pg_url)
    env_a = dict(ql_env, QL_DATA_DIR=str(dir_a), QL_CONFIG=str(config))
    env_b = dict(ql_env, QL_DATA_DIR=str(dir_b), QL_CONFIG=str(config))
    rt_b = _open(dir_b, config)
    try:
        # Node B completes a task but dies before deleting its receipt.
        rec = detach(env_b, "sh", "-c", "exit 7")
        wait_for(lambda: receipt_path(dir_b, rec["attempt_id"]).exists(), what="B's receipt")
        ql_crash(env_b, "consumer.after_commit", "reconcile")
        assert journal_row(rt_b, rec["attempt_id"]) is not None
        # Node A's recovery must not touch B's row: A cannot see B's receipt directory.
        reconcile(env_a, config=_node_config(tmp_path / "a.toml", pg_url, terminal_journal_retention_s=0.0))
        assert journal_row(rt_b, rec["attempt_id"]) is not None
        # ... so B's own next pass still replays and cleans its receipt.
        assert reconcile(env_b)["already_terminal"] == 1
        assert not receipt_path(dir_b, rec["attempt_id"]).exists()
        assert_one_terminal(rt_b, rec["run_id"], "failed", 7)
    finally:
        rt_b.close()


def test_runs_of_a_standalone_node_are_never_claimed_by_cluster_workers(pg_runtime: Any, pg_submit: Any,
                                                                         triggers: Any, pg_url: str) -> None:
    """A standalone run is 'queued' between its create and spawned commits: no worker may take it."""
    import uuid

    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB

    sub = create(pg_runtime.node)  # create commit only: run 'queued', attempt 'starting'
    assert pg_runtime.status(sub.run_id).status == "queued"
    with ControlDB.connect(pg_url) as db:
        worker = db.register("w-standalone", str(uuid.uuid4()), slots=4, ql_version="test").worker
        claimed = db.claim(worker, max_n=4, free_slots=4, executor="local", attempt_ids=[new_id() for _ in range(4)],
                           log_ids=[new_id() for _ in range(4)])
    assert claimed.attempts == ()
    assert [a.attempt_id for a in pg_runtime.status(sub.run_id).attempts] == [sub.attempt_id]
