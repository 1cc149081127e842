"""The run database's declared schema: SQLModel tables (ADR-0007 §2.1, §2.2, §2.5).

Run, RunAttempt and RunEvent are the only business truth. The receipt journal
indexes attempts that may have a receipt file; the cancellation dispatch holds
the lease-guarded intent to signal. Times are integer Unix milliseconds.

This module is the *declaration*: Alembic migrations are checked against it
(a test compares it with the migrated schema) and tests use it to inspect a
database. The hot paths do not load it: each journal backend reads and writes
with its own prebuilt statements. The tables live on a private
:data:`METADATA` (registry of :class:`QlTable`), never on the global
``SQLModel.metadata`` of an application that embeds ql. Every change here
needs a new Alembic revision.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import BigInteger, Column, Index, MetaData, text
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

__all__ = [
    "SQLITE_ONLY_COLUMNS",
    "SQLITE_ONLY_INDEXES",
    "NOT_ON_SQLITE_FOREIGN_KEYS",
    "QlTable",
    "METADATA",
    "Run",
    "RunAttempt",
    "RunEvent",
    "LogArtifact",
    "CompletionReceiptJournal",
    "CancellationDispatch",
    "AttemptHost",
    "Tally",
    "ENDED_SQL",
    "ACTIVE_SQL",
    "ms_column",
    "WITHOUT_ROWID",
    "table_dialects",
    "include_object",
]

class QlTable(SQLModel, registry=registry()):
    """Base of ql's tables: its own registry, so its own :class:`~sqlalchemy.MetaData`."""


#: ql's tables and nothing else (Alembic's ``target_metadata``).
METADATA: MetaData = QlTable.metadata


#: The ended run/attempt states, as SQL (the partial indexes' predicates; statements repeat them verbatim
#: so the planner can use those indexes).
ENDED_SQL = "('succeeded', 'failed', 'cancelled', 'timed_out', 'lost')"
#: Attempts a recovery round looks at.
ACTIVE_SQL = "('starting', 'running')"
_UNSIZED = "size_bytes IS NULL AND deleted_at_ms IS NULL"


#: ``__table_args__`` of the tables SQLite keeps WITHOUT ROWID (0010: one B-tree per row written).
WITHOUT_ROWID = {"sqlite_with_rowid": False}


def ms_column(nullable: bool = False, index: bool = False) -> Column:  # type: ignore[type-arg]
    return Column(BigInteger, nullable=nullable, index=index)


class Run(QlTable, table=True):
    """One submitted task. ``version`` and ``event_seq`` guard every write (compare-and-set)."""

    __tablename__ = "ql_run"
    __table_args__ = (
                      # Newest first / oldest first with a total order (0007: id added, so an ORDER BY
                      # created_at_ms, id ... LIMIT n reads n entries and never sorts). PostgreSQL only
                      # since 0012: SQLite merges the per-state ranges of ix_ql_run_status instead.
                      Index("ix_ql_run_created", "created_at_ms", "id", info={"ql_dialects": ("postgresql",)}),
                      # `ql list --status S`: the newest n runs in one state, read in order (0007).
                      # PostgreSQL only since 0013: SQLite's one ordered index of runs is
                      # ix_ql_run_order (status_order, created_at_ms; 0016), the states numbered so that
                      # the live ones are its right edge (SQLITE_ONLY_INDEXES).
                      Index("ix_ql_run_status", "status", "created_at_ms", "id", info={"ql_dialects": ("postgresql",)}),
                      # PostgreSQL only since 0009: no SQLite query reads it (EXPLAIN QUERY PLAN of
                      # every statement), and each run's create and end wrote it.
                      Index("ix_ql_run_finished", "status", "finished_at_ms", info={"ql_dialects": ("postgresql",)}),
                      # History retention by age: ended runs, oldest finish first (0007; partial, so the
                      # five ended states are one ordered range, not five merged ones). PostgreSQL only
                      # since 0012: each task's end wrote it; SQLite reads ix_ql_run_status's ended ranges.
                      Index("ix_ql_run_ended", "finished_at_ms", "id", postgresql_where=text(f"status IN {ENDED_SQL}"),
                            info={"ql_dialects": ("postgresql",)}),
                      # The queue, oldest first (cluster claim; 0003).
                      Index("ix_ql_run_queued", "created_at_ms", "id",
                            postgresql_where=text("status = 'queued'"), sqlite_where=text("status = 'queued'")))

    id: str = Field(primary_key=True, max_length=36)
    name: Optional[str] = Field(default=None, max_length=200)
    status: str = Field(max_length=16)
    exit_code: Optional[int] = None
    reason: Optional[str] = Field(default=None, max_length=80)
    version: int = 1
    event_seq: int = 0
    current_attempt_id: Optional[str] = Field(default=None, max_length=36)
    created_at_ms: int = Field(sa_column=ms_column())
    updated_at_ms: int = Field(sa_column=ms_column())
    finished_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    deadline_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    #: A committed cancel intent: reason ("user" | "policy" | "shutdown" | "timeout") and its time.
    cancel_reason: Optional[str] = Field(default=None, max_length=16)
    cancel_requested_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    #: Retry policy (0003): how many attempts that may have started the run may have. 1 = never run
    #: twice; more only for tasks declared safe to run again after a lost attempt.
    max_attempts: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    #: Per-attempt timeout (0003); a queued run's deadline is set from it when its attempt starts running.
    timeout_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))


