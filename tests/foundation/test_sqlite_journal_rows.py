"""The receipt journal on SQLite (revision 0016): one WITHOUT ROWID B-tree whose rows fit their cell.

A create's journal row leaves its run id and receipt reference empty (both derived: the attempt's
run, ``<xx>/<attempt_id>.json``); every read gives them as they were given. A row registered for a
receipt whose attempt is not there, or with another reference, keeps them. Real SQLite, real store.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ql_core.ids import new_id
from ql_core.receipts.file_store import FileReceiptStore
from ql_core.testing.journal_support import new_run
from ql_plugins.edge_sqlite.store import SqliteJournal


def test_a_creates_journal_row_fits_its_cell_and_reads_back_whole(tmp_path: Path) -> None:
    db = tmp_path / "ql.db"
    store = SqliteJournal(f"sqlite:///{db}")
    try:
        made = [new_run() for _ in range(5)]
        for new in made:
            store.create(new)
        orphan, other = new_id(), new_id()  # receipts found on disk: no attempt row for the first
        assert store.register_journal({orphan: ("run-elsewhere", FileReceiptStore.relative_ref(orphan)),
                                       made[0].attempt_id: (made[0].run_id, "zz/elsewhere.json")}, 1_000) == 1
        store.register_journal({other: ("run-other", "zz/other.json")}, 1_000)
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'ql_receipt_journal'"
                                ).fetchone()[0].rstrip().endswith("WITHOUT ROWID")
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE "
                                "'sqlite_autoindex_ql_receipt_journal%'").fetchone()[0] == 0
            stored = dict((a, (r, ref)) for a, r, ref in conn.execute(
                "SELECT attempt_id, run_id, receipt_ref FROM ql_receipt_journal"))
            assert conn.execute("SELECT count(*) FROM dbstat WHERE name = 'ql_receipt_journal' "
                                "AND pagetype = 'overflow'").fetchone()[0] == 0
        finally:
            conn.close()
        assert all(stored[n.attempt_id] == ("", "") for n in made)  # derived: not stored
        assert stored[orphan] == ("run-elsewhere", "") and stored[other] == ("run-other", "zz/other.json")
        for new in made:
            entry = store.journal_entry(new.attempt_id)
            assert (entry.run_id, entry.receipt_ref) == (new.run_id, new.receipt_ref)
            assert new.receipt_ref == FileReceiptStore.relative_ref(new.attempt_id)
        paged = {e.attempt_id: (e.run_id, e.receipt_ref) for e in store.page_journal("", 100)}
        assert paged == {**{n.attempt_id: (n.run_id, n.receipt_ref) for n in made},
                         orphan: ("run-elsewhere", FileReceiptStore.relative_ref(orphan)),
                         other: ("run-other", "zz/other.json")}
    finally:
        store.close()
