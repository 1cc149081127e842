"""Internal value classes built without generating code (issue 25 item 3: CPU of ``ql run``).

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and frozen
``__setattr__``/``__delattr__`` as source text and compiles it (``exec``) when its module is
imported: 0.4-1 ms of CPU per class, and a one-shot ``ql run`` imports about twenty of them. A
:func:`value_class` writes its ``__init__`` itself (its code is in the module's bytecode cache) and
gets the other methods here: shared functions over the field names, so defining the class costs
microseconds. They behave as ``@dataclass(frozen=True, slots=True)`` (or ``frozen=False``) does:
the same ``repr`` text, equality only with the same class, field by field, the same hash,
:class:`dataclasses.FrozenInstanceError` on assignment, and copies and pickles that round-trip.

For values whose users only build them and read their fields: a type that callers (embedders,
plugins, the docs' tutorials) change with ``dataclasses.replace`` or list with ``fields``
(``Config``, ``SpawnRequest``, ``TaskSpec``, ``ProcessHandle``) or that embedders receive and may
extend (``Submission``, mutable) stays a dataclass, made with :func:`lean_dataclass`: the
``@dataclass`` machinery with nothing generated (``dataclasses.fields``, ``replace``, ``asdict``,
``is_dataclass`` work on it as before), the class writing its ``__init__`` and getting the other
methods here.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, fields
from operator import attrgetter
from typing import Any, Callable, TypeVar

__all__ = ["FACTORY", "lean_dataclass", "value_class"]

C = TypeVar("C", bound=type)


def value_class(*, frozen: bool = True, hidden: tuple[str, ...] = ()) -> Callable[[C], C]:
    """Class decorator: the fields are ``cls.__slots__``, in order (the ``__init__`` arguments'
    order). ``frozen``: assignment and deletion raise ``FrozenInstanceError`` (``__init__`` then
    sets fields with ``object.__setattr__``, as a frozen dataclass's does) and instances hash by
    their fields; otherwise they are unhashable, as a mutable dataclass with ``eq``. ``hidden``:
    fields left out of ``repr`` (a dataclass's ``field(repr=False)``), e.g. a token."""

    def decorate(cls: C) -> C:
        _install(cls, tuple(cls.__dict__["__slots__"]), hidden, frozen, slotted=True)
        return cls

    return decorate


class _Factory:
    """The default of an ``__init__`` argument whose field has a ``default_factory`` (a generated
    dataclass ``__init__`` shows such a default as ``<factory>`` too)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


#: See :class:`_Factory`: ``__init__`` replaces it with a new value from the factory.
FACTORY: Any = _Factory()


def lean_dataclass(*, frozen: bool = False, slots: bool = False) -> Callable[[C], C]:
    """As ``@dataclass(frozen=frozen, slots=slots)`` for a class that writes its own ``__init__``
    (same arguments, same defaults, a ``default_factory`` field's default :data:`FACTORY`):
    ``@dataclass`` with nothing to generate costs ~0.2 ms of CPU instead of ~1-1.8 ms per class
    (issue 25 item 3), and it is still a dataclass to ``fields``, ``replace``, ``asdict`` and to a
    dataclass that subclasses it. ``repr`` (``field(repr=False)`` honoured), equality, hash and
    frozen assignment are :func:`value_class`'s, which behave as the generated ones."""

    def decorate(cls: C) -> C:
        assert "__init__" in cls.__dict__, f"{cls.__name__}: a lean dataclass writes its __init__"
        made = dataclass(init=False, repr=False, eq=False, slots=slots)(cls)
        names = tuple(f.name for f in fields(made))
        _install(made, names, tuple(f.name for f in fields(made) if not f.repr), frozen, slotted=slots)
        # What the class is, for introspection and for the checks a subclassing dataclass makes
        # (a non-frozen dataclass cannot extend a frozen one).
        params = made.__dataclass_params__  # type: ignore[attr-defined]
        params.init = params.repr = params.eq = True
        params.frozen = frozen
        return made

    return decorate


def _install(cls: type, names: tuple[str, ...], hidden: tuple[str, ...] | frozenset[str], frozen: bool, *,
             slotted: bool) -> None:
    """Give ``cls`` the repr, eq, match args (and when frozen: hash, frozen setattr/delattr, and
    for a slotted class the copy/pickle state methods) of a dataclass with fields ``names``."""
    shown = tuple(name for name in names if name not in hidden)
    assert len(shown) + len(hidden) == len(names), f"{cls.__name__}: hidden names a field it lacks"
    # The fields as one tuple (attrgetter of one name gives the value itself): compared and
    # hashed as a dataclass's generated methods compare and hash theirs.
    values = attrgetter(*names) if len(names) > 1 else (lambda obj, _get=attrgetter(names[0]): (_get(obj),))

    def __repr__(self: Any) -> str:
        return (f"{type(self).__qualname__}("
                + ", ".join(f"{name}={getattr(self, name)!r}" for name in shown) + ")")

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    cls.__repr__ = __repr__  # type: ignore[assignment]
    cls.__eq__ = __eq__  # type: ignore[assignment]
    cls.__match_args__ = names  # type: ignore[attr-defined]
    if not frozen:
        cls.__hash__ = None  # type: ignore[assignment]
        return

    def __hash__(self: Any) -> int:
        return hash(values(self))

    def __setattr__(self: Any, name: str, value: object) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    cls.__hash__ = __hash__  # type: ignore[assignment]
    cls.__setattr__ = __setattr__  # type: ignore[assignment]
    cls.__delattr__ = __delattr__  # type: ignore[assignment]
    if not slotted:  # pickle and copy restore an instance's __dict__ without setattr
        return

    # pickle and copy restore a slotted instance through setattr, which a frozen class refuses:
    # a frozen slotted dataclass has these two for the same reason.
    def __getstate__(self: Any) -> list[object]:
        return list(values(self))

    def __setstate__(self: Any, state: list[object]) -> None:
        for name, value in zip(names, state):
            object.__setattr__(self, name, value)

    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]