class RunAttempt(QlTable, table=True):
    """One execution of a run; everything here is persisted before the process exists."""

    __tablename__ = "ql_run_attempt"
    __table_args__ = (
        # PostgreSQL only since 0009: on SQLite the live attempts are read through the live runs
        # (0018; the partial ix_ql_attempt_live before), deadlines through ix_ql_attempt_deadline,
        # joins through the key.
        Index("ix_ql_attempt_active", "runtime_owner", "status", "id", info={"ql_dialects": ("postgresql",)}),
        # A run's attempts in order (0007: attempt_no added; reads and purges of a run). PostgreSQL
        # only since 0012: on SQLite a run's attempts are one range of their key (attempt_key).
        Index("ix_ql_attempt_run", "run_id", "attempt_no", info={"ql_dialects": ("postgresql",)}),
        # The recovery page: this node's starting/running attempts by id, only active rows (0007).
        # PostgreSQL only since 0018: on SQLite they are read through the live runs' ranges of
        # ix_ql_run_order (ql_core.db.sqlite_runs.PAGE_ACTIVE_ATTEMPTS).
        Index("ix_ql_attempt_live", "runtime_owner", "id", postgresql_where=text(f"status IN {ACTIVE_SQL}"),
              info={"ql_dialects": ("postgresql",)}),
        # Due deadlines; on SQLite only attempts that have one (0010: a task without a deadline
        # writes no entry; the due-deadline statement compares deadline_at_ms, so the planner uses it).
        Index("ix_ql_attempt_deadline", "status", "deadline_at_ms", sqlite_where=text("deadline_at_ms IS NOT NULL")),
    )

    id: str = Field(primary_key=True, max_length=36)
    run_id: str = Field(foreign_key="ql_run.id", max_length=36)
    attempt_no: int = 1
    #: The registered name of the executor that started it; recovery, cancel and wait go to it.
    executor: str = Field(max_length=64)
    #: The stable id of the node whose runtime may complete this attempt.
    runtime_owner: str = Field(max_length=64)
    status: str = Field(max_length=16)
    exit_code: Optional[int] = None
    reason: Optional[str] = Field(default=None, max_length=80)
    log_artifact_id: str = Field(max_length=36)
    #: SHA-256 (hex) of the callback token; the token itself is never stored.
    callback_token_hash: str = Field(max_length=64)
    #: Last accepted callback sequence; the launcher is given this + 1.
    callback_sequence: int = 0
    deadline_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    created_at_ms: int = Field(sa_column=ms_column())
    started_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    finished_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    #: The executor's durable handle (opaque JSON, at most 512 bytes), written by the "spawned"
    #: transaction. Core never parses it: only the executor named above does.
    handle: Optional[str] = Field(default=None, max_length=512)
    #: The submitting host's own identity (same executor's handle format), written by the create
    #: commit: "never spawned" is proven from it (host gone and no handle), never guessed by a timer.
    host_handle: Optional[str] = Field(default=None, max_length=512)
    #: Attempt-local optimistic version.
    version: int = 1


class RunEvent(QlTable, table=True):
    """An ordered, low-sensitivity fact about a run: ids, type, status, exit code, reason."""

    __tablename__ = "ql_run_event"
    # On SQLite the dedupe index holds only the keys that exist (0010: no NULL entry per event), and the
    # table is keyed by its own integer column, event_key = the run's run_key << 20 | seq (0011,
    # ql_core.db.sqlite_events): a run's events are one rowid range, and no index on run ids is written.
    __table_args__ = (Index("ux_ql_event_dedupe", "dedupe_key", unique=True,
                            sqlite_where=text("dedupe_key IS NOT NULL")), WITHOUT_ROWID)

    run_id: str = Field(foreign_key="ql_run.id", primary_key=True, max_length=36)
    #: 1, 2, 3, ... per run; ``(run_id, seq)`` is the key, so a second writer of the same seq fails.
    seq: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    type: str = Field(max_length=48)
    attempt_id: Optional[str] = Field(default=None, max_length=36)
    status: Optional[str] = Field(default=None, max_length=16)
    exit_code: Optional[int] = None
    reason: Optional[str] = Field(default=None, max_length=80)
    at_ms: int = Field(sa_column=ms_column())
    #: Idempotency key of an event submitted at least once (e.g. a fenced completion's audit); 0003.
    dedupe_key: Optional[str] = Field(default=None, max_length=160)


