"""Named tuples that compile nothing when their module is imported (issue 25 item 3: CPU of every ``ql``).

``class Record(typing.NamedTuple)`` makes its class with :func:`collections.namedtuple`, which
writes the class's ``__new__`` as source text and compiles it: ~80-110 µs of CPU per class, and a
one-shot ``ql run`` defines 21 of ql's own (~1.7 ms, ~2.4% of its CPU; ``ql status`` most of them
too). ``class Record(LeanNamedTuple)`` is written the same way — annotated fields, defaults, methods
and properties in the body — and gives a class that behaves as the ``NamedTuple`` would: a
``tuple`` subclass with ``__slots__ = ()``, the same ``_fields``, ``_field_defaults``,
``__match_args__``, ``_make``, ``_replace``, ``_asdict``, ``__getnewargs__`` (copy, pickle), the same
``repr``, field properties from the same C getter, ``__annotations__`` as written, and the same
``TypeError`` for a missing, repeated or unknown argument. Its ``__new__`` is one shared function
over the field names instead of a compiled one per class: building a record from a full row
(``Record(*row)``, the stores' way) is a length check and ``tuple.__new__``, as fast as before; one
from keywords is the defaults overlaid with the arguments, read in field order by one
:func:`operator.itemgetter` (a general binder in Python, which still words the errors, cost a host
~4% of its instructions per task: thirteen records built so each).

Type checkers see :class:`typing.NamedTuple` (the name is an alias for them), so a record's
constructor and fields are checked as before. Annotations are not evaluated here (strings stay
strings), and the class's metaclass is ``type``, as a named tuple's is.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from _collections import _tuplegetter  # the C field getter collections.namedtuple uses

__all__ = ["LeanNamedTuple"]

#: What a class body may not define (typing.NamedTuple refuses the same names).
_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                         "_make", "_replace", "_asdict", "_source"})
#: Taken from the class body as they are, not copied as attributes.
_SPECIAL = frozenset({"__module__", "__name__", "__annotations__", "__qualname__", "__doc__"})
_MISSING = object()


def _bind(name: str, fields: tuple[str, ...], index: dict[str, int], defaults: tuple[Any, ...],
          args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The values of ``Cls(*args, **kwargs)`` in field order, or the ``TypeError`` its
    ``namedtuple`` would raise (the slow path: keywords, defaults or a wrong count)."""
    n = len(fields)
    if len(args) > n:
        takes = f"{n + 1}" if not defaults else f"from {n - len(defaults) + 1} to {n + 1}"
        raise TypeError(f"{name}.__new__() takes {takes} positional arguments but {len(args) + 1} were given")
    values: list[Any] = [*args, *([_MISSING] * (n - len(args)))]
    for key, value in kwargs.items():
        i = index.get(key)
        if i is None:
            raise TypeError(f"{name}.__new__() got an unexpected keyword argument {key!r}")
        if i < len(args):
            raise TypeError(f"{name}.__new__() got multiple values for argument {key!r}")
        values[i] = value
    first_default = n - len(defaults)
    missing = []
    for i in range(len(args), n):
        if values[i] is _MISSING:
            if i >= first_default:
                values[i] = defaults[i - first_default]
            else:
                missing.append(repr(fields[i]))
    if missing:
        listed = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
        raise TypeError(f"{name}.__new__() missing {len(missing)} required positional "
                        f"argument{'s' if len(missing) > 1 else ''}: {listed}")
    return values


