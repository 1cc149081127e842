"""Read-only health checks of a SQLite run database for ``ql doctor``, and what a SQLite error means.

The file is opened through a ``mode=ro`` URI with ``PRAGMA query_only``: the
check can never write, create or migrate anything. SQLite's own
``integrity_check`` (every page, every index entry) runs on files up to
:data:`FULL_CHECK_MAX_BYTES`; larger ones get ``quick_check`` (every page, no
index-to-table cross check), which is linear in the file size.

:func:`explain_sqlite_error` turns the SQLite errors whose cause is the file or the disk (damage,
a full or read-only file system, an I/O error) into the one line every command prints: SQLite's
own words ("disk I/O error" for a full tmpfs) name neither the cause nor the fix, and a text
column that is not UTF-8 would otherwise print the undecodable bytes themselves.
:func:`open_frozen` reads a database on a read-only file system (``ql list`` there just reads).
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

__all__ = ["SqliteHealth", "check_sqlite", "FULL_CHECK_MAX_BYTES", "TEXT_CHECK_MAX_BYTES", "explain_sqlite_error", "on_read_only_fs",
           "open_frozen"]

#: Up to this size the full ``integrity_check`` runs; above it ``quick_check``.
FULL_CHECK_MAX_BYTES: Final = 256 * 1024 * 1024
#: Problems reported per check (SQLite lists every bad page; the first few say enough).
_MAX_ROWS: Final = 5
_BUSY_TIMEOUT_S: Final = 5.0
#: Up to this size every row's text is also read once (a text column that is not UTF-8 passes
#: SQLite's checks); Python decodes it, about twice the time of the integrity check itself.
TEXT_CHECK_MAX_BYTES: Final = 64 * 1024 * 1024
#: Below this many free bytes an I/O error of SQLite's is the full file system: SQLite needs room for
#: its write-ahead log and shared-memory index (32 KiB each to start) and reports a full tmpfs as
#: SQLITE_IOERR_SHMSIZE, "disk I/O error".
FULL_BELOW_BYTES: Final = 1024 * 1024
_DAMAGE = ("malformed", "not a database", "corrupt", "could not decode to utf-8")
_DECODE_COLUMN = re.compile(r"column '([A-Za-z0-9_]{1,64})'")


@dataclass(frozen=True, slots=True)
class SqliteHealth:
    """What the check found: ``ok``, the check that ran, its first problems, the schema revision."""

    ok: bool
    check: str
    problems: tuple[str, ...]
    revision: str | None


def check_sqlite(path: str | os.PathLike[str]) -> SqliteHealth:
    """Run SQLite's integrity (or quick) check on the database at ``path``, read-only.

    Raises :class:`sqlite3.Error` when the file cannot be opened or read at all (the caller
    reports that as a failed check, with the message).
    """
    path = Path(path)
    size = os.stat(path).st_size
    check = "integrity_check" if size <= FULL_CHECK_MAX_BYTES else "quick_check"
    try:
        conn, rows = _run_check(path, check, immutable=False)
    except sqlite3.OperationalError as exc:
        # A WAL database in a directory we may not write to: SQLite cannot create the shared-memory
        # file a reader needs. With no WAL content left to merge, the file alone is the database.
        # (open_frozen refuses when the write-ahead log still holds changes.)
        if "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise
        conn, rows = _run_check(path, check, immutable=True)
    try:
        if rows == ["ok"] and size <= TEXT_CHECK_MAX_BYTES:
            # SQLite's check sees pages and indexes, not text: a column whose bytes are not UTF-8 (a
            # damaged row) passes it, yet every command reading the row fails. Read every row once.
            rows = _undecodable_text(conn) or rows
        ok = rows == ["ok"]
        revision = None
        if ok:
            try:
                found = conn.execute("SELECT version_num FROM alembic_version").fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" not in str(exc):
                    raise
                found = []
            revision = ",".join(sorted(str(r[0]) for r in found)) or None  # one row per branch head
    finally:
        conn.close()
    return SqliteHealth(ok=ok, check=check, problems=tuple(rows) if not ok else (), revision=revision)


def _undecodable_text(conn: sqlite3.Connection) -> list[str]:
    """Problems of the form "table T: a text column holds bytes that are not UTF-8" (empty: none)."""
    problems: list[str] = []
    tables = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                               "AND name NOT LIKE 'sqlite_%' ORDER BY name")]

    def quote_name(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    for table in tables:
        # Only the columns that hold text: nothing else is decoded.
        text = [str(r[1]) for r in conn.execute(f"PRAGMA table_info({quote_name(table)})")
                if any(t in str(r[2]).upper() for t in ("CHAR", "TEXT", "CLOB"))]
        if not text:
            continue
        try:
            cursor = conn.execute(f"SELECT {', '.join(map(quote_name, text))} FROM {quote_name(table)}")
            while cursor.fetchmany(512):
                pass
        except sqlite3.OperationalError as exc:
            if "could not decode to utf-8" not in str(exc).lower():
                raise
            column = _DECODE_COLUMN.search(str(exc))
            problems.append(f"table {table}: column {column.group(1) if column else '?'} holds bytes that are "
                            f"not UTF-8")
            if len(problems) >= _MAX_ROWS:
                break
    return problems


def _run_check(path: Path, check: str, *, immutable: bool) -> tuple[sqlite3.Connection, list[str]]:
    if immutable:
        conn = open_frozen(path)
    else:
        # Quoted as bytes: a data dir whose name is not UTF-8 is a path like any other.
        conn = sqlite3.connect(f"file:{quote(os.fsencode(os.path.abspath(path)))}?mode=ro", uri=True,
                               timeout=_BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA trusted_schema=OFF")
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA {check}({_MAX_ROWS})").fetchall()]
    except BaseException:
        conn.close()
        raise
    return conn, rows


def on_read_only_fs(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` (a directory) is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _free_bytes(directory: str | os.PathLike[str]) -> int | None:
    """Bytes (or, when inodes ran out, 0) an unprivileged writer may still use; None: unknown."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    if st.f_files and not st.f_favail:
        return 0
    return st.f_bavail * st.f_frsize


