"""SQLite's ordered reads of runs from ix_ql_run_order alone (0012, 0013), and a run's attempts by their key (0012).

Real SQLite files and the real store: runs in every state, created out of id order, listed newest
first and oldest first across the states; ended runs by age; a run's attempts through its key.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ql_core.db.sqlite_runs import RUN_STATES
from ql_core.testing.journal_support import new_run
from ql_plugins.edge_sqlite import statements
from ql_plugins.edge_sqlite.store import SqliteJournal


def test_every_state_a_run_can_be_in_is_an_arm_of_the_merged_reads() -> None:
    from ql_core.cli.cmd_list import RUN_STATES as LISTED

    assert set(RUN_STATES) == set(LISTED)  # a state missing here would hide its runs from `ql list`


def test_newest_and_oldest_runs_merge_the_states_in_creation_order(tmp_path: Path) -> None:
    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        # Creation times interleave the states; two runs share a time (the run's key, its creation
        # order, breaks the tie: revision 0016).
        made = [new_run(created_at_ms=10_000 + (i // 2 if i < 4 else i) * 7) for i in range(3 * len(RUN_STATES))]
        for new in made:
            store.create(new)
        conn = sqlite3.connect(tmp_path / "ql.db")
        for i, new in enumerate(made):
            state = RUN_STATES[(i * 3) % len(RUN_STATES)]
            conn.execute("UPDATE ql_run SET status = ?, finished_at_ms = created_at_ms + 1 WHERE id = ?",
                         (state, new.run_id))
        conn.commit()
        expected = [r[0] for r in conn.execute("SELECT id FROM ql_run ORDER BY created_at_ms, run_key")]
        conn.close()
        assert len({r.created_at_ms for r in made}) < len(made)  # the tie is there
        for limit in (1, 5, len(made), len(made) + 3):
            newest = [v.run_id for v in store.list_views(status=None, limit=limit)]
            assert newest == expected[::-1][:limit]
        with store.connections.read() as c:
            oldest = [r[0] for r in c.execute(statements.OLDEST_RUNS, (6,))]
        assert oldest == expected[:6]
        # By age: ended runs that finished before the cutoff, oldest created first, at most `limit`.
        cutoff = made[10].created_at_ms
        with store.connections.read() as c:
            aged = store._ended_before(c, cutoff, 100)
        conn = sqlite3.connect(tmp_path / "ql.db")
        want = [r[0] for r in conn.execute(
            "SELECT id FROM ql_run WHERE status IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'lost') "
            "AND finished_at_ms < ? ORDER BY created_at_ms, run_key", (cutoff,))]
        conn.close()
        assert aged == want and want
        with store.connections.read() as c:
            assert store._ended_before(c, cutoff, 2) == want[:2]
    finally:
        store.close()


def test_a_runs_attempts_are_its_key_range(tmp_path: Path) -> None:
    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        made = [new_run(created_at_ms=1_000 + i) for i in range(3)]
        for new in made:
            store.create(new)
        for new in made:
            view = store.view(new.run_id)
            assert view is not None and [a.attempt_id for a in view.attempts] == [new.attempt_id]
        conn = sqlite3.connect(tmp_path / "ql.db")
        keys = conn.execute("SELECT a.attempt_key, r.run_key FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id "
                            "ORDER BY a.attempt_key").fetchall()
        assert keys == [((run_key << 8) + 1, run_key) for _key, run_key in keys]
        # A row written by anything else must carry its key: a number outside the key is refused.
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE ql_run_attempt SET attempt_no = 2 WHERE attempt_key = ?", (keys[0][0],))
        conn.close()
    finally:
        store.close()


def test_status_order_numbers_every_state_as_the_reads_do(tmp_path: Path) -> None:
    from ql_core.db.sqlite_runs import STATUS_ORDER

    assert set(STATUS_ORDER) == set(RUN_STATES)
    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        new = new_run()
        store.create(new)
        conn = sqlite3.connect(tmp_path / "ql.db")
        for n, state in enumerate(STATUS_ORDER, start=1):  # the migration's column, the reads' numbers
            conn.execute("UPDATE ql_run SET status = ? WHERE id = ?", (state, new.run_id))
            assert conn.execute("SELECT status_order FROM ql_run WHERE id = ?", (new.run_id,)).fetchone() == (n,)
        conn.rollback()
        conn.close()
    finally:
        store.close()


def _wal_pages(wal: Path, start: int, page_size: int = 512) -> set[int]:
    """The page numbers of the WAL frames appended at or after byte ``start``."""
    import struct

    data = wal.read_bytes()
    pages, pos = set(), max(start, 32)
    while pos + 24 + page_size <= len(data):
        pages.add(struct.unpack(">I", data[pos:pos + 4])[0])
        pos += 24 + page_size
    return pages


def test_a_runs_create_and_end_write_one_leaf_of_the_run_order_each(tmp_path: Path) -> None:
    # 0013: the live states are the right edge of ix_ql_run_order and `succeeded` just before them,
    # so the newest run's entry is appended there and moves within that leaf when it ends (by state
    # name, `running` sat in front of the whole `succeeded` history: a middle leaf, then the edge).
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # the WAL only grows here: frames are read by offset
    try:
        for i in range(120):  # several leaves of succeeded history
            new = new_run(created_at_ms=1_000 + i)
            store.create(new)
            conn.execute("UPDATE ql_run SET status = 'succeeded' WHERE id = ?", (new.run_id,))
            conn.commit()
        touched = []
        for i in range(6):
            new = new_run(created_at_ms=2_000 + i)
            for step in ("create", "end"):
                start = (tmp_path / "ql.db-wal").stat().st_size
                if step == "create":
                    store.create(new)
                else:
                    conn.execute("UPDATE ql_run SET status = 'succeeded' WHERE id = ?", (new.run_id,))
                    conn.commit()
                leaves = {p for (p,) in conn.execute("SELECT pageno FROM dbstat WHERE name = 'ix_ql_run_order' "
                                                     "AND pagetype = 'leaf'")}
                touched.append(len(_wal_pages(tmp_path / "ql.db-wal", start) & leaves))
        # One leaf per commit but for a right-edge split now and then (by name: every end wrote two).
        ends = touched[1::2]
        assert ends.count(1) >= len(ends) - 1, touched
    finally:
        conn.close()
        store.close()


def test_the_host_handle_is_kept_beside_the_attempt_and_the_row_fits_its_page(tmp_path: Path) -> None:
    # 0014: with both handles an attempt row spilled into an overflow page that each commit replaced;
    # 0019: the create's host handle is in its run's row (written by the create anyway), and side
    # rows of ql_attempt_host written before are still read.
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    host = '{"boot_id":"%s","pgid":4194311,"pid":4194311,"source":"proc","start_time":123456789}' % ("b" * 36)
    handle = '{"boot_id":"%s","pgid":4194312,"pid":4194312,"source":"proc","start_boot_ms":98765432,' \
             '"start_time":123456790}' % ("b" * 36)
    try:
        made = [new_run()._replace(host_handle=host) for _ in range(3)]
        for new in made:
            store.create_running(new, handle=handle)
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT count(*) FROM ql_run_attempt WHERE host_handle IS NOT NULL").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM ql_run WHERE host_handle = ?", (host,)).fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM ql_attempt_host").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM dbstat WHERE name = 'ql_run_attempt' AND pagetype = 'overflow'"
                            ).fetchone() == (0,)
        # A row that carries its own host handle (an older revision's, or written by anything else) wins.
        conn.execute("UPDATE ql_run_attempt SET host_handle = 'own' WHERE id = ?", (made[0].attempt_id,))
        conn.commit()
        assert store.attempt(made[0].attempt_id).host_handle == "own"
        assert store.attempt(made[1].attempt_id).host_handle == host
        with store.connections.read() as c:  # a run's attempts, through its key
            assert [a[16] for a in c.execute(statements.SELECT_ATTEMPTS_OF_RUN, (made[1].run_id,))] == [host]
        # A side row written before 0019 (the run's column NULL) is read; it goes with its attempt.
        key = conn.execute("SELECT attempt_key FROM ql_run_attempt WHERE id = ?", (made[2].attempt_id,)).fetchone()
        conn.execute("UPDATE ql_run SET host_handle = NULL WHERE id = ?", (made[2].run_id,))
        conn.execute("INSERT INTO ql_attempt_host (attempt_key, host_handle) VALUES (?, 'side')", key)
        conn.commit()
        assert store.attempt(made[2].attempt_id).host_handle == "side"
        conn.execute("DELETE FROM ql_run_attempt WHERE id = ?", (made[2].attempt_id,))
        conn.commit()
        assert conn.execute("SELECT count(*) FROM ql_attempt_host").fetchone() == (0,)
        conn.close()
    finally:
        store.close()


def test_a_transitions_rows_in_one_statement_are_the_kernels_three(tmp_path: Path) -> None:
    """``SqliteJournal._transition_rows`` (one joined SELECT) reads what the kernel's default reads
    in three statements — the attempt (its host handle from the run's row, written with it by
    ``INSERT_RUN_HOST``), its run, the run's cancel dispatch — for every case: no dispatch, one
    for this attempt with and without its TERM sent, one for another attempt, a running create
    with a handle, no such attempt."""
    from ql_core.db.journal_kernel import UNREAD, SqlJournalKernel

    store = SqliteJournal(f"sqlite:///{tmp_path / 'ql.db'}")
    try:
        made = [new_run() for _ in range(4)]
        store.create(made[0])
        for new in made[1:]:
            store.create_running(new._replace(host_handle='{"pid": 7}'), handle='{"pid": 8}')
        conn = sqlite3.connect(tmp_path / "ql.db")
        for new, attempt_id, term_sent in ((made[1], made[1].attempt_id, None), (made[2], made[2].attempt_id, 5),
                                           (made[3], "01a20000-0000-7000-8000-000000000000", 6)):
            conn.execute("INSERT INTO ql_cancel_dispatch (run_id, attempt_id, reason, state, version, tries, "
                         "next_attempt_at_ms, term_sent_at_ms, created_at_ms, updated_at_ms) "
                         "VALUES (?, ?, 'cancel', 'pending', 1, 0, 1, ?, 1, 1)", (new.run_id, attempt_id, term_sent))
        conn.commit()
        conn.close()
        with store.connections.write() as c:
            for attempt_id in [n.attempt_id for n in made] + ["01a20000-0000-7000-8000-00000000ffff"]:
                run, attempt, now, dispatch = store._transition_rows(c, attempt_id)
                k_run, k_attempt, k_now, k_dispatch = SqlJournalKernel._transition_rows(store, c, attempt_id)
                assert k_dispatch is UNREAD
                assert (run, attempt, now) == (k_run, k_attempt, k_now)
                signal = c.execute(statements.SELECT_DISPATCH_SIGNAL, (run.id,)).fetchone() if run else None
                assert (tuple(dispatch) if dispatch is not None else None) == signal
            assert store._transition_rows(c, made[1].attempt_id)[1].host_handle == '{"pid": 7}'
            assert store._transition_rows(c, made[2].attempt_id)[3] == (made[2].attempt_id, 5)
    finally:
        store.close()
