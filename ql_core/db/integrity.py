"""Read-only health checks of a SQLite run database for ``ql doctor``.

The file is opened through a ``mode=ro`` URI with ``PRAGMA query_only``: the
check can never write, create or migrate anything. SQLite's own
``integrity_check`` (every page, every index entry) runs on files up to
:data:`FULL_CHECK_MAX_BYTES`; larger ones get ``quick_check`` (every page, no
index-to-table cross check), which is linear in the file size.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

__all__ = ["SqliteHealth", "check_sqlite", "FULL_CHECK_MAX_BYTES"]

#: Up to this size the full ``integrity_check`` runs; above it ``quick_check``.
FULL_CHECK_MAX_BYTES: Final = 256 * 1024 * 1024
#: Problems reported per check (SQLite lists every bad page; the first few say enough).
_MAX_ROWS: Final = 5
_BUSY_TIMEOUT_S: Final = 5.0


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
        wal = Path(f"{path}-wal")
        if "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise
        if wal.exists() and wal.stat().st_size > 0:
            raise sqlite3.OperationalError(f"{exc} (the directory is not writable and {wal.name} holds "
                                           f"changes not yet merged: check as the data dir's owner)") from None
        conn, rows = _run_check(path, check, immutable=True)
    try:
        ok = rows == ["ok"]
        revision = None
        if ok:
            try:
                found = conn.execute("SELECT version_num FROM alembic_version").fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" not in str(exc):
                    raise
                found = []
            revision = str(found[0][0]) if len(found) == 1 else None
    finally:
        conn.close()
    return SqliteHealth(ok=ok, check=check, problems=tuple(rows) if not ok else (), revision=revision)


def _run_check(path: Path, check: str, *, immutable: bool) -> tuple[sqlite3.Connection, list[str]]:
    uri = f"file:{quote(os.fsencode(os.path.abspath(path)))}?mode=ro"  # bytes: a non-UTF-8 name too + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA trusted_schema=OFF")
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA {check}({_MAX_ROWS})").fetchall()]
    except BaseException:
        conn.close()
        raise
    return conn, rows