class LogArtifact(QlTable, table=True):
    """The append-only log file of one attempt, relative to ``<data_dir>/logs``."""

    __tablename__ = "ql_log_artifact"
    __table_args__ = (  # WITHOUT ROWID on SQLite (0010), clustered on the key
        # A run's logs (history purge; 0007 — before it every purged run cost two full scans). PostgreSQL
        # only since 0010: SQLite finds a run's logs through its attempts' log_artifact_id.
        Index("ix_ql_log_run", "run_id", info={"ql_dialects": ("postgresql",)}),
        # Logs not sized yet: the running ones and ended ones whose sizing a crash interrupted
        # (0007; the quota pass and the sizing queue — never the history).
        # PostgreSQL only since 0015 (this one and ix_ql_log_kept): SQLite keeps both sets in one
        # index, ix_ql_log_order (SQLITE_ONLY_INDEXES, ql_core.db.sqlite_logs).
        Index("ix_ql_log_unsized", "id", postgresql_where=text(_UNSIZED), info={"ql_dialects": ("postgresql",)}),
        # Logs still on disk, oldest first (0007; retention by age and by total size).
        Index("ix_ql_log_kept", "created_at_ms", "id",
              postgresql_where=text("deleted_at_ms IS NULL"), info={"ql_dialects": ("postgresql",)}),
        WITHOUT_ROWID,
    )

    id: str = Field(primary_key=True, max_length=36)
    run_id: str = Field(max_length=36)
    attempt_id: str = Field(max_length=36)
    relative_path: str = Field(max_length=120)
    max_bytes: int = Field(sa_column=ms_column())
    size_bytes: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    truncated: bool = False
    created_at_ms: int = Field(sa_column=ms_column())
    deleted_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))


class CompletionReceiptJournal(QlTable, table=True):
    """Which attempt may have a receipt, where (relative), and its retention clock."""

    __tablename__ = "ql_receipt_journal"
    # The state index is PostgreSQL's only since 0010 (no statement of the SQLite store reads it).
    # A rowid table on SQLite again since 0012: WITHOUT ROWID (0010) spilled every row into an
    # overflow page at 512-byte pages, rewritten by the terminal commit and freed by the delete.
    __table_args__ = (Index("ix_ql_journal_state", "state", "attempt_id", info={"ql_dialects": ("postgresql",)}),)

    attempt_id: str = Field(primary_key=True, max_length=36)
    run_id: str = Field(max_length=36)
    #: "pending" | "quarantined"
    state: str = Field(max_length=16)
    receipt_ref: str = Field(max_length=64)
    quarantine_reason: Optional[str] = Field(default=None, max_length=40)
    registered_at_ms: int = Field(sa_column=ms_column())
    updated_at_ms: int = Field(sa_column=ms_column())
    #: When the attempt was seen terminal with no receipt: start of the retention window.
    terminal_seen_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))


class CancellationDispatch(QlTable, table=True):
    """One per run: the intent to signal one attempt, claimed by a lease before any signal."""

    __tablename__ = "ql_cancel_dispatch"
    __table_args__ = (Index("ix_ql_dispatch_due", "state", "next_attempt_at_ms"),)

    run_id: str = Field(primary_key=True, max_length=36)
    attempt_id: str = Field(max_length=36)
    reason: str = Field(max_length=16)
    #: "pending" | "term_sent" | "done" | "blocked"
    state: str = Field(max_length=16)
    outcome: Optional[str] = Field(default=None, max_length=24)
    lease_owner: Optional[str] = Field(default=None, max_length=64)
    lease_expires_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    version: int = 1
    tries: int = 0
    next_attempt_at_ms: int = Field(sa_column=ms_column())
    term_sent_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    kill_sent_at_ms: Optional[int] = Field(default=None, sa_column=ms_column(nullable=True))
    created_at_ms: int = Field(sa_column=ms_column())
    updated_at_ms: int = Field(sa_column=ms_column())


