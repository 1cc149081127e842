"""The edge-sqlite journal backend: ql's whole run store in one SQLite file (stdlib ``sqlite3``).

Implements :class:`ql_core.ports.journal.JournalBackend` on the SQL journal kernel
(:class:`ql_core.db.journal_kernel.SqlJournalKernel`), which holds the store's logic; this module
is SQLite's part of it: the connections (:mod:`.connection`: WAL, ``synchronous=FULL``, every
write a ``BEGIN IMMEDIATE`` transaction), the statements (:mod:`.statements`), the unsynced commit
of log sizes, and the two capabilities only this store offers — a page of decisions in one
transaction (:class:`~ql_core.ports.journal.BatchTransitions`) and history retention
(:class:`~ql_core.ports.journal.HistoryRetention`). Every statement is prebuilt; no ORM is loaded on
any path, so reading a status costs a SELECT, not an import of SQLAlchemy. Core decides every state
change (:mod:`ql_core.outcome`, the services); the kernel runs the decision inside one transaction
with compare-and-set on versions.

Receipt-journal rows (ADR-0007 §2.5) are never deleted while their receipt may
still exist: after the terminal commit the consumer deletes the receipt and
only *notes* the attempt here (:meth:`SqliteJournal.note_consumed`); the row
goes inside the next write this store makes anyway (the next create), or by
the reconciler's retention once it has seen the receipt missing. A task's
life is three commits: create, spawned, terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Sequence, TypeVar

from ql_core.db.journal_kernel import FLUSH_BATCH, MAX_NOTED, SqlJournalKernel
from ql_core.db.sqlite_runs import attempts_of_runs
from ql_core.ports.journal import StoreError
from ql_core.records import AttemptRecord, RunRecord
from ql_core.states import RUN_TERMINAL

from . import statements
from .connection import SqliteConnections, sqlite_path

if TYPE_CHECKING:
    import sqlite3
    from typing import Mapping

    from ql_core.ports.context import RunEventInfo, RuntimeContext
    from ql_core.ports.journal import Decide, Snapshot, Transition

__all__ = ["SqliteJournal", "MAX_NOTED", "FLUSH_BATCH", "OLDEST_SLACK"]

T = TypeVar("T")
#: History by count reads at most this many pages of the oldest runs per call: non-terminal runs among
#: them (never purged) are stepped over, up to this bound.
OLDEST_SLACK = 4


class SqliteJournal(SqlJournalKernel):
    """The run store of the edge and standalone profiles (registered as ``edge-sqlite``)."""

    name = "edge-sqlite"
    sql = statements
    placeholder = "?"
    # The journal reads derive a terminal attempt's retention clock (statements._TERMINAL_SEEN).
    derives_terminal_seen = True

    def __init__(self, url: str, *, busy_timeout_ms: int = 5000, create: bool = True,
                 refuse_fresh: bool = False) -> None:
        """Open the run database at ``url``; with ``create=False`` it must exist at the current schema
        (nothing is created or migrated: reads on a mistyped data dir leave no trace). With
        ``refuse_fresh`` (the data dir was used before) a missing or empty database is an error, not a
        new empty history."""
        from ql_core.db.migrate import SCHEMA_HEAD

        super().__init__()
        #: Log sizes offered for attempts' terminal commits (ports.journal.TerminalLogSize), by attempt.
        self._terminal_sizes: dict[str, tuple[str, int]] = {}
        self.path = sqlite_path(url)
        if refuse_fresh and (not self.path.exists() or self.path.stat().st_size == 0):
            from ql_core.errors import DatabaseError

            state = "is empty" if self.path.exists() else "is missing"
            raise DatabaseError(f"the run database {self.path} {state}, but this data dir was used before (it has "
                                f"a node_id): the run history would be lost. Restore ql.db from a backup, or move "
                                f"the data dir aside to start afresh")
        self._db = SqliteConnections(self.path, busy_timeout_ms=busy_timeout_ms, create=create)
        try:
            self._db.ensure_schema(SCHEMA_HEAD)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def from_context(cls, context: RuntimeContext) -> SqliteJournal:
        settings = context.plugin_config(cls.name)
        if settings:
            from ql_core.errors import ConfigError

            raise ConfigError(f"[plugin.{cls.name}] takes no settings (got {', '.join(sorted(settings))}); "
                              f"use database_url and [limits] busy_timeout_ms instead")
        return cls(context.config.database_url, busy_timeout_ms=context.config.profile.busy_timeout_ms,
                   create=not context.existing_only, refuse_fresh=context.data_dir_in_use)

    def close(self) -> None:
        self._db.close()

    @property
    def connections(self) -> SqliteConnections:
        """The store's connections (diagnostics, tests and the bulk history filler)."""
        return self._db

    def trace(self, callback: Callable[[int, str], None] | None) -> None:
        """Diagnostics: ``callback(connection_id, sql)`` for every statement this store runs (no
        parameters, so no values); None stops. Tests count commits with it."""
        self._db.trace(callback)

    # -- the kernel's connections: one per thread; the operation name is not needed here ---------
    def _write(self, operation: str) -> ContextManager[sqlite3.Connection]:
        return self._db.write()

    def _read(self, operation: str) -> ContextManager[sqlite3.Connection]:
        return self._db.read()

    def _rows(self, operation: str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.connection().execute(statement, params).fetchall()

    def _execute(self, c: sqlite3.Connection, statement: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        cur = c.execute(statement, params)
        if statement in _KEYED_BY_RUN and cur.rowcount != 1:
            raise _row_of_no_run()
        return cur

    def _execute_many(self, c: sqlite3.Connection, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        cur = c.executemany(statement, rows)
        if statement in _KEYED_BY_RUN and cur.rowcount != len(rows):
            raise _row_of_no_run()

    def _transition_rows(self, c: sqlite3.Connection, attempt_id: str) -> tuple[RunRecord | None, AttemptRecord | None,
                                                                               None, Sequence[Any] | None]:
        # One statement where the kernel's default reads three (attempt, run, cancel dispatch).
        row = c.execute(self.sql.SELECT_TRANSITION_ROWS, (attempt_id,)).fetchone()
        if row is None:
            return None, None, None, None
        run = RunRecord(*row[_RUN_AT:_DISPATCH_AT]) if row[_RUN_AT] is not None else None
        return run, AttemptRecord(*row[:_RUN_AT]), None, (row[_DISPATCH_AT + 1:] if row[_DISPATCH_AT] is not None
                                                          else None)

    def _attempts_of_runs(self, c: sqlite3.Connection, run_ids: list[str]) -> Iterable[Sequence[Any]]:
        # Each run's attempts are one range of the attempt key (revision 0012), through the run's row.
        return c.execute(attempts_of_runs(len(run_ids)), run_ids)

    # -- a page of decisions in one transaction (ql_core.ports.journal.BatchTransitions) -----------
    def transition_many(self, items: list[tuple[str, Decide[T]]]) -> list[tuple[T, list[RunEventInfo]]]:
        with self._db.write() as c:
            out = []
            for attempt_id, decide in items:
                out.append(self._decide_and_apply(c, *self._transition_rows(c, attempt_id), decide=decide))
            return out

    # -- an ended attempt's log size in its terminal commit (ql_core.ports.journal.TerminalLogSize) --
    def offer_log_size(self, attempt_id: str, log_id: str, size: int) -> None:
        self._terminal_sizes[attempt_id] = (log_id, size)

    def withdraw_log_size(self, attempt_id: str) -> None:
        self._terminal_sizes.pop(attempt_id, None)

    def _terminal_attempt_columns(self, attempt: AttemptRecord) -> Mapping[str, object] | None:
        # Empty: on the attempt's row, in the UPDATE this commit makes of it anyway (revision 0020);
        # the log's row is not written, and an empty log is not listed. Read, not taken, as below.
        sized = self._terminal_sizes.get(attempt.id)
        if sized is not None and sized[1] == 0 and sized[0] == attempt.log_artifact_id:
            return _LOG_EMPTY
        return None

    def _terminal_also(self, c: Any, snap: Snapshot, change: Transition) -> None:
        # Read, not taken: a transaction rolled back and retried writes it again; the offerer
        # withdraws it after the terminal commit was tried. An empty log's size (0) went with the
        # attempt's row (_terminal_attempt_columns).
        attempt_id = snap.attempt.id
        sized = self._terminal_sizes.get(attempt_id)
        if sized is None:
            # No size with the end: the log joins the sizing queue in this commit (a running log is
            # not listed, revision 0020), so a crash before its size is recorded cannot lose it.
            self._execute(c, self.sql.SIZE_DUE, (attempt_id,))
        elif sized[1] != 0:
            self._execute(c, self.sql.SET_LOG_SIZE, (sized[1], sized[0]))

    # -- log sizes: the one commit that skips the WAL fsync ----------------------------------------
    def record_log_sizes(self, sizes: Mapping[str, int]) -> None:
        # A size is re-derivable from the file at any time: if this commit is lost (power cut before
        # the WAL reaches the disk), the log is simply back in the sizing queue (its unsized index range)
        # and the next round sizes it again. So this one commit skips the WAL fsync (synchronous=NORMAL
        # keeps the database consistent, only the last commits may roll back), and the next durable
        # commit of this connection carries it to disk. It keeps a task's life at three fsyncs.
        if not sizes:
            return
        conn = self._db.connection()
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            super().record_log_sizes(sizes)
        finally:
            conn.execute("PRAGMA synchronous=FULL")

    # -- history retention (ql_core.ports.journal.HistoryRetention) -------------------------------
    def history_candidates(self, owner: str, *, finished_before_ms: int, keep_newest: int,
                           limit: int) -> dict[str, list[str]]:
        # Index-driven only (docs/recovery.md "Cost of a round"): ended runs past the age window, the
        # oldest created first; the run count from ql_tally and the runs created since its last fold
        # (one key range: the work since the last round, never history), and — only when it exceeds
        # keep_newest — the oldest runs in creation order, at most as many as are in excess.
        # Non-terminal runs among those are kept (never purged), so up to OLDEST_SLACK pages of them
        # are stepped over.
        out: dict[str, list[str]] = {}
        with self._db.read() as c:
            ids = self._ended_before(c, finished_before_ms, limit)
            counted, newer = c.execute(statements.RUN_COUNT).fetchone() or (0, 0)
            excess = int(counted) + int(newer) - keep_newest
            if excess > 0 and len(ids) < limit:
                seen = set(ids)
                for run_id, status, _created, _key in c.execute(statements.OLDEST_RUNS,
                                                          (min(excess, OLDEST_SLACK * limit),)):
                    if len(ids) >= limit:
                        break
                    if status in RUN_TERMINAL and run_id not in seen:
                        ids.append(run_id)
            for run_id in ids[:limit]:
                attempts = c.execute(statements.RUN_ATTEMPTS_OWNERS, (run_id,)).fetchall()
                if any(o != owner for _a, o in attempts):
                    continue  # another node's attempt: its files are not ours to delete
                if any(c.execute(statements.JOURNAL_EXISTS, (a,)).fetchone() for a, _o in attempts):
                    continue  # a receipt may still exist: the journal row goes first
                out[run_id] = [r[0] for r in c.execute(statements.LIVE_LOGS_OF_RUN, (run_id,))]
        if newer:
            self._fold_run_count()
        return out

    def _fold_run_count(self) -> None:
        """Fold the runs created since the last fold into ql_tally's ``runs`` row (revision 0016), so
        the next round's count reads no more than the runs created meanwhile.

        One statement, exact whatever committed between (it counts inside its own transaction). It
        skips the WAL fsync, as :meth:`record_log_sizes` does: a fold lost to a power cut leaves the
        row as it was — still exact for the keys it covers — and the next round folds again; its one
        frame reaches the disk with the next durable commit. A busy or failing store is no reason to
        fail retention: the count is exact without the fold."""
        conn = self._db.connection()
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._db.write() as c:
                c.execute(statements.FOLD_RUN_COUNT)
        except StoreError:
            pass
        finally:
            conn.execute("PRAGMA synchronous=FULL")

    @staticmethod
    def _ended_before(c: sqlite3.Connection, cutoff_ms: int, limit: int) -> list[str]:
        """At most ``limit`` ended runs that finished before ``cutoff_ms``, the oldest created first.

        Each ended state's range of ix_ql_run_status, in creation order, up to the cutoff (a run
        that finished before it was created before it): at most OLDEST_SLACK pages per state are
        read. A run there that finished after the cutoff was live at the cutoff and is stepped over;
        it is purged once the cutoff has passed its end. (A clock set back between a run's creation
        and its end can make it finish "before" it was created: it then goes when the cutoff passes
        its creation.)"""
        found: list[tuple[int, int, str]] = []
        for state in sorted(RUN_TERMINAL):
            for run_id, finished, created, key in c.execute(statements.OLDEST_ENDED_RUNS,
                                                            (state, cutoff_ms, OLDEST_SLACK * limit)):
                if finished is not None and finished < cutoff_ms:
                    found.append((created, key, run_id))
        return [run_id for _created, _key, run_id in sorted(found)[:limit]]

    def purge_runs(self, run_ids: list[str]) -> int:
        # One transaction for the whole page; each statement runs over the page under its index.
        if not run_ids:
            return 0
        params = [(run_id,) for run_id in run_ids]
        with self._db.write() as c:
            for statement in (statements.PURGE_EVENTS, statements.PURGE_DISPATCH, statements.PURGE_LOGS,
                              statements.PURGE_ATTEMPTS):
                c.executemany(statement, params)
            return c.executemany(statements.PURGE_RUN, params).rowcount


#: INSERTs that take their row's key from the run's row (ql_core.db.sqlite_events, .sqlite_runs).
_KEYED_BY_RUN = (statements.INSERT_EVENT, statements.INSERT_ATTEMPT)
#: Where SELECT_TRANSITION_ROWS's run columns, then its dispatch's (run id first), begin.
_RUN_AT = len(AttemptRecord._fields)
_DISPATCH_AT = _RUN_AT + len(RunRecord._fields)
#: An empty log's size, on its attempt's row (revision 0020; reads: ql_core.db.sqlite_logs.SIZE_A).
_LOG_EMPTY = {"log_empty": 1}


def _row_of_no_run() -> Exception:
    """An event or attempt INSERT that inserted nothing: its run is not there (the row's key comes
    from the run's row). Never expected — the run is written or read first in the same transaction —;
    failing the transaction keeps every event and attempt filed under its run."""
    from ql_core.ports.journal import StoreError

    return StoreError("a run event's or attempt's run is missing from the run database")
