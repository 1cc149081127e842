"""Look into (and, to forge states, change) a runtime's real SQLite run database from a test.

Tests read the same file the runtime writes, with stdlib ``sqlite3`` on a
separate connection — nothing is mocked. Rows come back as :class:`Row`
(a dict that also allows ``row.column``). ``launcher(row)`` decodes the local
executor's handle (tests of that executor may know its format; core may not).
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from typing import Any, Iterable

__all__ = ["Row", "db_path", "row", "rows", "count", "update", "insert", "launcher", "CommitLog", "is_log_size_commit"]

_KEYS = {"ql_run": "id", "ql_run_attempt": "id", "ql_log_artifact": "id", "ql_receipt_journal": "attempt_id",
         "ql_cancel_dispatch": "run_id"}


class Row(dict):
    """A row as a dict whose columns are also attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def db_path(rt_or_url: Any) -> str:
    url = rt_or_url if isinstance(rt_or_url, str) else rt_or_url.config.database_url
    assert url.startswith("sqlite:///"), url
    return url[len("sqlite:///"):]


def _connect(rt: Any) -> sqlite3.Connection:
    conn = sqlite3.connect(db_path(rt), timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def rows(rt: Any, sql: str, params: Iterable[Any] = ()) -> list[Row]:
    with closing(_connect(rt)) as conn:
        return [Row(dict(r)) for r in conn.execute(sql, tuple(params))]


def row(rt: Any, table: str, key: str) -> Row | None:
    found = rows(rt, f"SELECT * FROM {table} WHERE {_KEYS[table]} = ?", (key,))
    return found[0] if found else None


def count(rt: Any, table: str, where: str = "1=1", params: Iterable[Any] = ()) -> int:
    with closing(_connect(rt)) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}", tuple(params)).fetchone()[0])


def update(rt: Any, table: str, key: str, **values: Any) -> int:
    """UPDATE one row by its key; returns the number of rows changed."""
    sets = ", ".join(f"{c} = ?" for c in values)
    with closing(_connect(rt)) as conn:
        return conn.execute(f"UPDATE {table} SET {sets} WHERE {_KEYS[table]} = ?",
                            (*values.values(), key)).rowcount


def insert(rt: Any, table: str, records: list[dict[str, Any]]) -> None:
    """INSERT many rows in one transaction. An event or attempt gets its key from its run as the store
    files it (``ql_core.db.sqlite_events``: ``event_key = run_key << 20 | seq``; ``ql_core.db.sqlite_runs``:
    ``attempt_key = run_key << 8 | attempt_no``)."""
    if not records:
        return
    columns = list(records[0])
    marks = ", ".join("?" * len(columns))
    values = f"VALUES ({marks})"
    if table == "ql_run_event" and "event_key" not in columns:
        from ql_core.db.sqlite_events import EVENT_KEY_BITS

        values = (f"SELECT (SELECT run_key FROM ql_run WHERE id = v.run_id) << {EVENT_KEY_BITS} | v.seq, v.* FROM "
                  f"(SELECT {', '.join(f'? AS {c}' for c in columns)}) v")
        columns = ["event_key", *columns]
    if table == "ql_run_attempt" and "attempt_key" not in columns:
        from ql_core.db.sqlite_runs import ATTEMPT_KEY_BITS

        values = (f"SELECT (SELECT run_key FROM ql_run WHERE id = v.run_id) << {ATTEMPT_KEY_BITS} | v.attempt_no, v.* "
                  f"FROM (SELECT {', '.join(f'? AS {c}' for c in columns)}) v")
        columns = ["attempt_key", *columns]
    with closing(_connect(rt)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) {values}",
                         [tuple(r[c] for c in columns if c not in ("event_key", "attempt_key")) for r in records])
        conn.execute("COMMIT")


def launcher(attempt: Any) -> dict[str, Any] | None:
    """The local executor's handle of an attempt row (boot_id, pid, pgid, start_time), or None."""
    handle = attempt["handle"] if attempt is not None else None
    return json.loads(handle) if handle else None


def local_handle(handle: dict[str, Any]) -> str:
    """The stored (JSON) form of a local executor handle dict."""
    return json.dumps(handle, separators=(",", ":"), sort_keys=True)


_WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE)\b(?:\s+OR\s+\w+)?(?:\s+INTO|\s+FROM)?\s+\"?(\w+)", re.I)


def is_log_size_commit(statements: list[str]) -> bool:
    """A commit that only records log sizes (``UPDATE ql_log_artifact``)."""
    return bool(statements) and set(statements) == {"UPDATE ql_log_artifact"}


class CommitLog:
    """Every COMMIT of a runtime's edge-sqlite store, with the data-changing statements in it.

    Uses the store's statement trace (``sqlite3`` trace callbacks on its real
    connections); nothing is intercepted or changed.
    """

    def __init__(self, rt: Any) -> None:
        self._store = rt.journal
        self.commits: list[list[str]] = []
        self._open: dict[int, list[str]] = {}
        self._store.trace(self._on_statement)

    def close(self) -> None:
        self._store.trace(None)

    def _on_statement(self, conn: int, statement: str) -> None:
        head = statement.lstrip().upper()
        if head.startswith("BEGIN"):
            self._open[conn] = []
        elif head.startswith("COMMIT"):
            self.commits.append(self._open.pop(conn, []))
        elif head.startswith("ROLLBACK"):
            self._open.pop(conn, None)
        else:
            match = _WRITE.match(statement)
            if match:
                self._open.setdefault(conn, []).append(f"{match.group(1).upper()} {match.group(2)}")

    @property
    def writes(self) -> list[list[str]]:
        return [c for c in self.commits if c]

    @property
    def durable_writes(self) -> list[list[str]]:
        """The write commits of a task's life that count: without the log's final size, which follows
        the terminal commit unsynced (a lost size is re-read from the file by the sizing queue)."""
        return [c for c in self.writes if not is_log_size_commit(c)]

    @property
    def reads(self) -> int:
        return sum(1 for c in self.commits if not c)
