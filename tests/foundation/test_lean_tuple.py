"""``LeanNamedTuple`` behaves as ``typing.NamedTuple`` does, for everything ql's records use."""

from __future__ import annotations

import copy
import pickle
from typing import Any, NamedTuple

import pytest

from ql_core.lean_tuple import LeanNamedTuple


def _declared(base: Any, name: str) -> Any:
    """The same class statement on either base (named as the module's attribute, for pickle)."""

    class Record(base):  # type: ignore[misc, valid-type]
        """A record."""

        a: int
        b: str
        c: int = 3
        d: int | None = None

        @property
        def twice(self) -> int:
            return self.a * 2

        def label(self) -> str:
            return f"{self.a}:{self.b}"

    Record.__name__ = Record.__qualname__ = name
    return Record


Plain = _declared(NamedTuple, "Plain")
Lean = _declared(LeanNamedTuple, "Lean")


def _same(plain: object, lean: object) -> None:
    assert repr(lean).replace("Lean", "X") == repr(plain).replace("Plain", "X")


def test_a_lean_tuple_is_built_read_and_changed_as_a_named_tuple() -> None:
    for args, kwargs in (((1, "x"), {}), ((1, "x", 5, 6), {}), ((), {"a": 1, "b": "x"}), ((1,), {"b": "x", "d": 9}),
                         ((), {"d": 0, "c": None, "b": "y", "a": 2}), ((1, "x", 7), {"d": 8})):
        plain, lean = Plain(*args, **kwargs), Lean(*args, **kwargs)  # type: ignore[arg-type]
        _same(plain, lean)
        assert tuple(plain) == tuple(lean) == lean
        assert hash(lean) == hash(tuple(lean))
        assert lean._asdict() == plain._asdict()
        assert (lean.a, lean.b, lean.c, lean.d) == (plain.a, plain.b, plain.c, plain.d)
        assert lean.twice == plain.twice and lean.label() == plain.label()
        _same(plain._replace(b="y"), lean._replace(b="y"))
    assert Lean._fields == Plain._fields and Lean.__match_args__ == Plain.__match_args__
    assert Lean._field_defaults == Plain._field_defaults == {"c": 3, "d": None}
    assert Lean._make([1, "x", 3, None]) == Lean(1, "x")
    assert isinstance(Lean(1, "x"), tuple) and type(Lean) is type
    assert Lean.__doc__ == "A record." and Lean.__slots__ == ()
    assert list(Lean.__annotations__) == ["a", "b", "c", "d"]
    assert Lean.__module__ == __name__


def test_a_lean_tuple_copies_pickles_and_refuses_changes() -> None:
    lean = Lean(1, "x", d=4)
    assert pickle.loads(pickle.dumps(lean)) == lean and type(pickle.loads(pickle.dumps(lean))) is Lean
    assert copy.copy(lean) == lean and copy.deepcopy(lean) == lean
    assert not hasattr(lean, "__dict__")
    with pytest.raises(AttributeError):
        lean.a = 2  # type: ignore[misc]


@pytest.mark.parametrize(("args", "kwargs"), [((), {}), ((1,), {}), ((1, "x", 3, 4, 5), {}), ((1,), {"a": 2, "b": "x"}),
                                              ((1, "x"), {"z": 1}), ((), {"b": "x"}), ((), {"a": 1, "z": 2}),
                                              ((1, "x", 3), {"c": 4}), ((1,), {"c": 3}), ((1, "x", 3, 4), {"d": 5})])
def test_a_lean_tuple_refuses_what_a_named_tuple_refuses_with_the_same_words(args: tuple, kwargs: dict) -> None:
    with pytest.raises(TypeError) as plain:
        Plain(*args, **kwargs)
    with pytest.raises(TypeError) as lean:
        Lean(*args, **kwargs)
    assert str(lean.value).replace("Lean", "X") == str(plain.value).replace("Plain", "X")


def test_the_misuses_a_named_tuple_refuses_are_refused() -> None:
    with pytest.raises(TypeError, match="cannot follow default field"):
        class Late(LeanNamedTuple):  # noqa: F841 - refused at definition
            a: int = 1
            b: int
    with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):
        class Replacing(LeanNamedTuple):  # noqa: F841
            a: int

            def _replace(self) -> None:  # type: ignore[override]
                pass
    with pytest.raises(ValueError, match="unexpected field names"):
        Lean(1, "x")._replace(z=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="Expected 4 arguments, got 1"):
        Lean._make([1])
