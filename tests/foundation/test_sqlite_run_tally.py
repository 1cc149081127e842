"""ql_tally's ``runs`` row (revision 0016): no write per created run, an exact count all the same.

The row counts the runs up to its ``counted_to`` key; newer ones are one key range counted when read
and folded in by history retention; a delete at or below the key takes the run off (and lowers the
key below a key that may be given again). Real SQLite files and the real store."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from ql_core.testing.journal_support import OWNER, new_run
from ql_plugins.edge_sqlite import statements
from ql_plugins.edge_sqlite.store import SqliteJournal


def _count(store: SqliteJournal) -> int:
    with store.connections.read() as c:
        counted, newer = c.execute(statements.RUN_COUNT).fetchone()
    return counted + newer


def _row(db: Path) -> tuple[int, int]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT value, counted_to FROM ql_tally WHERE name = 'runs'").fetchone()
    finally:
        conn.close()


def _delete_runs(db: Path, keys: list[int]) -> None:
    """Delete runs with their attempts and events, as the history purge does (by key, raw SQL)."""
    conn = sqlite3.connect(db)
    for key in keys:
        conn.execute("DELETE FROM ql_run_attempt WHERE attempt_key BETWEEN ? AND ?", (key << 8, (key << 8) + 255))
        conn.execute("DELETE FROM ql_run_event WHERE event_key BETWEEN ? AND ?", (key << 20, (key << 20) + (1 << 20) - 1))
        conn.execute("DELETE FROM ql_run WHERE run_key = ?", (key,))
    conn.commit()
    conn.close()


def _retention_round(store: SqliteJournal) -> None:
    # Nothing is old enough or in excess: only the count is read (and folded).
    assert store.history_candidates(OWNER, finished_before_ms=0, keep_newest=10**6, limit=10) == {}


def test_a_create_writes_no_page_of_the_tally(tmp_path: Path) -> None:
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    try:
        store.create(new_run())
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        tally_pages = {p for (p,) in conn.execute("SELECT pageno FROM dbstat WHERE name IN ('ql_tally', "
                                                  "'sqlite_autoindex_ql_tally_1')")}
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.close()
        store.create(new_run())
        wal = (tmp_path / "ql.db-wal").read_bytes()
        written = {struct.unpack(">I", wal[pos:pos + 4])[0] for pos in range(32, len(wal) - 24, 24 + page_size)}
        assert written and not written & tally_pages
    finally:
        store.close()


def test_the_count_is_exact_through_creates_folds_deletes_and_keys_given_again(tmp_path: Path) -> None:
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    try:
        for _ in range(6):
            store.create(new_run())
        assert _row(db) == (0, 0) and _count(store) == 6  # nothing written per create: counted when read
        _retention_round(store)
        conn = sqlite3.connect(db)
        keys = [k for (k,) in conn.execute("SELECT run_key FROM ql_run ORDER BY run_key")]
        assert _row(db) == (6, keys[-1]) and _count(store) == 6  # folded: the row is exact again
        # The two newest and the oldest go (as a purge deletes them): the key comes down to the
        # newest left, so the keys SQLite gives next (max + 1: the deleted ones) count as new.
        conn.close()
        _delete_runs(db, [keys[-1], keys[-2], keys[0]])
        assert _row(db) == (3, keys[-3]) and _count(store) == 3
        for _ in range(2):
            store.create(new_run())
        assert _count(store) == 5
        _retention_round(store)
        assert _row(db) == (5, keys[-1]) and _count(store) == 5
        _delete_runs(db, [keys[-1]])  # the newest: the key comes down to the newest left
        assert _row(db) == (4, keys[-2]) and _count(store) == 4
        conn = sqlite3.connect(db)
        left = [k for (k,) in conn.execute("SELECT run_key FROM ql_run")]
        conn.close()
        _delete_runs(db, left)
        assert _row(db) == (0, 0) and _count(store) == 0
    finally:
        store.close()
