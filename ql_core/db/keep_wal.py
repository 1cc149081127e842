"""No checkpoint when a connection closes: the WAL stays for the next process (issue 25 item 1).

SQLite checkpoints the whole WAL into the database file and deletes the WAL when the last
connection to a database closes. For a process per task (``ql run``, any short CLI writer) that is
every page the task changed written a second time, two more fsyncs, and a new WAL (and its synced
header) for the next process. ``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`` turns that off: the WAL stays
where it is — the state a crashed process leaves, which every opener handles — and is checkpointed
by a later writer's automatic checkpoint (``wal_autocheckpoint``: every 1000 pages), like any other
WAL. Nothing about durability changes: every commit is already in the synced WAL
(``synchronous=FULL``). The data dir's backup rule is unchanged: ``ql.db`` with its side files, as a
whole, with ql stopped (docs/design.md).

Python 3.12 has :meth:`sqlite3.Connection.setconfig`. On 3.11 the option is set through the C API
of the very ``libsqlite3`` the ``_sqlite3`` module uses (``ctypes``), on the connection's own
``sqlite3 *`` (the first field after the object header in CPython 3.11's ``pysqlite_Connection``),
checked before use: the handle must name this connection's file (``sqlite3_db_filename``) and the
option must read back as set. Anything unexpected — another interpreter, a debug build, a library
without the symbol — leaves SQLite's default (checkpoint on close): slower, never wrong.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Any

__all__ = ["keep_wal_on_close"]

#: ``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`` (sqlite3.h, SQLite 3.16+).
_NO_CKPT_ON_CLOSE = 1006
_api: Any = None


def keep_wal_on_close(conn: sqlite3.Connection, path: str) -> bool:
    """Turn off the checkpoint on close for ``conn`` (a connection to the file ``path``); True if set."""
    setconfig = getattr(conn, "setconfig", None)
    if setconfig is not None:  # Python 3.12+
        setconfig(getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", _NO_CKPT_ON_CLOSE), True)
        return True
    try:
        return _set_through_c_api(conn, path)
    except (OSError, AttributeError, ValueError):
        return False


def _library() -> Any:
    global _api
    if _api is None:
        import ctypes

        import _sqlite3  # the extension module: dlsym on it finds the libsqlite3 it is linked with

        lib = ctypes.CDLL(_sqlite3.__file__)
        lib.sqlite3_db_filename.restype = ctypes.c_char_p
        lib.sqlite3_db_filename.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        _api = (ctypes, lib)
    return _api


def _set_through_c_api(conn: sqlite3.Connection, path: str) -> bool:
    # Only the layout this code knows: CPython 3.11, a release build (no trace-refs header fields).
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11) or hasattr(sys, "gettotalrefcount"):
        return False
    ctypes, lib = _library()
    header = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)  # ob_refcnt, ob_type
    db = ctypes.c_void_p.from_address(id(conn) + header).value
    if not db:
        return False
    name = lib.sqlite3_db_filename(ctypes.c_void_p(db), b"main")
    if name is None or os.path.realpath(os.fsdecode(name)) != os.path.realpath(path):
        return False
    done = ctypes.c_int(-1)
    rc = lib.sqlite3_db_config(ctypes.c_void_p(db), ctypes.c_int(_NO_CKPT_ON_CLOSE), ctypes.c_int(1),
                               ctypes.byref(done))
    return rc == 0 and done.value == 1
