"""Migration 0020 (SQLite: ``ix_ql_log_order`` lists a log once its attempt ended, never an empty one;
an empty end is recorded on the attempt's row) upgrades a data dir at 0019 in place: every row is
kept as it was, the ended logs a crash left unsized are still the sizing queue, the running ones
are still found by the quota pass (through the live runs now), sized ones are still retention's in
age order, and a log sized 0 leaves the index."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.foundation.test_upgrade_0010 import _upgrade_keeping_every_row
from tests.foundation.test_upgrade_0018 import _db_at_0016


def _db_at_0019(db: Path) -> None:
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ql_core.db.migrate import alembic_config

    _db_at_0016(db, 40)
    engine = create_engine(f"sqlite:///{db}", poolclass=NullPool)  # as ql_core.db.migrate.migrate_url
    with engine.begin() as c:
        command.upgrade(alembic_config(c), "0019_sqlite_run_host")
    engine.dispose()
    conn = sqlite3.connect(db)
    try:
        # Ended and left unsized by a crash: log-005, log-006; ended and sized 0 (empty): log-007.
        conn.execute("UPDATE ql_log_artifact SET size_bytes = NULL WHERE id IN ('log-005', 'log-006')")
        conn.execute("UPDATE ql_log_artifact SET size_bytes = 0 WHERE id = 'log-007'")
        # The live ones (0018's fill: queued, running, blocked, another node's) have no size.
        conn.execute("UPDATE ql_log_artifact SET size_bytes = NULL WHERE id IN ('log-030', 'log-031', 'log-032', "
                     "'log-033')")
        conn.commit()
    finally:
        conn.close()


def test_a_0019_data_dir_upgrades_in_place_keeping_every_row(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = data / "ql.db"
    _db_at_0019(db)
    store, _old_columns, before = _upgrade_keeping_every_row(db)
    try:
        assert len(before["ql_log_artifact"]) == 40
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            listed = {r[0] for r in conn.execute("SELECT id FROM ql_log_artifact INDEXED BY ix_ql_log_order "
                                                 "WHERE deleted_at_ms IS NULL AND (size_bytes > 0 OR (size_bytes IS NULL AND size_due = 1)) "
                                                 "AND log_order >= 0")}
        finally:
            conn.close()
        assert "log-007" not in listed and {"log-005", "log-006", "log-008"} <= listed
        # The sizing queue: the ended unsized ones (the live ones joined it too, and are skipped).
        assert [f.id for f in store.ended_logs("node-x", unsized=True, limit=10)] == ["log-005", "log-006"]
        # The quota pass: node-x's live unsized logs, through the live runs, by id, page by page.
        assert [f.id for f in store.page_live_logs("node-x", "", 10)] == ["log-030", "log-031", "log-033", "log-039"]
        first = store.page_live_logs("node-x", "", 2)
        assert [f.id for f in first + store.page_live_logs("node-x", first[-1].id, 2)] == \
            ["log-030", "log-031", "log-033", "log-039"]
        assert [f.id for f in store.page_live_logs("node-y", "", 10)] == ["log-032"]
        # Retention by size: the sized ones that are not empty, oldest first.
        sized = [f.id for f in store.ended_logs("node-x", sized=True, limit=100)]
        assert sized[:3] == ["log-000", "log-001", "log-002"] and "log-007" not in sized
        assert "log-005" not in sized and "log-030" not in sized
        # The empty one reads as it did.
        assert store.log_facts("log-007").size_bytes == 0  # type: ignore[union-attr]
    finally:
        store.close()
