"""Value classes and lean dataclasses (``ql_core.value_class``) behave as the dataclasses they replaced.

Each class is compared with a dataclass twin built from its ``__init__`` signature with the options
the original ``@dataclass`` had: the same ``repr`` (the same fields hidden: a token, a command, an
environment never show), equality, hash, frozen assignment and deletion, ``__match_args__``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pathlib
import pickle

import pytest

from ql_core.completion import CompletionOutcome, CompletionResult
from ql_core.config import Config
from ql_core.consumer import ConsumeOutcome, ConsumeResult
from ql_core.outcome import Verdict
from ql_core.profiles import PROFILES, Profile
from ql_core.ports.executor import SpawnedTask, SpawnRequest
from ql_core.ports.journal import QueuedRun, TaskSpec
from ql_core.ports.receipt_store import ReadStatus, ReceiptRead
from ql_core.receipts.codec import Receipt, ReceiptRejection, RejectReason
from ql_core.submit import RunIds, Submission
from ql_core.value_class import value_class
from ql_executors.local_process.containment import Containment
from ql_executors.local_process.identity import ProcessHandle
from ql_executors.local_process.identity_source import ProcStat

#: class -> (frozen, fields hidden from repr, sample positional values (one per field)).
CASES: dict[type, tuple[bool, tuple[str, ...], tuple[object, ...]]] = {
    Verdict: (True, (), ("failed", "timeout", "user")),
    CompletionResult: (True, (), (CompletionOutcome.APPLIED, "succeeded", None, True, (1, 2), None)),
    ConsumeResult: (True, (), (ConsumeOutcome.QUARANTINED, "failed", "why", True)),
    RunIds: (True, ("token",), ("r", "a", "l", "SECRET-TOKEN")),
    QueuedRun: (True, (), ("r", "n", 5, TaskSpec(("x",)), 7, 2)),
    SpawnedTask: (False, ("live",), ("handle", object())),
    Receipt: (True, (), (1, "r", "a", 2, "tok", 3, 4, 0)),
    ReceiptRejection: (True, (), (RejectReason.BOM, "detail")),
    ReceiptRead: (True, (), (ReadStatus.VALID, None, None)),
    ProcStat: (True, (), ("R", 1, 2, 3, b"comm", 9)),
    Containment: (True, (), ("/sys/fs/cgroup/x", "")),
    Profile: (True, (), tuple(getattr(PROFILES["edge"], name) for name in Profile.__slots__)),
}


def _twin(cls: type, frozen: bool, hidden: tuple[str, ...]) -> type:
    """The dataclass the value class stands for, with the same name, fields and defaults."""
    fields = []
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        kwargs = {"repr": param.name not in hidden}
        if param.default is not inspect.Parameter.empty:
            kwargs["default"] = param.default
        fields.append((param.name, object, dataclasses.field(**kwargs)))
    twin = dataclasses.make_dataclass(cls.__name__, fields, frozen=frozen)
    twin.__qualname__ = cls.__qualname__
    return twin


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_a_value_class_behaves_as_its_dataclass(cls: type) -> None:
    frozen, hidden, values = CASES[cls]
    twin = _twin(cls, frozen, hidden)
    assert tuple(cls.__slots__) == tuple(f.name for f in dataclasses.fields(twin))
    ours, theirs = cls(*values), twin(*values)
    assert repr(ours) == repr(theirs)
    for name in hidden:  # what must never reach a log line or a traceback
        assert repr(getattr(ours, name)) not in repr(ours) or getattr(ours, name) is None
    assert ours == cls(*values) and not ours != cls(*values)
    assert ours != theirs and (ours == values) is False  # only the same class compares equal
    assert cls.__match_args__ == twin.__match_args__
    for twin_of in (copy.copy(ours), copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        if cls is SpawnedTask:  # its live object (a plain object() here) is copied as itself or anew
            assert twin_of.handle == ours.handle
        else:
            assert twin_of == ours and repr(twin_of) == repr(ours)
    changed = cls(*values[:-1], "other")
    assert (ours == changed) is (theirs == twin(*values[:-1], "other"))
    if frozen:
        try:
            expected: object = hash(theirs)
        except TypeError:  # a field holds a dict (TaskSpec's env): unhashable, as the dataclass
            expected = TypeError
        if expected is TypeError:
            with pytest.raises(TypeError):
                hash(ours)
        else:
            assert hash(ours) == hash(cls(*values)) == expected
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
            ours.__setattr__(cls.__slots__[0], "x")
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field"):
            ours.__delattr__(cls.__slots__[0])
    else:
        assert cls.__hash__ is None and twin.__hash__ is None
        ours.__setattr__(cls.__slots__[0], "x")
        assert getattr(ours, cls.__slots__[0]) == "x"


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_defaults_are_the_dataclasses(cls: type) -> None:
    """Built with only its required arguments, a value class holds its dataclass twin's defaults."""
    frozen, hidden, values = CASES[cls]
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    required = [v for p, v in zip(params, values) if p.default is inspect.Parameter.empty]
    assert repr(cls(*required)) == repr(_twin(cls, frozen, hidden)(*required))


