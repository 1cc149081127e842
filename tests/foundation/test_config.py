"""Config and profile validation: every rejection path names the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql_core.config import load_config
from ql_core.errors import ConfigError
from ql_core.profiles import LIMIT_RANGES, PROFILES


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ql.toml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str | None = None, **kw):
    path = write(tmp_path, text) if text is not None else None
    return load_config(config_path=path, environ=kw.pop("environ", {}), cwd=tmp_path, **kw)


def test_built_in_defaults_are_edge(tmp_path: Path) -> None:
    config = load(tmp_path, environ={"QL_DATA_DIR": str(tmp_path / "d")})
    assert config.profile.name == "edge"
    assert config.source == "built-in edge defaults"
    assert config.database_url == f"sqlite:///{tmp_path / 'd' / 'ql.db'}"
    assert config.plugins == ("local", "file", "edge-sqlite")
    assert (config.executor, config.receipt_store, config.journal) == ("local", "file", "edge-sqlite")


@pytest.mark.parametrize("name,interval,pages,size,grace,journal_s,quarantine_s", [
    ("edge", 30.0, 2, 8, 50, 120.0, 300.0),
    ("standalone", 5.0, 4, 32, 100, 60.0, 3600.0),
    ("cluster-worker", 5.0, 4, 32, 100, 60.0, 3600.0),
])
def test_profile_numbers_match_design(name, interval, pages, size, grace, journal_s, quarantine_s) -> None:
    p = PROFILES[name]
    assert (p.scan_interval_s, p.pages_per_round, p.page_size, p.publish_grace_ms,
            p.terminal_journal_retention_s, p.quarantine_retention_s) == (
        interval, pages, size, grace, journal_s, quarantine_s)


def test_edge_never_watches_by_default() -> None:
    assert PROFILES["edge"].file_watcher == "never"
    assert "watchfiles" not in PROFILES["edge"].default_plugins


def test_file_sets_profile_data_dir_and_limits(tmp_path: Path) -> None:
    config = load(tmp_path, 'profile = "standalone"\ndata_dir = "state"\n[limits]\npage_size = 16\n')
    assert config.profile.name == "standalone"
    assert config.profile.page_size == 16
    assert config.profile.pages_per_round == 4
    assert config.data_dir == tmp_path / "state"  # relative to the config file


def test_environment_beats_file_and_options_beat_environment(tmp_path: Path) -> None:
    path = write(tmp_path, 'profile = "standalone"\n')
    config = load_config(config_path=path, environ={"QL_PROFILE": "edge"}, cwd=tmp_path)
    assert config.profile.name == "edge"
    config = load_config(config_path=path, environ={"QL_PROFILE": "edge"}, profile="standalone", cwd=tmp_path)
    assert config.profile.name == "standalone"


def test_ql_toml_in_cwd_is_picked_up(tmp_path: Path) -> None:
    write(tmp_path, 'profile = "standalone"\n')
    assert load_config(environ={}, cwd=tmp_path).profile.name == "standalone"


@pytest.mark.parametrize("text,fragment", [
    ('colour = "blue"\n', "unknown key 'colour'"),
    ('profile = 3\n', "profile must be a non-empty string"),
    ('profile = "huge"\n', "profile 'huge' does not exist"),
    ('plugins = "local"\n', "plugins must be a list"),
    ('plugins = [1]\n', "plugins must be a list"),
    ('data_dir = ""\n', "data_dir must be a non-empty string"),
    ('database_url = "mysql://x"\n', "database_url must start with"),
    ('limits = 3\n', "limits must be a table"),
    ('[limits]\npage_size = "8"\n', "limits.page_size must be an integer between 1 and 256"),
    ('[limits]\npage_size = 8.5\n', "limits.page_size must be an integer"),
    ('[limits]\npage_size = true\n', "limits.page_size must be an integer"),
    ('[limits]\npage_size = 0\n', "limits.page_size = 0 is out of range; allowed 1 to 256"),
    ('[limits]\npage_size = 100000\n', "out of range"),
    ('[limits]\nscan_interval_s = 0\n', "limits.scan_interval_s = 0 is out of range"),
    ('[limits]\npublish_grace_ms = -1\n', "out of range"),
    ('not toml = = 3\n', "is not valid TOML"),
])
def test_rejections_name_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert fragment in str(info.value)


@pytest.mark.parametrize("key", sorted(LIMIT_RANGES))
def test_every_limit_is_range_checked(tmp_path: Path, key: str) -> None:
    kind, low, high = LIMIT_RANGES[key]
    too_big = int(high) + 1 if kind is int else high * 2
    with pytest.raises(ConfigError, match=f"limits.{key}"):
        load(tmp_path, f"[limits]\n{key} = {too_big}\n")
    config = load(tmp_path, f"[limits]\n{key} = {int(high) if kind is int else high}\n")
    assert getattr(config.profile, key) == high


def test_a_limits_key_no_plugin_claims_is_refused_as_a_typo(tmp_path: Path) -> None:
    """load_config keeps a [limits] key core does not own for the plugin that claims it (a moved
    number); the check every command and Runtime.open run refuses one nobody claims."""
    from ql_core.plugins import check_config_plugins

    config = load(tmp_path, '[limits]\npage_sise = 3\n')
    assert config.extra_limits == {"page_sise": 3}
    with pytest.raises(ConfigError, match="unknown key limits.page_sise.*did you mean 'page_size'"):
        check_config_plugins(config, {})
    with pytest.raises(ConfigError, match="limits.page_sise must be a number"):
        load(tmp_path, '[limits]\npage_sise = [3]\n')


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(config_path=tmp_path / "nope.toml", environ={}, cwd=tmp_path)


@pytest.mark.parametrize("profile", ["cluster-control", "cluster-worker"])
def test_cluster_profiles_refuse_sqlite(tmp_path: Path, profile: str) -> None:
    with pytest.raises(ConfigError, match="refuses the SQLite run database"):
        load(tmp_path, f'profile = "{profile}"\ndatabase_url = "sqlite:////tmp/x.db"\n')
    with pytest.raises(ConfigError, match="needs database_url"):
        load(tmp_path, f'profile = "{profile}"\n')
    ok = load(tmp_path, f'profile = "{profile}"\ndatabase_url = "postgresql+psycopg://u@h/db"\n')
    assert ok.profile.name == profile


def test_config_adds_plugins_to_the_profile(tmp_path: Path) -> None:
    config = load(tmp_path, 'plugins = ["extra", "local"]\n')
    assert config.plugins == ("local", "file", "edge-sqlite", "extra")


# -- explicit sources: a library caller reads QL_* and ./ql.toml only when it asks -------------------------
def test_the_process_environment_is_read_only_when_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("QL_PROFILE", "standalone")
    monkeypatch.setenv("QL_DATA_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("QL_DATABASE_URL", "postgresql+psycopg://u@h/db")
    quiet = load_config(data_dir=tmp_path / "d")
    assert (quiet.profile.name, quiet.data_dir) == ("edge", tmp_path / "d")
    assert quiet.database_url == f"sqlite:///{tmp_path / 'd' / 'ql.db'}"
    asked = load_config(environ=os.environ)
    assert (asked.profile.name, asked.data_dir) == ("standalone", tmp_path / "from-env")


def test_the_working_directory_is_searched_only_when_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, 'profile = "standalone"\n')
    monkeypatch.chdir(tmp_path)
    assert load_config(data_dir=tmp_path / "d").profile.name == "edge"
    assert load_config(data_dir=tmp_path / "d", cwd=tmp_path).profile.name == "standalone"
    assert load_config(data_dir=tmp_path / "d", cwd=tmp_path).source == str(tmp_path / "ql.toml")


def test_a_relative_data_dir_on_the_command_line_is_relative_to_the_working_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    path = write(elsewhere, 'data_dir = "state"\n')
    assert load_config(config_path=path, cwd=tmp_path).data_dir == elsewhere / "state"
    assert load_config(config_path=path, data_dir="mine", cwd=tmp_path).data_dir == tmp_path / "mine"
    env = {"QL_DATA_DIR": "env-dir"}
    assert load_config(config_path=path, environ=env, cwd=tmp_path).data_dir == tmp_path / "env-dir"


def test_default_data_dir_follows_xdg_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert load_config().data_dir == tmp_path / "state" / "ql"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config().data_dir == tmp_path / ".local" / "state" / "ql"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=r"HOME=.*gone\) does not exist"):
        load_config()
    assert not (tmp_path / "gone").exists()
    assert load_config(data_dir=tmp_path / "d").data_dir == tmp_path / "d"  # not needed: no error


@pytest.mark.parametrize("data,fragment", [
    (b"\x00\x01binary", "NUL bytes"),
    ('profile = "edge"\n'.encode("utf-16"), "UTF-16"),
    (b"profile = \"\xe9\"\n", "not UTF-8"),
    (b"a = " + b"[" * 100_000 + b"]" * 100_000, "too deeply"),
    (b"# " + b"x" * (1 << 20), "more than the 1048576"),
    (b'data_dir = "a\\u0000b"\n', "NUL byte"),
])
def test_files_that_are_not_config_files(tmp_path: Path, data: bytes, fragment: str) -> None:
    (tmp_path / "ql.toml").write_bytes(data)
    with pytest.raises(ConfigError, match=fragment):
        load_config(config_path=tmp_path / "ql.toml")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "ql.toml").write_bytes(b'\xef\xbb\xbfprofile = "standalone"\n')
    assert load_config(config_path=tmp_path / "ql.toml", data_dir=tmp_path).profile.name == "standalone"


def test_a_fifo_config_is_refused_without_blocking(tmp_path: Path) -> None:
    import os
    import threading

    os.mkfifo(tmp_path / "ql.toml")
    result: list[BaseException] = []
    worker = threading.Thread(target=lambda: result.append(pytest.raises(ConfigError, load_config,
                                                                         config_path=tmp_path / "ql.toml").value))
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "load_config blocked on a FIFO"
    assert "not a regular file" in str(result[0])


@pytest.mark.parametrize("data_dir,fragment", [
    ("/tmp/" + "a" * 256, "component of 256 bytes"),
    ("/tmp/" + "/".join(["b" * 200] * 20), "bytes long"),
])
def test_data_dirs_too_long_for_the_file_system(data_dir: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(data_dir=data_dir)


@pytest.mark.parametrize("kind,fragment", [
    ("dangling_symlink", "dangling symlink"),
    ("symlink_loop", "symlink loop"),
    ("directory", "is a directory"),
    ("fifo", "is a FIFO"),
])
def test_anything_at_the_default_config_path_is_the_config(tmp_path: Path, kind: str, fragment: str) -> None:
    """Found in the working directory and unreadable: an error, never the built-in defaults."""
    import os
    import threading

    toml = tmp_path / "ql.toml"
    if kind == "dangling_symlink":
        toml.symlink_to(tmp_path / "moved-away.toml")
    elif kind == "symlink_loop":
        toml.symlink_to("ql.toml")
    elif kind == "directory":
        toml.mkdir()
    else:
        os.mkfifo(toml)
    result: list[BaseException] = []
    worker = threading.Thread(target=lambda: result.append(pytest.raises(
        ConfigError, load_config, cwd=tmp_path, data_dir=tmp_path / "d").value))
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "load_config blocked on ./ql.toml"
    message = str(result[0])
    assert fragment in message and str(toml) in message and "built-in defaults" in message, message


def test_nothing_at_the_default_config_path_means_the_built_in_defaults(tmp_path: Path) -> None:
    assert load_config(cwd=tmp_path, data_dir=tmp_path / "d").source == "built-in edge defaults"


@pytest.mark.parametrize("data_dir", ["/dev/null", "/proc/self", "/sys/kernel"])
def test_a_data_dir_on_a_virtual_file_system_is_a_config_error(data_dir: str) -> None:
    with pytest.raises(ConfigError, match="virtual file system"):
        load_config(data_dir=data_dir)