def _make_class(typename: str, ns: dict[str, Any]) -> type:
    annotations = ns.get("__annotations__", {})
    fields = tuple(annotations)
    defaulted = [f for f in fields if f in ns]
    if defaulted and fields[len(fields) - len(defaulted):] != tuple(defaulted):
        first = defaulted[0]
        after = [f for f in fields[fields.index(first):] if f not in ns]
        raise TypeError(f"Non-default namedtuple field {after[0]} cannot follow default field"
                        f"{'s' if len(defaulted) > 1 else ''} {', '.join(defaulted)}")
    defaults = tuple(ns[f] for f in defaulted)
    n = len(fields)
    index = {f: i for i, f in enumerate(fields)}
    tuple_new = tuple.__new__

    # With keywords (how records are usually built): the defaults overlaid with the positional values
    # and the keywords, read in field order by one C getter. A keyword that names no field after the
    # positional ones, or a required field not given (KeyError), goes to _bind, which words the error
    # namedtuple's would raise.
    after: dict[int, frozenset[str]] = {}  # the names a keyword may use after k values (made when asked)
    default_of = dict(zip(fields[n - len(defaults):], defaults))
    # itemgetter of one name gives the value, not a 1-tuple (and of none cannot be made)
    getter = itemgetter(*fields) if n > 1 else (lambda d: tuple(d[f] for f in fields))

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        k = len(args)
        if not kwargs:
            if k == n:
                return tuple_new(cls, args)
        elif k <= n and kwargs.keys() <= (after[k] if k in after else after.setdefault(k, frozenset(fields[k:]))):
            try:
                return tuple_new(cls, getter({**default_of, **dict(zip(fields, args)), **kwargs} if k
                                             else {**default_of, **kwargs}))
            except KeyError:
                pass
        return tuple_new(cls, _bind(typename, fields, index, defaults, args, kwargs))

    def _make(cls: type, iterable: Any) -> Any:
        result = tuple_new(cls, iterable)
        if len(result) != n:
            raise TypeError(f"Expected {n} arguments, got {len(result)}")
        return result

    def _replace(self: Any, /, **kwds: Any) -> Any:
        result = self._make(map(kwds.pop, fields, self))
        if kwds:
            raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
        return result

    repr_fmt = "(" + ", ".join(f"{f}=%r" for f in fields) + ")"

    def __repr__(self: Any) -> str:
        return self.__class__.__name__ + repr_fmt % self

    def _asdict(self: Any) -> dict[str, Any]:
        return dict(zip(self._fields, self))

    def __getnewargs__(self: Any) -> tuple[Any, ...]:
        return tuple(self)

    qualname = ns.get("__qualname__", typename)
    for method in (__new__, _make, _replace, __repr__, _asdict, __getnewargs__):
        method.__qualname__ = f"{qualname}.{method.__name__}"
    body: dict[str, Any] = {
        "__doc__": ns.get("__doc__") or f"{typename}({', '.join(fields)})",
        "__slots__": (),
        "_fields": fields,
        "_field_defaults": dict(zip(defaulted, defaults)),
        "__new__": __new__,
        "_make": classmethod(_make),
        "_replace": _replace,
        "__repr__": __repr__,
        "_asdict": _asdict,
        "__getnewargs__": __getnewargs__,
        "__match_args__": fields,
        "__annotations__": annotations,
        "__module__": ns["__module__"],
        "__qualname__": qualname,
    }
    for i, f in enumerate(fields):
        body[f] = _tuplegetter(i, f"Alias for field number {i}")
    for key, value in ns.items():  # the body's own methods and properties, as typing copies them
        if key in _PROHIBITED:
            raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
        if key not in _SPECIAL and key not in index:
            body[key] = value
    return type(typename, (tuple,), body)


class _LeanMeta(type):
    def __new__(mcls, typename: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:  # noqa: N804
        if not bases:
            return super().__new__(mcls, typename, bases, ns)  # LeanNamedTuple itself
        if len(bases) != 1 or not isinstance(bases[0], _LeanMeta):
            raise TypeError("a lean named tuple inherits from LeanNamedTuple only")
        return _make_class(typename, ns)


if TYPE_CHECKING:
    from typing import NamedTuple as LeanNamedTuple
else:
    class LeanNamedTuple(metaclass=_LeanMeta):
        """Base of a named tuple written as a ``typing.NamedTuple`` is (module docstring)."""