def explain_sqlite_error(exc: BaseException, path: str | os.PathLike[str] | None) -> str | None:
    """One line naming the cause and the fix for a SQLite error caused by the database file or its
    file system — damaged, on a full or read-only file system, an I/O error — or None for any other.

    ``path``: the database file (None: unknown; the line then says "the run database"). Never
    quotes the row data SQLite or Python put in the message (a column that is not UTF-8 is named,
    its bytes are not).
    """
    if not isinstance(exc, sqlite3.Error):
        return None
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    text = " ".join(str(exc).split())
    low = text.lower()
    where = f"the run database {os.fsdecode(path)}" if path is not None else "the run database"
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or any(d in low for d in _DAMAGE):
        if "could not decode to utf-8" in low:
            column = _DECODE_COLUMN.search(text)
            detail = (f"column {column.group(1)!r} holds bytes that are not UTF-8" if column
                      else "a text column holds bytes that are not UTF-8")
        else:
            detail = text[:200]
        return (f"{where} is damaged ({detail}); stop ql, move it aside, restore it from a backup "
                f"(see docs/recovery.md)")
    if not name.startswith(("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY")):
        return None
    directory = os.path.dirname(os.path.abspath(path)) if path is not None else None
    if directory is not None and on_read_only_fs(directory):
        return (f"{where} is on a read-only file system ({text}); commands that write (ql run, ql reconcile, "
                f"ql supervise) need it writable: remount it read-write, or point --data-dir / QL_DATA_DIR at a "
                f"writable directory")
    free = _free_bytes(directory) if directory is not None else None
    if name.startswith("SQLITE_FULL") or (name.startswith("SQLITE_IOERR") and free is not None
                                          and free < FULL_BELOW_BYTES):
        room = f"{free} bytes free" if free is not None else "full"
        return (f"the file system holding {where} is full ({room}); free some space there or move the data dir "
                f"to a larger file system, then retry")
    if name.startswith("SQLITE_IOERR"):
        return (f"{where}: the device reported an I/O error ({name}); check the disk (dmesg) and the file "
                f"system before retrying; `ql doctor` checks the database")
    return None


def open_frozen(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to a WAL database whose directory cannot be written (a read-only
    file system, a directory of another user): SQLite cannot create the shared-memory file a
    reader needs, so the file is opened ``immutable`` — safe only while nothing can change it,
    which is why a write-ahead log still holding changes is refused instead of silently ignored.
    Raises :class:`sqlite3.OperationalError`."""
    wal = Path(f"{os.fsdecode(path)}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        refused = sqlite3.OperationalError(f"unable to open database file read-only: {wal.name} holds changes "
                                           f"not yet merged and the directory cannot be written")
        refused.sqlite_errorname = "SQLITE_CANTOPEN"  # type: ignore[attr-defined]  # as SQLite would say
        raise refused
    uri = f"file:{quote(os.fsencode(os.path.abspath(path)))}?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA trusted_schema=OFF")
    except BaseException:
        conn.close()
        raise
    return conn
