"""Plugin loading through real entry points (a dist-info on sys.path), with real pluggy."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from ql_core.errors import PluginError
from ql_core.plugins import installed_plugins, load_plugin_host, select_plugin_names

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ql_test_plugin"


@pytest.fixture
def test_distribution(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the test distribution (modules + dist-info with entry points) on sys.path."""
    from stevedore.extension import ExtensionManager

    monkeypatch.syspath_prepend(str(FIXTURES))
    importlib.invalidate_caches()
    # stevedore caches a namespace's entry points per process; a new distribution
    # appearing mid-process is a test-only situation.
    monkeypatch.setattr(ExtensionManager, "ENTRY_POINT_CACHE", {})
    yield FIXTURES
    for name in ("ql_test_plugin", "ql_broken_plugin", "ql_bad_hook_plugin", "ql_raising_observer"):
        sys.modules.pop(name, None)


def test_builtins_are_declared_in_the_entry_point_group() -> None:
    names = {p.name for p in installed_plugins()}
    assert {"local", "edge-sqlite"} <= names


def test_builtins_register_executor_store_and_journal() -> None:
    host = load_plugin_host(["local", "file", "edge-sqlite"], environ={})
    assert host.loaded == ("local", "file", "edge-sqlite")
    assert host.executors.names() == ["local"]
    assert host.receipt_stores.names() == ["file"]
    assert host.journal_backends.names() == ["edge-sqlite"]


def test_only_named_plugins_are_imported(test_distribution: Path) -> None:
    sys.modules.pop("ql_broken_plugin", None)
    load_plugin_host(["local"], environ={})
    assert "ql_broken_plugin" not in sys.modules
    assert "ql_test_plugin" not in sys.modules


def test_third_party_plugin_registers_and_observes(test_distribution: Path) -> None:
    from ql_core.ports import RunEventInfo

    host = load_plugin_host(["local", "test-echo"], environ={})
    assert host.executors.names() == ["echo", "local"]
    event = RunEventInfo(run_id="r", seq=1, type="run.created")
    host.notify_event(event)
    assert sys.modules["ql_test_plugin"].SEEN_EVENTS == [event]


def test_unknown_plugin_lists_what_is_installed() -> None:
    with pytest.raises(PluginError) as info:
        load_plugin_host(["local", "slurm"], environ={})
    message = str(info.value)
    assert "'slurm' not found" in message
    assert "installed: " in message and "local" in message and "edge-sqlite" in message
    assert "is the package that provides it installed" in message


def test_plugin_whose_import_raises_is_fatal_and_explained(test_distribution: Path) -> None:
    with pytest.raises(PluginError) as info:
        load_plugin_host(["test-broken"], environ={})
    message = str(info.value)
    assert "'test-broken'" in message and "RuntimeError: broken on purpose" in message
    assert "QL_DISABLE_PLUGINS=test-broken" in message


def test_entry_point_to_a_missing_module(test_distribution: Path) -> None:
    with pytest.raises(PluginError, match="ModuleNotFoundError"):
        load_plugin_host(["test-missing-module"], environ={})


def test_unknown_hook_is_refused_by_check_pending(test_distribution: Path) -> None:
    with pytest.raises(PluginError, match="implements hook 'ql_register_executor', which ql does not define; did you mean 'ql_register_executors'"):
        load_plugin_host(["test-bad-hook"], environ={})


def test_duplicate_registration_names_both_plugins(test_distribution: Path, monkeypatch) -> None:
    from ql_core.plugins import PluginHost, Registry

    registry: Registry[object] = Registry("executor")
    registry._current_plugin = "a"
    registry.register("x", lambda c: None)
    registry._current_plugin = "b"
    with pytest.raises(PluginError, match="registered twice: by plugin 'a' and by 'b'"):
        registry.register("x", lambda c: None)


def test_environment_switches() -> None:
    wanted = ["local", "edge-sqlite", "watchfiles"]
    assert select_plugin_names(wanted, {"QL_PLUGINS": "local, edge-sqlite"}) == ("local", "edge-sqlite")
    assert select_plugin_names(wanted, {"QL_DISABLE_PLUGINS": "watchfiles"}) == ("local", "edge-sqlite")
    assert select_plugin_names(wanted, {"QL_PLUGINS": "local,watchfiles", "QL_DISABLE_PLUGINS": "watchfiles"}) \
        == ("local",)
    host = load_plugin_host(["local", "edge-sqlite"], environ={"QL_DISABLE_PLUGINS": "local"})
    assert host.loaded == ("edge-sqlite",)


def test_missing_registration_is_explained() -> None:
    host = load_plugin_host(["edge-sqlite"], environ={})
    with pytest.raises(PluginError, match="executor 'local' not found; registered: none"):
        host.executors.create("local", None)  # type: ignore[arg-type]
