"""Writers of one SQLite file in one process queue on a lock of this process
(``edge_sqlite.connection.write_lock``), not on SQLite's busy handler, which sleeps between its
tries (1, 2, 5 … 100 ms): a ``ql worker``'s runner threads, control loop and log shipper all
commit to ``worker.db``, each for a fraction of a millisecond."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path

import pytest

from ql_core.ports.journal import StoreBusyError
from ql_plugins.edge_sqlite.connection import SqliteConnections, write_lock


def _db(path: Path, busy_ms: int = 5000) -> SqliteConnections:
    db = SqliteConnections(path, busy_timeout_ms=busy_ms)
    with db.write() as c:
        c.execute("CREATE TABLE IF NOT EXISTS t (a INTEGER)")
    return db


def test_every_connection_set_of_one_file_shares_the_lock_and_holds_it_while_writing(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    one, two = _db(path), _db(Path(str(tmp_path) + "/./x.db"))  # two stores of one file, spelled apart
    assert write_lock(path) is write_lock(tmp_path / "." / "x.db")
    assert write_lock(path) is not write_lock(tmp_path / "y.db")
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with one.write() as c:
            c.execute("INSERT INTO t VALUES (1)")
            inside.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    try:
        # Another thread finds the lock taken while the transaction is open ...
        seen: list[bool] = []
        probe = threading.Thread(target=lambda: seen.append(write_lock(path).acquire(blocking=False)))
        probe.start()
        probe.join()
        assert seen == [False]
    finally:
        release.set()
        holder.join()
    # ... and free after its commit: the other store of the file writes at once.
    with two.write() as c:
        c.execute("INSERT INTO t VALUES (2)")
    assert [r[0] for r in two.connection().execute("SELECT a FROM t ORDER BY a")] == [1, 2]
    one.close()
    two.close()


def test_a_waiting_writer_queues_on_the_lock_not_in_sqlites_busy_handler(tmp_path: Path) -> None:
    # Which lock the waiter waits on, from the order of the statements both connections run (their
    # trace): on the process lock, its BEGIN IMMEDIATE comes only after the other's COMMIT; in
    # SQLite's busy handler (which sleeps 1, 2, 5 ... 100 ms between tries, entering up to ~100 ms
    # late) it would have begun before. An order, not a duration: a loaded machine cannot fake it.
    path = tmp_path / "x.db"
    one, two = _db(path), _db(path)
    statements: list[tuple[str, str]] = []
    one.trace(lambda _conn, sql: statements.append(("one", sql)))
    two.trace(lambda _conn, sql: statements.append(("two", sql)))
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with one.write() as c:
            c.execute("INSERT INTO t VALUES (1)")
            inside.set()
            release.wait(30)

    def write() -> None:
        with two.write() as c:
            c.execute("INSERT INTO t VALUES (2)")

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.3)  # time to reach its write (and, without the lock, to begin in SQLite)
    assert writer.is_alive(), "the second writer did not wait for the first"
    release.set()
    holder.join()
    writer.join(30)
    begins = [i for i, (who, sql) in enumerate(statements) if who == "two" and sql.startswith("BEGIN")]
    commit = statements.index(("one", "COMMIT"))
    assert begins and min(begins) > commit, statements
    assert [r[0] for r in two.connection().execute("SELECT a FROM t ORDER BY a")] == [1, 2]
    one.close()
    two.close()


def test_a_writer_gives_up_after_the_busy_timeout_with_the_store_busy_error(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    one, two = _db(path), _db(path, busy_ms=100)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with one.write():
            inside.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            with two.write() as c:
                c.execute("INSERT INTO t VALUES (2)")
        except BaseException as exc:  # noqa: BLE001 - checked below
            failed.append(exc)

    t0 = time.monotonic()
    waiter = threading.Thread(target=attempt)
    waiter.start()
    waiter.join(30)
    release.set()
    holder.join()
    assert len(failed) == 1 and isinstance(failed[0], StoreBusyError), failed
    assert 0.09 <= time.monotonic() - t0 < 5
    assert two.connection().execute("SELECT count(*) FROM t").fetchone()[0] == 0
    one.close()
    two.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_writes_although_a_thread_of_its_parent_held_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    parent = _db(path)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with write_lock(path):  # held across the fork by a thread the child does not have
            inside.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(30)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # the child: its own connection, a lock of its own
            code = 1
            try:
                child = SqliteConnections(path, busy_timeout_ms=2000)
                with child.write() as c:
                    c.execute("INSERT INTO t VALUES (7)")
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "the child hangs on its parent's lock"
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join()
    assert sqlite3.connect(path).execute("SELECT a FROM t").fetchall() == [(7,)]
    parent.close()
