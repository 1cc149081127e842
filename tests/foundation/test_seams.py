"""The plugin seams are selected by name in ql.toml, fail at start with one line, and isolate observers.

Real entry points (the test distribution's dist-info on sys.path), real
pluggy and stevedore, real runtimes on real SQLite files, the real `ql`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from ql_core.config import load_config
from ql_core.errors import ConfigError, PluginError
from ql_core.runtime import Runtime
from tests.conftest import json_lines, run_ql

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ql_test_plugin"


@pytest.fixture
def test_distribution(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from stevedore.extension import ExtensionManager

    monkeypatch.syspath_prepend(str(FIXTURES))
    importlib.invalidate_caches()
    monkeypatch.setattr(ExtensionManager, "ENTRY_POINT_CACHE", {})
    yield FIXTURES
    for name in ("ql_test_plugin", "ql_raising_observer"):
        sys.modules.pop(name, None)


def _config(tmp_path: Path, body: str, **kw: Any) -> Any:
    toml = tmp_path / "ql.toml"
    toml.write_text(body)
    return load_config(config_path=toml, data_dir=tmp_path / "data", environ={}, cwd=tmp_path, **kw)


def _open(tmp_path: Path, body: str, environ: dict[str, str] | None = None) -> Runtime:
    return Runtime.open(_config(tmp_path, body), environ=environ or {})


# -- selection by name --------------------------------------------------------------------
def test_profile_defaults_select_local_file_and_edge_sqlite(tmp_path: Path) -> None:
    with _open(tmp_path, "") as rt:
        assert (rt.config.executor, rt.config.receipt_store, rt.config.journal) == ("local", "file", "edge-sqlite")
        sub = rt.submit(["sh", "-c", "exit 0"])
        assert sub.executor == "local"
        assert [a.executor for a in rt.wait(sub).attempts] == ["local"]


def test_a_third_party_executor_is_selected_by_name_and_its_plugin_loaded(tmp_path: Path,
                                                                          test_distribution: Path) -> None:
    """`executor = "echo"` alone: the plugin of that name is loaded, the executor built."""
    config = _config(tmp_path, 'executor = "echo"\nplugins = ["test-echo"]\n')
    assert "test-echo" in config.plugins and config.seam_plugins == ("echo", "file", "edge-sqlite")
    with Runtime.open(config, environ={}) as rt:
        assert type(rt.executor).__name__ == "EchoExecutor"
        assert rt.executor_for("local") is not None  # still there for attempts it started earlier


def test_an_unknown_executor_fails_at_start_with_one_line_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as info:
        _open(tmp_path, 'executor = "slurm"\n')
    message = str(info.value)
    assert "\n" not in message
    assert "executor 'slurm'" in message and "registered executors: local" in message
    assert "installed: " in message and 'executor = "<one of those>"' in message


@pytest.mark.parametrize("body, environ, why", [
    ('disable_plugins = ["local"]\n', {}, "disabled by disable_plugins"),
    ("", {"QL_DISABLE_PLUGINS": "local"}, "disabled by QL_DISABLE_PLUGINS"),
    ("", {"QL_PLUGINS": "file,edge-sqlite"}, "QL_PLUGINS does not allow plugin 'local'"),
])
def test_a_disabled_plugin_that_a_seam_needs_is_explained(tmp_path: Path, body: str, environ: dict[str, str],
                                                          why: str) -> None:
    with pytest.raises(PluginError) as info:
        _open(tmp_path, body, environ)
    assert why in str(info.value) and "executor 'local'" in str(info.value)


def test_disabling_local_keeps_the_file_receipt_store(tmp_path: Path, test_distribution: Path) -> None:
    config = _config(tmp_path, 'executor = "echo"\nplugins = ["test-echo"]\ndisable_plugins = ["local"]\n')
    assert "local" not in config.plugins
    with Runtime.open(config, environ={}) as rt:
        assert type(rt.receipts).__name__ == "FileReceiptStore"
        assert rt.executor_for("local") is None  # its attempts would be blocked, never guessed


@pytest.mark.parametrize("body, fragment", [
    ('executor = 3\n', "executor must be a non-empty string"),
    ('disable_plugins = "local"\n', "disable_plugins must be a list"),
    ('[plugin]\nlocal = 1\n', "plugin settings must be tables"),
    ('[plugin.local]\n' + "a = " + "[" * 12 + "]" * 12 + "\n", "nested more than"),
    ('journal = ""\n', "journal must be a non-empty string"),
])
def test_bad_seam_settings_are_one_line_config_errors(tmp_path: Path, body: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        _config(tmp_path, body)
    assert "\n" not in str(info.value)


def test_a_profile_without_tasks_refuses_an_executor(tmp_path: Path) -> None:
    toml = tmp_path / "ql.toml"
    toml.write_text('profile = "cluster-control"\nexecutor = "local"\ndatabase_url = "postgresql+psycopg://x/y"\n')
    with pytest.raises(ConfigError, match="runs no local processes"):
        load_config(config_path=toml, environ={}, cwd=tmp_path)


# -- plugin config ----------------------------------------------------------------------------
def test_plugin_tables_reach_the_factories_which_validate_them(tmp_path: Path) -> None:
    config = _config(tmp_path, '[plugin.local]\nniceness = 5\n')
    assert config.plugin_settings == {"local": {"niceness": 5}}
    with pytest.raises(ConfigError) as info:
        Runtime.open(config, environ={})
    assert "[plugin.local]" in str(info.value) and "niceness" in str(info.value)


# -- observers ---------------------------------------------------------------------------------
def test_an_observer_that_raises_never_stops_the_others_nor_the_run(tmp_path: Path,
                                                                    test_distribution: Path) -> None:
    with _open(tmp_path, 'plugins = ["test-raising-observer", "test-echo"]\n') as rt:
        sub = rt.submit(["sh", "-c", "exit 0"])
        view = rt.wait(sub)
    assert view.status == "succeeded"
    seen = [e.type for e in sys.modules["ql_test_plugin"].SEEN_EVENTS if e.run_id == sub.run_id]
    raised = [e.type for e in sys.modules["ql_raising_observer"].CALLS if e.run_id == sub.run_id]
    assert seen == raised == ["run.created", "attempt.spawned", "attempt.succeeded", "run.succeeded"]


# -- ql doctor shows the effective config --------------------------------------------------------
def test_doctor_shows_the_effective_config_and_masks_the_password(ql_env: dict[str, str], tmp_path: Path) -> None:
    toml = tmp_path / "ql.toml"
    toml.write_text('profile = "standalone"\n[limits]\npage_size = 16\n')
    out = run_ql(["--config", str(toml), "--json", "doctor"], ql_env)
    assert out.returncode == 0, out.stderr
    config = json_lines(out.stdout)[0]["config"]
    assert (config["source"], config["profile"]) == (str(toml), "standalone")
    assert (config["executor"], config["receipt_store"], config["journal"]) == ("local", "file", "edge-sqlite")
    assert config["limits"]["page_size"] == 16 and config["limits"]["pages_per_round"] == 4
    assert set(config["limits"]) >= {"scan_interval_s", "log_max_bytes", "busy_timeout_ms"}
    text = run_ql(["--config", str(toml), "doctor"], ql_env).stdout
    assert "executor=local receipt_store=file journal=edge-sqlite" in text and "page_size=16" in text

    from ql_core.cli.cmd_doctor import mask_url

    assert mask_url("postgresql+psycopg://ql:s3cret@db.example:5433/ql") == \
        "postgresql+psycopg://ql:***@db.example:5433/ql"
    assert mask_url("sqlite:////var/lib/ql/ql.db") == "sqlite:////var/lib/ql/ql.db"


def test_doctor_fails_when_a_selected_plugin_cannot_load(ql_env: dict[str, str], tmp_path: Path) -> None:
    toml = tmp_path / "ql.toml"
    toml.write_text('executor = "slurm"\n')
    out = run_ql(["--config", str(toml), "--json", "doctor"], ql_env)
    assert out.returncode == 1
    checks = {r["check"]: r for r in json_lines(out.stdout) if "check" in r}
    assert checks["plugins"]["result"] == "failed"
    assert "slurm" in checks["plugins"]["detail"]
