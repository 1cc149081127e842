"""Typed array parameters for the control database's batched calls, dumped in one pass.

A round of a worker's reports (:mod:`.round_call`) sends about twenty small arrays: the lease
fences' columns, the completions' columns. psycopg's generic list dumper finds out each list's
element type by looking at its elements, builds a dumper for that, and dumps element by element
through it: measured, that was most of the Python a round's call costs the worker's control loop.
The batched statements cast every array anyway (``%b::bigint[]``), so the caller knows the type:
these lists say it, and their dumpers write PostgreSQL's binary array format (``array_send``'s)
directly. Same values on the wire, same parameter types every call (psycopg's int lists vary between
int2[], int4[] and int8[] by value, so the prepared statement was keyed on values too).

:func:`register` installs the dumpers on a connection (:class:`~.control_db.ControlDB` does on the
connections it opens). On any other connection the lists are plain lists to psycopg: its generic
dumper sends them, only slower.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Any, Callable, ClassVar, Sequence

__all__ = ["PgArray", "TextArray", "BigintArray", "IntegerArray", "BooleanArray", "array_columns", "dump_array",
           "register", "FENCE_TYPES", "RUNNING_TYPES", "COMPLETE_TYPES"]


class PgArray(list):  # type: ignore[type-arg]
    """A list sent as a one-dimensional PostgreSQL array of ``elem_oid`` (None: NULL)."""

    __slots__ = ()
    elem_oid: ClassVar[int] = 0
    array_oid: ClassVar[int] = 0


class TextArray(PgArray):
    __slots__ = ()
    elem_oid, array_oid = 25, 1009


class BigintArray(PgArray):
    __slots__ = ()
    elem_oid, array_oid = 20, 1016


class IntegerArray(PgArray):
    __slots__ = ()
    elem_oid, array_oid = 23, 1007


class BooleanArray(PgArray):
    __slots__ = ()
    elem_oid, array_oid = 16, 1000


#: A lease fence's columns (:meth:`~.results.LeaseFence.params`), as ``FENCE_ARRAYS`` casts them.
FENCE_TYPES: tuple[type[PgArray], ...] = (TextArray, BigintArray, TextArray, TextArray, BigintArray, TextArray)
#: ``running`` calls: the fence, then the process start.
RUNNING_TYPES: tuple[type[PgArray], ...] = (*FENCE_TYPES, BigintArray)
#: ``complete`` calls: the fence, then exit code, start, finish, signalled and digest.
COMPLETE_TYPES: tuple[type[PgArray], ...] = (*FENCE_TYPES, IntegerArray, BigintArray, BigintArray, BooleanArray,
                                             TextArray)


def array_columns(rows: Sequence[Sequence[Any]], types: Sequence[type[PgArray]]) -> list[PgArray]:
    """The calls' arguments, one typed array per argument (the arrays of a batched function)."""
    if not rows:
        return [t() for t in types]
    columns = list(zip(*rows))
    if len(columns) != len(types):
        raise ValueError(f"{len(types)} array types for {len(columns)} arguments")
    return [t(column) for t, column in zip(types, columns)]


_HEAD = struct.Struct(">iiiii")  # ndim, has-null flag, element oid, length, lower bound
_EMPTY = struct.Struct(">iii")  # ndim 0, no flag, element oid: no dimensions
_LEN = struct.Struct(">i")
_NULL = _LEN.pack(-1)
_INT8 = struct.Struct(">iq")  # each element: its length, then its bytes
_INT4 = struct.Struct(">ii")
_TRUE, _FALSE = struct.pack(">ib", 1, 1), struct.pack(">ib", 1, 0)


def _text(v: str, encoding: str) -> bytes:
    b = v.encode(encoding)
    return _LEN.pack(len(b)) + b


#: Per array type: the one Python type its elements must have (exactly: a bool is not an int here),
#: and the binary form of one element (its length, then its bytes; struct.error when out of range).
_ELEMENTS: dict[type[PgArray], tuple[type, Callable[[Any, str], bytes]]] = {
    TextArray: (str, _text),
    BigintArray: (int, lambda v, _e: _INT8.pack(8, v)),
    IntegerArray: (int, lambda v, _e: _INT4.pack(4, v)),
    BooleanArray: (bool, lambda v, _e: _TRUE if v else _FALSE),
}


def _elements(obj: PgArray, encoding: str) -> list[bytes]:
    kind, pack = _ELEMENTS[type(obj)]  # KeyError: not one of these four
    out = []
    for v in obj:
        if v is None:
            out.append(_NULL)
        elif type(v) is kind:
            out.append(pack(v, encoding))
        else:
            raise TypeError(f"not a {kind.__name__}")
    return out


def dump_array(obj: PgArray, encoding: str = "utf-8") -> bytes:
    """PostgreSQL's binary form of the array (what ``array_recv`` reads). Raises TypeError or
    struct.error for an element of another type (never naming its value)."""
    if not obj:
        return _EMPTY.pack(0, 0, obj.elem_oid)
    elements = _elements(obj, encoding)
    has_null = 1 if _NULL in elements else 0
    return _HEAD.pack(1, has_null, obj.elem_oid, len(obj), 1) + b"".join(elements)


@lru_cache(maxsize=None)
def _dumpers() -> dict[type[PgArray], type]:
    # psycopg is imported only here, when a connection is made (as .control_db does).
    import psycopg
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    def make(cls: type[PgArray]) -> type:
        class ArrayDumper(Dumper):
            format = Format.BINARY
            oid = cls.array_oid

            def __init__(self, kind: type, context: Any = None):
                super().__init__(kind, context)
                conn = self.connection
                self._encoding = conn.info.encoding if conn is not None else "utf-8"

            def dump(self, obj: Any) -> bytes:
                try:
                    return dump_array(obj, self._encoding)
                except (TypeError, KeyError, struct.error, UnicodeError):
                    # As psycopg's own dumpers fail: its DataError, the type only (never the value).
                    raise psycopg.DataError(f"cannot dump {cls.__name__}: element of another type") from None

        ArrayDumper.__name__ = f"{cls.__name__}Dumper"
        return ArrayDumper

    return {cls: make(cls) for cls in (TextArray, BigintArray, IntegerArray, BooleanArray)}


def register(conn: Any) -> None:
    """Send the typed arrays of this connection with their own dumpers."""
    for cls, dumper in _dumpers().items():
        conn.adapters.register_dumper(cls, dumper)
