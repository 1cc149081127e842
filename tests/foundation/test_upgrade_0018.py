"""Migrations 0018 (SQLite: no ``ix_ql_attempt_live``) and 0019 (the create's host handle in its run's
row) upgrade a data dir at 0016 in place: every row is kept as it was, the index is gone, the
recovery page of active attempts reads the same attempts, in the same order, through the live runs'
ranges of ``ix_ql_run_order``, and host handles written before (in ``ql_attempt_host``) still read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.foundation.test_upgrade_0010 import _db_at_0009, _fill, _upgrade_keeping_every_row

_ACTIVE = "SELECT id FROM ql_run_attempt WHERE runtime_owner = 'node-x' AND status IN ('starting', 'running') ORDER BY id"


def _db_at_0016(db: Path, runs: int) -> list[str]:
    """A data dir as the release at 0016 left it (filled at 0009, migrated), with live runs of every
    kind: queued with a starting attempt, running, blocked, and another node's; the active attempts of
    ``node-x`` as the old index gave them."""
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ql_core.db.migrate import alembic_config

    _db_at_0009(db)
    _fill(db, runs)
    conn = sqlite3.connect(db)
    for run, att, run_status, att_status, owner in (("run-030", "att-030", "queued", "starting", "node-x"),
                                                    ("run-031", "att-031", "running", "blocked", "node-x"),
                                                    ("run-032", "att-032", "running", "running", "node-y"),
                                                    ("run-033", "att-033", "running", "running", "node-x")):
        conn.execute("UPDATE ql_run SET status = ?, exit_code = NULL, finished_at_ms = NULL WHERE id = ?",
                     (run_status, run))
        conn.execute("UPDATE ql_run_attempt SET status = ?, runtime_owner = ? WHERE id = ?", (att_status, owner, att))
    conn.commit()
    conn.close()
    engine = create_engine(f"sqlite:///{db}", poolclass=NullPool)  # as ql_core.db.migrate.migrate_url
    with engine.begin() as c:
        command.upgrade(alembic_config(c), "0016_sqlite_lean_writes")
        command.upgrade(alembic_config(c), "0017_cluster_spawn_complete")
    engine.dispose()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'ix_ql_attempt_live'").fetchone()[0] == 1
        # A host handle as 0014-0016 wrote it: beside its attempt.
        conn.execute("INSERT INTO ql_attempt_host (attempt_key, host_handle) SELECT attempt_key, '{\"pid\":33}' "
                     "FROM ql_run_attempt WHERE id = 'att-033'")
        conn.commit()
        return [r[0] for r in conn.execute(_ACTIVE)]
    finally:
        conn.close()


def test_a_0016_data_dir_upgrades_in_place_keeping_every_row(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = data / "ql.db"
    expected = _db_at_0016(db, 40)
    assert expected == ["att-030", "att-033", "att-039"]

    store, old_columns, before = _upgrade_keeping_every_row(db)
    try:
        assert len(before["ql_run"]) == 40 and len(before["ql_run_event"]) > 100
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'ix_ql_attempt_live'").fetchone()[0] == 0
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert [r[0] for r in conn.execute(_ACTIVE)] == expected
        finally:
            conn.close()
        # The same active attempts, in id order, page by page; blocked and other nodes' ones are not among them.
        assert [a.id for a in store.page_active_attempts("node-x", "", 100)] == expected
        first = store.page_active_attempts("node-x", "", 2)
        rest = store.page_active_attempts("node-x", first[-1].id, 2)
        assert [a.id for a in first + rest] == expected
        assert [a.id for a in store.page_active_attempts("node-y", "", 100)] == ["att-032"]
        # Host handles: the side row written before, the attempt's own column (0009's fill), none.
        assert store.attempt("att-033").host_handle == '{"pid":33}'
        assert store.attempt("att-030").host_handle is None
        # An old journal row of an ended attempt: its clock is its terminal event's time (none was written).
        entry = store.journal_entry("att-038")
        assert entry is not None and entry.attempt_status == "failed"
        at = old_columns["ql_run_event"].index("at_ms")
        ended_at = [r[at] for r in before["ql_run_event"] if "attempt.failed" in r and "att-038" in r]
        assert len(ended_at) == 1 and entry.terminal_seen_at_ms == ended_at[0]
    finally:
        store.close()
