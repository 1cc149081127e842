"""Migration 0016 (SQLite: ``ix_ql_run_order`` without the run id; the run count up to a key) upgrades
a data dir at 0015 in place: every run, attempt, event, log, journal and tally row is kept as it was,
the index holds (status_order, created_at_ms) and the rowid, runs created in the same millisecond are
read in creation order (``run_key``) by every ordered read, and the run count stays exact."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from tests.foundation.test_upgrade_0010 import _db_at_0009, _fill, _upgrade_keeping_every_row


def _db_at_0015(db: Path, runs: int) -> None:
    """A data dir as the release at 0015 left it: filled at 0009, migrated to 0015 (every table's
    rows through the rebuilds of 0010-0012), then three runs given one creation time."""
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ql_core.db.migrate import alembic_config, current_revision

    _db_at_0009(db)
    _fill(db, runs)
    engine = create_engine(f"sqlite:///{db}", poolclass=NullPool)  # as ql_core.db.migrate.migrate_url
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0015_sqlite_log_order")
        command.upgrade(alembic_config(conn), "0015_cluster_wide_claims")
    assert current_revision(engine) == "0015_cluster_wide_claims,0015_sqlite_log_order"
    engine.dispose()
    conn = sqlite3.connect(db)
    # Created in one millisecond, in key order run-010 < run-011 < run-012.
    for run in ("run-011", "run-012"):
        conn.execute("UPDATE ql_run SET created_at_ms = (SELECT created_at_ms FROM ql_run WHERE id = 'run-010') "
                     "WHERE id = ?", (run,))
    conn.commit()
    conn.close()


def test_a_0015_data_dir_upgrades_in_place_keeping_every_row(tmp_path: Path) -> None:
    from ql_plugins.edge_sqlite import statements

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = data / "ql.db"
    _db_at_0015(db, 40)

    store, _old_columns, before = _upgrade_keeping_every_row(db)
    try:
        assert len(before["ql_run"]) == 40 and before["ql_receipt_journal"]
        conn = sqlite3.connect(db)
        try:
            assert [r[2] for r in conn.execute("PRAGMA index_info(ix_ql_run_order)")] == ["status_order",
                                                                                          "created_at_ms"]
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            # The run count: exact, up to the newest key; no trigger on a run's insert any more.
            assert conn.execute("SELECT value, counted_to FROM ql_tally WHERE name = 'runs'").fetchone() == (
                40, conn.execute("SELECT max(run_key) FROM ql_run").fetchone()[0])
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'ql_tally_run_insert'"
                                ).fetchone()[0] == 0
            # The journal: one B-tree clustered on its key, its rows copied as they were.
            assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'ql_receipt_journal'"
                                ).fetchone()[0].rstrip().endswith("WITHOUT ROWID")
            by_key = [r[0] for r in conn.execute("SELECT id FROM ql_run ORDER BY created_at_ms, run_key")]
        finally:
            conn.close()
        assert by_key.index("run-010") < by_key.index("run-011") < by_key.index("run-012")
        # Every ordered read gives (created_at_ms, run_key) order, from the index alone.
        assert [v.run_id for v in store.list_views(status=None, limit=100)] == by_key[::-1]
        ended = [r for r in by_key if r != "run-039"]
        failed = [r for r in by_key if int(r.split("-")[1]) % 3 and r != "run-039"]
        assert [v.run_id for v in store.list_views(status="failed", limit=100)] == failed[::-1]
        with store.connections.read() as c:
            assert [r[0] for r in c.execute(statements.OLDEST_RUNS, (5,))] == by_key[:5]
            assert store._ended_before(c, int(time.time() * 1000) + 60_000, 100) == ended
        # The store goes on writing on it: a new run is the newest.
        from ql_core.testing.journal_support import new_run

        made = new_run(created_at_ms=int(time.time() * 1000) + 120_000)
        store.create(made)
        assert store.list_views(status=None, limit=1)[0].run_id == made.run_id
        # An old journal row reads as it was written (its run id and reference stored).
        entry = store.journal_entry("att-039")
        assert (entry.run_id, entry.receipt_ref, entry.state) == ("run-039", "xx/att-039.json", "pending")
        # By count: 41 runs, the newest 38 kept: the three oldest ended ones are candidates.
        found = store.history_candidates("node-x", finished_before_ms=0, keep_newest=38, limit=10)
        assert list(found) == by_key[:3]
    finally:
        store.close()
