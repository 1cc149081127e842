"""SQLite's kept logs in one index, ix_ql_log_order: sized by age, then the sizing queue by id (0015,
0020).

Real SQLite files and the real store: every log read returns what the two partial indexes before it
returned, in the same order; a log is listed only once its attempt ended (an empty one never), so a
task's create writes no leaf of the index, nor does an end that finds the log empty, which writes
no log row either; an end without a size lists the log in the queue.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from ql_core.ports.journal import EventSpec, Transition
from ql_core.testing.journal_support import OWNER, new_run
from ql_plugins.edge_sqlite.store import SqliteJournal


def _wal_pages_since(wal: Path, start: int) -> set[int]:
    """The page numbers of the 512-byte pages' frames written to ``wal`` at or after byte ``start``."""
    data, pages, pos = wal.read_bytes(), set(), max(start, 32)
    while pos + 24 + 512 <= len(data):
        pages.add(struct.unpack(">I", data[pos:pos + 4])[0])
        pos += 24 + 512
    return pages


def _end(store: SqliteJournal, attempt_id: str) -> None:
    store.transition(attempt_id, lambda snap: (None, Transition(
        attempt={"status": "succeeded", "exit_code": 0}, run={"status": "succeeded", "exit_code": 0},
        events=(EventSpec("attempt.succeeded"), EventSpec("run.succeeded")), terminal=True)))


def test_logs_by_age_merge_the_sized_and_the_unsized_in_creation_order(tmp_path: Path) -> None:
    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        made = [new_run(created_at_ms=1_000 + 10 * i) for i in range(6)]
        for new in made:
            store.create(new)
        for new in made[:5]:
            _end(store, new.attempt_id)
        # Sized: the 2nd and 4th (by age); unsized and ended: 1st, 3rd, 5th; the 6th still running.
        store.record_log_sizes({made[1].log_artifact_id: 5, made[3].log_artifact_id: 7})
        logs = [new.log_artifact_id for new in made]
        older = store.ended_logs(OWNER, created_before_ms=1_045, limit=10)
        assert [f.id for f in older] == logs[:5]
        assert [f.created_at_ms for f in older] == [1_000, 1_010, 1_020, 1_030, 1_040]  # created, not the key
        assert [f.id for f in store.ended_logs(OWNER, created_before_ms=1_025, limit=2)] == logs[:2]
        assert [f.id for f in store.ended_logs(OWNER, sized=True, limit=10)] == [logs[1], logs[3]]
        assert sorted(f.id for f in store.ended_logs(OWNER, unsized=True, limit=10)) == sorted(
            [logs[0], logs[2], logs[4]])
        assert [f.id for f in store.page_live_logs(OWNER, "", 10)] == [logs[5]]
        store.mark_log_deleted(logs[1], 2_000, 5)
        assert [f.id for f in store.ended_logs(OWNER, sized=True, limit=10)] == [logs[3]]
    finally:
        store.close()


def test_a_logs_sizing_moves_its_entry_within_one_leaf_of_the_index(tmp_path: Path) -> None:
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL only grows here: frames are read by offset
    wal = tmp_path / "ql.db-wal"

    try:
        for i in range(100):  # several leaves of sized history
            new = new_run(created_at_ms=1_000 + i)
            store.create(new)
            _end(store, new.attempt_id)
            store.record_log_sizes({new.log_artifact_id: i})
        ends = []
        for i in range(6):
            new = new_run(created_at_ms=2_000 + i)
            store.create(new)
            _end(store, new.attempt_id)
            start = wal.stat().st_size
            store.record_log_sizes({new.log_artifact_id: 1})
            leaves = {p for (p,) in conn.execute("SELECT pageno FROM dbstat WHERE name = 'ix_ql_log_order' "
                                                 "AND pagetype = 'leaf'")}
            ends.append(len(_wal_pages_since(wal, start) & leaves))
        # Sized: the entry moves beside itself (two partial indexes: a leaf of each).
        assert ends.count(1) >= len(ends) - 1, ends
    finally:
        conn.close()
        store.close()


def test_a_log_row_fits_its_cell_and_reads_its_attempt_through_the_run(tmp_path: Path) -> None:
    """0016: a new log row stores neither its attempt's id nor its path (both derived), so it fits the
    102 bytes a 512-byte index page keeps in a cell (no overflow page per task); every read gives
    its attempt's id as before, and the owner's log total still follows its size."""
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    try:
        made = [new_run() for _ in range(20)]
        for new in made:
            store.create(new)
        for new in made[:10]:
            _end(store, new.attempt_id)
        store.record_log_sizes({new.log_artifact_id: 100 for new in made[:10]})
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("SELECT count(*) FROM dbstat WHERE name = 'ql_log_artifact' "
                                "AND pagetype = 'overflow'").fetchone()[0] == 0
            assert conn.execute("SELECT DISTINCT attempt_id, relative_path FROM ql_log_artifact").fetchall() == [("", "")]
        finally:
            conn.close()
        for new in made:
            facts = store.log_facts(new.log_artifact_id)
            assert (facts.run_id, facts.attempt_id) == (new.run_id, new.attempt_id)
        assert {f.attempt_id for f in store.ended_logs(OWNER, sized=True, limit=50)} == {n.attempt_id for n in made[:10]}
        assert {f.attempt_id for f in store.page_live_logs(OWNER, "", 50)} == {n.attempt_id for n in made[10:]}
        assert store.ended_log_bytes(OWNER) == 1000  # the tally's triggers find the owner through the run
        store.mark_log_deleted(made[0].log_artifact_id, 5_000, 100)
        assert store.ended_log_bytes(OWNER) == 900
    finally:
        store.close()


