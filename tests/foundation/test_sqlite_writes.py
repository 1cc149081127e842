"""The edge-sqlite store's write settings (issue 25 item 1): small pages for a new database, and a
WAL that outlives each process instead of a checkpoint of every page at every close."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from ql_plugins.edge_sqlite.connection import PAGE_SIZE
from ql_core.db.keep_wal import keep_wal_on_close

WRITER = ("import sys\nfrom ql_core.config import load_config\nfrom ql_core.runtime import Runtime\n"
          "rt = Runtime.open(load_config(data_dir=sys.argv[1], environ={}, cwd=sys.argv[1]))\n"
          "print(rt.run(['true']).run_id); rt.close()\n")


def _page_size(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def _write(data: Path) -> str:
    done = subprocess.run([sys.executable, "-c", WRITER, str(data)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_new_database_gets_small_pages_an_existing_one_keeps_its_own(tmp_path: Path) -> None:
    _write(tmp_path / "new")
    assert _page_size(tmp_path / "new" / "ql.db") == PAGE_SIZE < 4096

    old = tmp_path / "old"
    old.mkdir(mode=0o700)
    from ql_core.db.migrate import migrate_url

    migrate_url(f"sqlite:///{old / 'ql.db'}")  # as an earlier release created it: SQLite's default pages
    os.chmod(old / "ql.db", 0o600)
    _write(old)
    assert _page_size(old / "ql.db") == 4096


def test_the_wal_outlives_each_writer_and_loses_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    runs = [_write(data) for _ in range(3)]
    wal = data / "ql.db-wal"
    # No checkpoint at close: the WAL (with the commits of the runs) is still there.
    assert wal.exists() and wal.stat().st_size > 0
    conn = sqlite3.connect(f"file:{data / 'ql.db'}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        found = {r[0]: r[1] for r in conn.execute("SELECT id, status FROM ql_run")}
    finally:
        conn.close()
    assert found == {run_id: "succeeded" for run_id in runs}


def test_keep_wal_is_set_on_this_interpreter_and_checks_its_handle(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        assert keep_wal_on_close(conn, str(db))  # CPython 3.11+: set (else the default would be kept)
        assert not keep_wal_on_close(conn, str(tmp_path / "other.db")) or hasattr(conn, "setconfig")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()
    finally:
        conn.close()
    assert (tmp_path / "x.db-wal").stat().st_size > 0  # closed without a checkpoint
    assert sqlite3.connect(db).execute("SELECT x FROM t").fetchall() == [(1,)]


def test_the_wal_is_checkpointed_by_bytes_not_pages(tmp_path: Path) -> None:
    from ql_plugins.edge_sqlite.connection import WAL_CHECKPOINT_BYTES
    from ql_plugins.edge_sqlite.store import SqliteJournal

    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        conn = store.connections.connection()
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_CHECKPOINT_BYTES // PAGE_SIZE
    finally:
        store.close()


def test_events_are_filed_under_their_runs_key_and_a_wrong_key_is_refused(tmp_path: Path) -> None:
    """Revision 0011: an event's key is its run's ``run_key << 20 | seq`` (one rowid range per run,
    no index on run ids). The store's INSERT takes the key from the run (an event of no run fails the
    transaction), a CHECK keeps seq in the key, and a key never changes."""
    import pytest

    from ql_core.db.sqlite_events import EVENT_KEY_BITS, INSERT_EVENT, SELECT_EVENTS
    from ql_core.ports.journal import StoreError
    from ql_plugins.edge_sqlite.store import SqliteJournal

    data = tmp_path / "data"
    runs = [_write(data) for _ in range(3)]
    store = SqliteJournal(f"sqlite:///{data / 'ql.db'}")
    try:
        conn = store.connections.connection()
        keys = dict(conn.execute("SELECT id, run_key FROM ql_run"))
        assert [keys[r] for r in runs] == sorted(keys.values())  # numbered in creation order
        for run_id in runs:
            events = store.events(run_id)
            assert events and [e.seq for e in events] == list(range(1, len(events) + 1))
            assert {e.run_id for e in events} == {run_id}
            stored = [k for (k,) in conn.execute("SELECT event_key FROM ql_run_event WHERE run_id = ? ORDER BY seq",
                                                 (run_id,))]
            assert stored == [(keys[run_id] << EVENT_KEY_BITS) + e.seq for e in events]
        plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + SELECT_EVENTS, (runs[0],)))
        assert "SCAN" not in plan and "INTEGER PRIMARY KEY" in plan, plan

        first = store.events(runs[0])
        # An event of a run that is not there: nothing inserted, and the store fails the transaction.
        with pytest.raises(StoreError, match="missing"):
            with store.connections.write() as c:
                store._execute(c, INSERT_EVENT, ("no-such-run", 1, "x", None, None, None, None, 1))
        with pytest.raises(StoreError, match="missing"):
            with store.connections.write() as c:
                store._execute_many(c, INSERT_EVENT, [(runs[0], 90, "x", None, None, None, None, 1),
                                                      ("no-such-run", 1, "x", None, None, None, None, 1)])
        # A key whose low bits are not its seq, a seq past the key's bits: refused by the CHECK.
        insert = "INSERT INTO ql_run_event (event_key, run_id, seq, type, at_ms) VALUES (?, ?, ?, 'x', 1)"
        base = keys[runs[0]] << EVENT_KEY_BITS
        for key, seq in ((base + 51, 50), (base, 1 << EVENT_KEY_BITS), (base, 0)):
            with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
                conn.execute(insert, (key, runs[0], seq))
        with pytest.raises(sqlite3.IntegrityError, match="does not change"):
            conn.execute("UPDATE ql_run_event SET seq = seq + 100 WHERE run_id = ?", (runs[0],))
        assert store.events(runs[0]) == first  # nothing refused was written
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()