class AttemptHost(QlTable, table=True):
    """An attempt's host handle, beside its row (0014; SQLite only): written once by the create, so
    the attempt row (both handles ~510 bytes) fits a 512-byte page's cell without an overflow page
    that each of a task's commits replaced. ``attempt_key`` is the attempt's key (``ql_run_attempt
    .attempt_key``); the attempt's own ``host_handle`` stays NULL and is read first
    (:data:`ql_core.db.sqlite_runs.HOST_HANDLE_A`)."""

    __tablename__ = "ql_attempt_host"
    __table_args__ = {"info": {"ql_dialects": ("sqlite",)}}

    attempt_key: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    host_handle: str = Field(max_length=512)


class Tally(QlTable, table=True):
    """Running totals (0007; SQLite only), so a round reads a count instead of counting history:
    ``log_bytes:<owner>`` (recorded sizes of that node's undeleted logs), kept exact by triggers on
    every write path, and ``runs``: the rows of ql_run whose ``run_key`` is at most ``counted_to``
    (0016: the newer ones are one key range counted when read, and folded in by history retention;
    no write per created run)."""

    __tablename__ = "ql_tally"
    __table_args__ = {"info": {"ql_dialects": ("sqlite",)}}

    name: str = Field(primary_key=True, max_length=80)
    value: int = Field(sa_column=Column(BigInteger, nullable=False))
    # (``counted_to BIGINT``, revision 0016, is one of SQLITE_ONLY_COLUMNS: a key of ql_run's rowid.)



def table_dialects(table: Any) -> tuple[str, ...] | None:
    """The dialects a table of :data:`METADATA` exists on (None: all); ``Table.info["ql_dialects"]``."""
    info = getattr(table, "info", None) or {}
    dialects = info.get("ql_dialects")
    return tuple(dialects) if dialects else None


#: SQLite's own integer keys (revisions 0011 and 0012, :mod:`ql_core.db.sqlite_events`,
#: :mod:`ql_core.db.sqlite_runs`; 0016: the run key ql_tally's ``runs`` counts up to): columns the SQLite
#: schema has and the declared one (PostgreSQL's) does not.
SQLITE_ONLY_COLUMNS = frozenset({("ql_run", "run_key"), ("ql_run_event", "event_key"),
                                 ("ql_run_attempt", "attempt_key"), ("ql_run", "status_order"),
                                 ("ql_log_artifact", "log_order"), ("ql_tally", "counted_to"),
                                 # 0019: the create's host handle, in its run's row (sqlite_runs.HOST_HANDLE_A)
                                 ("ql_run", "host_handle"),
                                 # 0020: a log whose attempt ended unsized is listed (sqlite_logs.LISTED)
                                 ("ql_log_artifact", "size_due"),
                                 # 0020: an attempt whose log ended empty (sqlite_logs.LOG_COLUMNS_A)
                                 ("ql_run_attempt", "log_empty")})
#: SQLite's own indexes on those columns (revision 0013: ``ix_ql_run_order`` on ``status_order``,
#: :mod:`ql_core.db.sqlite_runs`; 0015: ``ix_ql_log_order``, :mod:`ql_core.db.sqlite_logs`), which the
#: declared schema cannot name.
SQLITE_ONLY_INDEXES = frozenset({"ix_ql_run_order", "ix_ql_log_order"})
#: Foreign keys (table, referred table) SQLite's schema replaces by a trigger (0011: ``ql_event_key``).
NOT_ON_SQLITE_FOREIGN_KEYS = frozenset({("ql_run_event", "ql_run")})


def include_object(dialect_name: str):  # type: ignore[no-untyped-def]
    """An Alembic ``include_object`` hook that skips tables (and their indexes), and indexes, of other
    dialects, and SQLite's own key columns and the foreign key they replace."""

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if dialect_name == "sqlite":
            if type_ == "column" and reflected and (obj.table.name, name) in SQLITE_ONLY_COLUMNS:
                return False
            if type_ == "index" and reflected and name in SQLITE_ONLY_INDEXES:
                return False
            if type_ == "foreign_key_constraint" and \
                    (obj.table.name, obj.referred_table.name) in NOT_ON_SQLITE_FOREIGN_KEYS:
                return False
        table = obj if type_ == "table" else getattr(obj, "table", None)
        if reflected and compare_to is None and type_ == "table":
            return True
        if type_ == "index" and not reflected:  # an index declared for some dialects only (0009)
            index_dialects = table_dialects(obj)
            if index_dialects is not None and dialect_name not in index_dialects:
                return False
        dialects = table_dialects(table) if table is not None else None
        return dialects is None or dialect_name in dialects

    return include