def test_only_an_ended_log_is_listed_and_an_empty_end_writes_no_log_page(tmp_path: Path) -> None:
    """0020: the create and an empty end (size 0 offered) leave ix_ql_log_order alone and the empty
    end writes no page of the log table; an end without a size lists the log (the sizing queue), so
    a crash before the size is recorded cannot lose it; the running log is found through its run."""
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL only grows here: frames are read by offset
    wal = tmp_path / "ql.db-wal"

    def written_since(start: int) -> set[str]:  # the B-trees whose pages were written
        owners = dict(conn.execute("SELECT pageno, name FROM dbstat"))
        return {owners.get(p, "?") for p in _wal_pages_since(wal, start)}

    try:
        for i in range(30):  # some history: sized, empty and queued logs
            new = new_run(created_at_ms=1_000 + i)
            store.create(new)
            _end(store, new.attempt_id)
            store.record_log_sizes({new.log_artifact_id: i % 3})
        quiet, loud = new_run(created_at_ms=2_000), new_run(created_at_ms=2_001)
        start = wal.stat().st_size
        store.create(quiet)
        assert "ix_ql_log_order" not in written_since(start)
        store.create(loud)
        assert [f.id for f in store.page_live_logs(OWNER, "", 10)] == sorted([quiet.log_artifact_id,
                                                                             loud.log_artifact_id])
        start = wal.stat().st_size
        store.offer_log_size(quiet.attempt_id, quiet.log_artifact_id, 0)
        try:
            _end(store, quiet.attempt_id)
        finally:
            store.withdraw_log_size(quiet.attempt_id)
        assert {"ix_ql_log_order", "ql_log_artifact"}.isdisjoint(written_since(start))
        assert store.log_facts(quiet.log_artifact_id).size_bytes == 0  # type: ignore[union-attr]
        start = wal.stat().st_size
        _end(store, loud.attempt_id)
        assert {"ix_ql_log_order", "ql_log_artifact"} <= written_since(start)
        assert store.page_live_logs(OWNER, "", 10) == []
        assert [f.id for f in store.ended_logs(OWNER, unsized=True, limit=10)] == [loud.log_artifact_id]
        # Sized: out of the queue; only the logs that are not empty are retention's.
        store.record_log_sizes({loud.log_artifact_id: 9})
        assert store.ended_logs(OWNER, unsized=True, limit=10) == []
        sized = store.ended_logs(OWNER, sized=True, limit=100)
        assert [f.size_bytes for f in sized] == [i % 3 for i in range(30) if i % 3] + [9]
        assert quiet.log_artifact_id not in {f.id for f in store.ended_logs(OWNER, created_before_ms=9_999,
                                                                             limit=100)}
    finally:
        conn.close()
        store.close()


def test_an_empty_logs_size_goes_with_a_terminal_change_that_leaves_the_attempt_alone(tmp_path: Path) -> None:
    """The empty log's size (0) rides in the terminal change's UPDATE of the attempt; a terminal
    change that does not touch the attempt still records it (one UPDATE of its own), else the
    log would be neither sized nor in the sizing queue once its file is dropped."""
    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        new = new_run()
        store.create_running(new, handle='{"pid": 8}')
        store.offer_log_size(new.attempt_id, new.log_artifact_id, 0)
        store.transition(new.attempt_id, lambda snap: (None, Transition(
            run={"status": "succeeded", "finished_at_ms": snap.now_ms}, events=(EventSpec("run.succeeded"),),
            terminal=True)))
        store.withdraw_log_size(new.attempt_id)
        conn = sqlite3.connect(tmp_path / "ql.db")
        try:
            assert conn.execute("SELECT log_empty FROM ql_run_attempt WHERE id = ?",
                                (new.attempt_id,)).fetchone() == (1,)
            assert conn.execute("SELECT size_bytes, size_due FROM ql_log_artifact WHERE id = ?",
                                (new.log_artifact_id,)).fetchone() == (None, 0)
        finally:
            conn.close()
        assert store.log_facts(new.log_artifact_id).size_bytes == 0
    finally:
        store.close()
