"""Migrations 0010 (SQLite: fewer B-trees per task) and 0011 (events under their run's integer key)
upgrade a data dir of the release before them in place: every run, attempt, event, log row and
journal row is kept as it was (0011 adds a key column to runs and events), the tallies stay exact
and keep being kept, and the store goes on working on it."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

TABLES = ("ql_run", "ql_run_attempt", "ql_run_event", "ql_log_artifact", "ql_receipt_journal", "ql_tally")


def _rows(db: Path, columns: dict[str, list[str]] | None = None) -> dict[str, list[tuple[object, ...]]]:
    """Every row of TABLES, in ``columns`` (by table; default: all of each table's columns)."""
    conn = sqlite3.connect(db)
    try:
        columns = columns or _columns(conn)
        return {t: sorted(conn.execute(f"SELECT {', '.join(columns[t])} FROM {t}").fetchall(), key=repr)
                for t in TABLES}
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in TABLES}


def _db_at_0009(db: Path) -> None:
    from alembic import command

    from ql_core.db.engine import create_db_engine
    from ql_core.db.migrate import alembic_config, current_revision

    engine = create_db_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0009_sqlite_indexes")
        command.upgrade(alembic_config(conn), "0008_worker_draining")
    assert current_revision(engine) == "0008_worker_draining,0009_sqlite_indexes"
    engine.dispose()


def _fill(db: Path, n: int) -> None:
    """``n`` runs as the release before 0010 wrote them: n-1 ended (sized logs, four events, a
    journal row of the last few), one running (unsized log, a pending journal row)."""
    conn = sqlite3.connect(db)
    now = int(time.time() * 1000)
    for i in range(n):
        running = i == n - 1
        status = "running" if running else ("failed" if i % 3 else "succeeded")
        run, att, log = f"run-{i:03d}", f"att-{i:03d}", f"log-{i:03d}"
        conn.execute("INSERT INTO ql_run (id, status, exit_code, version, event_seq, current_attempt_id, "
                     "created_at_ms, updated_at_ms, finished_at_ms, max_attempts) VALUES (?, ?, ?, 3, ?, ?, ?, ?, ?, 1)",
                     (run, status, None if running else i % 3, 2 if running else 4, att, now + i, now + i,
                      None if running else now + i + 1))
        conn.execute("INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, "
                     "log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, created_at_ms, "
                     "version) VALUES (?, ?, 1, 'local', 'node-x', ?, ?, 'h', 0, ?, ?, 2)",
                     (att, run, status, log, now + 10_000 if i % 2 else None, now + i))
        conn.execute("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, "
                     "truncated, created_at_ms) VALUES (?, ?, ?, ?, 1000, 0, ?)", (log, run, att, f"xx/{log}.log", now + i))
        if not running:  # sized after the end, as the store does (the tally triggers count it)
            conn.execute("UPDATE ql_log_artifact SET size_bytes = ? WHERE id = ?", (100 + i, log))
        events = [("run.created", None), ("attempt.spawned", "running")]
        if not running:
            events += [(f"attempt.{status}", status), (f"run.{status}", status)]
        for seq, (kind, st) in enumerate(events, start=1):
            conn.execute("INSERT INTO ql_run_event (run_id, seq, type, attempt_id, status, at_ms) "
                         "VALUES (?, ?, ?, ?, ?, ?)", (run, seq, kind, att, st, now + i))
        if i >= n - 4:
            conn.execute("INSERT INTO ql_receipt_journal (attempt_id, run_id, state, receipt_ref, registered_at_ms, "
                         "updated_at_ms) VALUES (?, ?, 'pending', ?, ?, ?)", (att, run, f"xx/{att}.json", now, now))
    conn.commit()
    conn.close()


def _upgrade_keeping_every_row(db: Path) -> tuple[Any, dict[str, list[str]], dict[str, list[tuple[object, ...]]]]:
    """Open the store on the old ``db`` (its first use migrates it to head in a child process) and check
    that every row of the old schema was kept, byte for byte: the open store, the old columns and the
    rows as they were before the upgrade."""
    from ql_core.db.migrate import SCHEMA_HEAD
    from ql_plugins.edge_sqlite.store import SqliteJournal

    conn = sqlite3.connect(db)
    old_columns = _columns(conn)
    conn.close()
    before = _rows(db)
    store = SqliteJournal(f"sqlite:///{db}")
    try:
        assert store.connections.schema_revision() == SCHEMA_HEAD
        assert _rows(db, old_columns) == before  # every row kept, byte for byte
    except BaseException:
        store.close()
        raise
    return store, old_columns, before


