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
of the very ``libsqlite3`` the ``_sqlite3`` module uses (``_ctypes``, ctypes' C core), on the connection's own
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
        # ctypes' C core, not the ctypes package: importing the package (its ~40 classes, its size
        # checks) is ~1.1 ms of every writer's start-up, for the three C types used here.
        import _ctypes

        import _sqlite3  # the extension module: dlsym on it finds the libsqlite3 it is linked with

        class VoidP(_ctypes._SimpleCData):  # ctypes.c_void_p
            _type_ = "P"

        class Int(_ctypes._SimpleCData):  # ctypes.c_int
            _type_ = "i"

        class CharP(_ctypes._SimpleCData):  # ctypes.c_char_p
            _type_ = "z"

        class Library:  # what a CFuncPtr looks its symbol up in (a ctypes.CDLL's _handle)
            _handle = _ctypes.dlopen(_sqlite3.__file__, os.RTLD_LOCAL)  # as ctypes.CDLL (it adds RTLD_NOW)

        def function(name: str, restype: type, argtypes: tuple[type, ...] | None) -> Any:
            class Function(_ctypes.CFuncPtr):  # as a CDLL's attribute: cdecl, errno untouched
                _flags_ = _ctypes.FUNCFLAG_CDECL
                _restype_ = restype

            found = Function((name, Library))
            if argtypes is not None:
                found.argtypes = argtypes
            return found

        _api = (_ctypes, VoidP, Int,
                function("sqlite3_db_filename", CharP, (VoidP, CharP)),
                function("sqlite3_db_config", Int, None))  # variadic: arguments as given (as ctypes does)
    return _api


def _set_through_c_api(conn: sqlite3.Connection, path: str) -> bool:
    # Only the layout this code knows: CPython 3.11, a release build (no trace-refs header fields).
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11) or hasattr(sys, "gettotalrefcount"):
        return False
    _ctypes, VoidP, Int, db_filename, db_config = _library()
    header = 2 * _ctypes.sizeof(VoidP)  # ob_refcnt (Py_ssize_t: pointer-sized), ob_type
    db = VoidP.from_address(id(conn) + header).value
    if not db:
        return False
    name = db_filename(VoidP(db), b"main")
    if name is None or os.path.realpath(os.fsdecode(name)) != os.path.realpath(path):
        return False
    done = Int(-1)
    rc = db_config(VoidP(db), Int(_NO_CKPT_ON_CLOSE), Int(1), _ctypes.byref(done))
    return rc == 0 and done.value == 1