def test_a_profile_is_changed_and_listed_as_before() -> None:
    """``with_overrides`` and ``limit_names`` (they used ``dataclasses.replace`` and ``fields``)."""
    edge = PROFILES["edge"]
    changed = edge.with_overrides({"page_size": 3, "cancel_grace_s": 1.5})
    assert (changed.page_size, changed.cancel_grace_s, changed.name) == (3, 1.5, "edge")
    assert edge.with_overrides({}) == edge and edge.page_size == 8
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_limit'"):
        edge.with_overrides({"no_such_limit": 1})
    assert Profile.limit_names()[:3] == ("scan_interval_s", "page_size", "pages_per_round")
    assert Profile.limit_names()[-1] == "log_follow_unfinalized_s" and "name" not in Profile.limit_names()


def test_a_single_field_class_compares_and_hashes_by_its_value() -> None:
    @value_class()
    class One:
        __slots__ = ("x",)

        def __init__(self, x: object) -> None:
            object.__setattr__(self, "x", x)

    assert One(1) == One(1) and One(1) != One(2) and hash(One(1)) == hash((1,))
    assert repr(One("v")) == "test_a_single_field_class_compares_and_hashes_by_its_value.<locals>.One(x='v')"


#: lean dataclasses -> (the original @dataclass options frozen, slots; sample positional values).
_PATH = pathlib.Path("/tmp/x.log")
LEAN: dict[type, tuple[bool, bool, tuple[object, ...]]] = {
    Config: (True, True, (PROFILES["edge"], _PATH, "sqlite:///x", ("a",), "src", "local-process", None,
                          "edge-sqlite", None, ("b",), {"p": {}}, None, True, {"k": 1})),
    SpawnRequest: (True, True, ("r", "a", 1, "SECRET-TOKEN", 5, ("echo", "hi"), False, _PATH, "loc", "/w",
                                None, True, 7, 8, 9, 10)),
    TaskSpec: (True, True, (("echo", "hi"), True, "/w", None, None)),
    Submission: (False, False, ("r", "a", "l", 1, 5, None, "local", "SECRET-TOKEN", None, True, 3, 4)),
    ProcessHandle: (True, False, ("boot", 1, 2, 3, "proc")),
}


def _generated_twin(cls: type, frozen: bool, slots: bool) -> type:
    """The class as @dataclass generated it (same fields, defaults, factories, repr flags)."""
    spec = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory, repr=f.repr))
            for f in dataclasses.fields(cls)]
    twin = dataclasses.make_dataclass(cls.__name__, spec, frozen=frozen, slots=slots)
    twin.__qualname__ = cls.__qualname__
    return twin


@pytest.mark.parametrize("cls", list(LEAN), ids=lambda c: c.__name__)
def test_a_lean_dataclass_behaves_as_the_generated_one(cls: type) -> None:
    frozen, slots, values = LEAN[cls]
    twin = _generated_twin(cls, frozen, slots)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen is frozen
    assert [str(p).replace("'", "") for p in inspect.signature(cls).parameters.values()] == \
        [str(p).replace("'", "") for p in inspect.signature(twin).parameters.values()]
    assert ("__slots__" in cls.__dict__) is slots and cls.__match_args__ == twin.__match_args__
    ours, theirs = cls(*values), twin(*values)
    assert repr(ours) == repr(theirs) and "SECRET-TOKEN" not in repr(ours)
    assert ours == cls(*values) and ours != theirs
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)
    # Only the required arguments: the same defaults, a factory's value new for each instance.
    required = len([f for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING])
    assert repr(cls(*values[:required])) == repr(twin(*values[:required]))
    changed = dataclasses.replace(ours, **{dataclasses.fields(cls)[1].name: "other"})
    assert type(changed) is cls and getattr(changed, dataclasses.fields(cls)[1].name) == "other"
    assert changed != ours and dataclasses.replace(ours) == ours
    for copied in (copy.copy(ours), copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert copied == ours
    name = dataclasses.fields(cls)[0].name
    if frozen:
        try:
            expected: object = hash(theirs)
        except TypeError:  # Config's sample holds dicts: unhashable, as the dataclass
            expected = TypeError
        if expected is TypeError:
            with pytest.raises(TypeError):
                hash(ours)
        else:
            assert hash(ours) == expected
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(ours, name, "x")
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(ours, name)
        with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):
            dataclasses.dataclass(type("Sub", (cls,), {}))
    else:
        assert cls.__hash__ is None
        setattr(ours, name, "x")
        assert getattr(ours, name) == "x"


def test_a_factory_default_is_a_new_value_per_instance() -> None:
    edge = PROFILES["edge"]
    one, two = Config(edge, _PATH, "u", (), "s"), Config(edge, _PATH, "u", (), "s")
    assert one.plugin_settings == {} and one.plugin_settings is not two.plugin_settings
    assert Config(edge, _PATH, "u", (), "s", plugin_settings=None).plugin_settings is None  # as given