def test_a_0009_data_dir_upgrades_in_place_keeping_every_row(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = data / "ql.db"
    _db_at_0009(db)
    _fill(db, 60)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE ql_run_attempt SET host_handle = '{\"pid\":1}' WHERE id = 'att-059'")  # kept in its row (0014)
    conn.commit()
    conn.close()

    store, old_columns, before = _upgrade_keeping_every_row(db)
    try:
        assert dict(before["ql_tally"]) == {"runs": 60, "log_bytes:node-x": sum(100 + i for i in range(59))}
        conn = sqlite3.connect(db)
        try:
            # The rebuilt tables are clustered on their keys (the journal a rowid table in 0012-0015:
            # its rows overflowed an index B-tree's cell; WITHOUT ROWID again since 0016, its rows
            # slimmer); their indexes and triggers are back.
            for table, without_rowid in (("ql_log_artifact", True), ("ql_receipt_journal", True)):
                sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
                assert sql.rstrip().endswith("WITHOUT ROWID") == without_rowid, table
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('index', 'trigger')")}
            assert {"ix_ql_log_order", "ux_ql_event_dedupe", "ql_tally_log_update",
                    "ql_tally_log_delete", "ix_ql_attempt_deadline", "ix_ql_run_order",
                    "ql_tally_run_delete", "ql_event_fixed"} <= names
            # 0012: runs in order come from one index's ranges alone; 0013: numbered, live ones last;
            # 0018: live attempts through the live runs' ranges.
            assert not {"ix_ql_log_run", "ix_ql_journal_state", "ix_ql_run_created", "ix_ql_run_ended",
                        "ix_ql_attempt_run", "ix_ql_run_status", "ix_ql_log_unsized", "ix_ql_log_kept",
                        "ix_ql_attempt_live"} & names
            assert conn.execute("SELECT count(*) FROM ql_run INDEXED BY ix_ql_run_order WHERE status_order = 5"
                                ).fetchone()[0] == conn.execute("SELECT count(*) FROM ql_run WHERE status = 'succeeded'"
                                                                ).fetchone()[0]
            # 0012: each attempt under its run's key and its number.
            assert conn.execute("SELECT count(*) FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id "
                                "WHERE a.attempt_key = (r.run_key << 8) + a.attempt_no").fetchone()[0] == 60
            # 0011: runs numbered in creation order; each event under its run's key and seq.
            keys = [r[0] for r in conn.execute("SELECT id FROM ql_run ORDER BY run_key")]
            assert keys == sorted(keys, key=lambda k: int(k.split("-")[1]))
            assert conn.execute("SELECT count(*) FROM ql_run_event e JOIN ql_run r ON r.id = e.run_id "
                                "WHERE e.event_key = (r.run_key << 20) + e.seq").fetchone()[0] == 4 * 59 + 2
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
        # The store reads and writes the upgraded rows as before; the triggers keep the tallies exact.
        assert len(store.list_views(status=None, limit=100)) == 60
        assert [e.type for e in store.events("run-005")] == ["run.created", "attempt.spawned", "attempt.failed",
                                                             "run.failed"]
        assert [f.id for f in store.page_live_logs("node-x", "", 10)] == ["log-059"]
        assert store.attempt("att-059").host_handle == '{"pid":1}'  # an older row keeps its own (0014)
        # 0015: the sized logs by age from ix_ql_log_order, as ix_ql_log_kept gave them.
        assert [f.id for f in store.ended_logs("node-x", created_before_ms=int(time.time() * 1000) + 60_000,
                                               limit=3)] == ["log-000", "log-001", "log-002"]
        assert [f.id for f in store.ended_logs("node-x", sized=True, limit=2)] == ["log-000", "log-001"]
        assert store.ended_logs("node-x", unsized=True, limit=10) == []
        assert store.ended_log_bytes("node-x") == sum(100 + i for i in range(59))
        store.record_log_sizes({"log-059": 7})
        assert store.ended_log_bytes("node-x") == sum(100 + i for i in range(59)) + 7
        assert store.history_candidates("node-x", finished_before_ms=int(time.time() * 1000) + 60_000,
                                        keep_newest=0, limit=5) == {f"run-{i:03d}": [f"log-{i:03d}"] for i in range(5)}
        assert store.purge_runs([f"run-{i:03d}" for i in range(5)]) == 5
        after = _rows(db, old_columns)
        assert len(after["ql_run"]) == len(after["ql_log_artifact"]) == 55
        assert len(after["ql_run_event"]) == 4 * 54 + 2
        assert dict(after["ql_tally"]) == {"runs": 55, "log_bytes:node-x": sum(100 + i for i in range(5, 59)) + 7}
    finally:
        store.close()
