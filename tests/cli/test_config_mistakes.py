"""Config mistakes every plugin's table makes alike (issue 26 item 2) and plugin modules with a wrong hook
name (item 6): one line naming the table or hook and the fix, exit 2 (exit 1 for `ql plugins` rows), for
every command that loads the config, before the data dir exists. Real `ql` processes, real entry points."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env, json_lines, ql_proc


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path, QL_PLUGIN_CACHE="off")


def fake_distribution(root: Path, name: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
    """A distribution with ``ql.plugins`` entry points: modules plus a dist-info, on PYTHONPATH=root."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ql.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    return root


TYPOS = {
    # Each plugin's table: a misspelled key gets the nearest real one, for every plugin alike.
    "local": (b"[plugin.local]\nstandbye = true\n", ("[plugin.local]", "'standbye'", "did you mean 'standby'")),
    "nice": (b"[plugin.nice]\nnicenes = 3\n", ("[plugin.nice]", "'nicenes'", "did you mean 'niceness'")),
    "cluster-fenced": (b"[plugin.cluster-fenced]\nslot = 3\n", ("[plugin.cluster-fenced]", "did you mean 'slots'")),
    "edge-sqlite": (b"[plugin.edge-sqlite]\nbusy = 3\n", ("[plugin.edge-sqlite] takes no settings",)),
    "nice_value": (b"[plugin.nice]\nniceness = 99\n", ("[plugin.nice] niceness must be",)),
}


@pytest.mark.parametrize("name", sorted(TYPOS))
@pytest.mark.parametrize("command", [["list"], ["doctor"], ["run", "--", "true"], ["plugins"]])
def test_a_key_or_value_its_plugin_refuses_stops_every_command(env, tmp_path: Path, name: str,
                                                               command: list[str]) -> None:
    toml, says = TYPOS[name]
    (tmp_path / "ql.toml").write_bytes(toml)
    out = ql_proc(["--data-dir", str(tmp_path / "data"), *command], env, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    (line,) = out.stderr.splitlines()
    for text in says:
        assert text in line, line
    assert "Traceback" not in out.stderr and not (tmp_path / "data").exists()


UNCHECKED = ("from ql_core.hookspecs import hookimpl\n\n"
             "@hookimpl\n"
             "def ql_register_executors(register):\n"
             "    register('quiet', lambda context: None)\n")


def test_a_table_for_a_plugin_that_declares_no_settings_is_refused(env, tmp_path: Path) -> None:
    """Nobody would ever read [plugin.quiet]'s keys: a typo there would pass silently, so the table is refused."""
    site = fake_distribution(tmp_path / "site", "ql_quiet", {"quiet": "ql_quiet_mod"}, {"ql_quiet_mod": UNCHECKED})
    (tmp_path / "ql.toml").write_text("[plugin.quiet]\nlevel = 3\n")
    for command in (["list"], ["doctor"]):
        out = ql_proc(["--data-dir", str(tmp_path / "data"), *command], dict(env, PYTHONPATH=str(site)), cwd=tmp_path)
        assert out.returncode == 2, (out.stdout, out.stderr)
        (line,) = out.stderr.splitlines()
        assert "[plugin.quiet]" in line and "ql_check_config" in line and "remove the table" in line, line
    assert not (tmp_path / "data").exists()


TYPO_HOOK = ("from ql_core.hookspecs import hookimpl\n\n"
             "@hookimpl\n"
             "def ql_register_executer(register):\n"
             "    register('typo', lambda context: None)\n")


def test_plugins_reports_a_misspelled_hook_even_in_a_plugin_not_enabled(env, tmp_path: Path) -> None:
    site = fake_distribution(tmp_path / "site", "ql_typo", {"typo": "ql_typo_mod"}, {"ql_typo_mod": TYPO_HOOK})
    out = ql_proc(["--json", "plugins"], dict(env, PYTHONPATH=str(site)), cwd=tmp_path)
    assert out.returncode == 1, (out.stdout, out.stderr)
    (row,) = [r for r in json_lines(out.stdout) if r.get("name") == "typo" and "state" in r]
    assert row["state"] == "error"
    assert "'ql_register_executer'" in row["error"] and "did you mean 'ql_register_executors'" in row["error"]
    assert "\n" not in row["error"] and "Traceback" not in out.stderr
    # Enabled, it stops every command with the same line (exit 2), nothing created.
    (tmp_path / "ql.toml").write_text('plugins = ["typo"]\n')
    out = ql_proc(["--data-dir", str(tmp_path / "data"), "list"], dict(env, PYTHONPATH=str(site)), cwd=tmp_path)
    assert out.returncode == 2 and "did you mean 'ql_register_executors'" in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1 and not (tmp_path / "data").exists()


def test_plugins_shows_the_selected_executor_plugin_as_active(env, tmp_path: Path) -> None:
    (tmp_path / "ql.toml").write_text('executor = "nice"\n')
    out = ql_proc(["--json", "plugins"], env, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout, out.stderr)
    states = {r["name"]: r["state"] for r in json_lines(out.stdout) if "state" in r}
    assert states["nice"] == "active" and states["cluster-fenced"] == "installed", states


# -- ql doctor shows everything in force (issue 26 item 3) ------------------------------------------------
def _doctor(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, list[dict], str]:
    out = ql_proc([*args, "--json", "doctor"], env, cwd=cwd)
    text = ql_proc([*args, "doctor"], env, cwd=cwd)
    assert out.returncode == text.returncode and "Traceback" not in out.stderr + text.stderr, (out, text)
    return out.returncode, json_lines(out.stdout), text.stdout


def test_doctor_on_a_fresh_machine_is_healthy_and_says_nothing_ran_yet(env, tmp_path: Path) -> None:
    """No --data-dir, no QL_DATA_DIR, no ql.toml, a HOME where ql never ran: exit 0, one info line."""
    code, records, text = _doctor(env, tmp_path)
    assert code == 0, text
    checks = {r["check"]: r for r in records if "check" in r}
    assert checks["data_dir"]["result"] == "info" and "nothing has run here" in checks["data_dir"]["detail"]
    assert records[-1]["healthy"] is True
    assert "info data_dir" in text and not (tmp_path / ".local" / "state" / "ql").exists()
    # A named data dir under a directory that does not exist stays a failure (a typo is not created).
    code, records, _text = _doctor(env, tmp_path, "--data-dir", str(tmp_path / "typo" / "ql"))
    assert code == 1 and {r["check"]: r["result"] for r in records if "check" in r}["data_dir"] == "failed"


def test_doctor_shows_the_profiles_limits_in_plain_numbers_and_the_plugin_settings(env, tmp_path: Path) -> None:
    (tmp_path / "ql.toml").write_text('profile = "standalone"\n[plugin.local]\nlauncher = "shell"\n'
                                      '[plugin.nice]\nniceness = 5\n')
    code, records, text = _doctor(env, tmp_path)
    assert code == 0, text
    config = records[0]["config"]
    # Only the limits this profile uses: no cluster numbers on a SQLite profile.
    assert "history_retention_s" in config["limits"] and "run_lease_s" not in config["limits"]
    assert "claim_batch" not in config["limits"] and "ship_interval_s" not in config["limits"]
    assert "run_lease_s" not in text and "claim_batch" not in text
    assert "history_retention_s=2592000 (30d)" in text and "e+0" not in text, text
    # Every plugin setting in force, defaults filled in, in JSON and text alike.
    assert config["plugin_settings"]["local"] == {"cgroup_parent": "", "containment": "auto", "launcher": "shell",
                                                  "run_as": "", "standby": True}
    assert config["plugin_settings"]["nice"]["niceness"] == 5
    assert 'launcher="shell"' in text and "standby=true" in text and "niceness=5" in text


def test_doctor_masks_secret_settings_of_a_plugin_that_does_not_describe_them(env, tmp_path: Path) -> None:
    source = ("from ql_core.hookspecs import hookimpl\n\n"
              "@hookimpl\n"
              "def ql_check_config(config):\n"
              "    pass\n")
    site = fake_distribution(tmp_path / "site", "ql_vault", {"vault": "ql_vault_mod"}, {"ql_vault_mod": source})
    (tmp_path / "ql.toml").write_text('[plugin.vault]\nurl = "https://vault.example"\napi_token = "hunter2"\n')
    code, records, text = _doctor(dict(env, PYTHONPATH=str(site)), tmp_path)
    assert code == 0, text
    assert records[0]["config"]["plugin_settings"]["vault"] == {"url": "https://vault.example", "api_token": "***"}
    assert "hunter2" not in text and "api_token=\"***\"" in text


def test_cluster_numbers_are_the_plugins_not_core_limits() -> None:
    from ql_core.config import load_config

    worker = load_config(profile="cluster-worker", data_dir="/tmp/ql-unused",
                         environ={"QL_DATABASE_URL": "postgresql+psycopg://u@h/db"})
    limits = worker.profile.limits_in_force()
    assert "log_follow_unfinalized_s" in limits and "run_lease_s" not in limits and "claim_batch" not in limits
    edge = load_config(data_dir="/tmp/ql-unused")
    assert "history_retention_s" in edge.profile.limits_in_force()
    assert "log_follow_unfinalized_s" not in edge.profile.limits_in_force()


def test_doctor_shows_the_cluster_numbers_under_the_plugins_settings(env, tmp_path: Path) -> None:
    """On a cluster profile the cluster numbers are [plugin.cluster-fenced] settings (an older
    config's [limits] key still counts; the plugin table wins), not core limits."""
    (tmp_path / "ql.toml").write_text('profile = "cluster-control"\ndatabase_url = "postgresql+psycopg://u@h/db"\n'
                                      '[limits]\nrun_lease_s = 20\nclaim_batch = 3\n'
                                      '[plugin.cluster-fenced]\nrun_lease_s = 40\n')
    code, records, text = _doctor(env, tmp_path)
    config = records[0]["config"]
    assert "run_lease_s" not in config["limits"] and "claim_batch" not in config["limits"], config["limits"]
    shown = config["plugin_settings"]["cluster-fenced"]
    assert shown["run_lease_s"] == 40 and shown["claim_batch"] == 3 and shown["session_lease_s"] == 45, shown
    (line,) = [ln for ln in text.splitlines() if ln.startswith("plugin.cluster-fenced")]
    assert "run_lease_s=40" in line and "claim_batch=3" in line, text
    assert "run_lease_s" not in text.split("plugin.", 1)[0], text  # not among the core limits


@pytest.mark.parametrize("toml, says", [
    (b'[plugin.lcoal]\nrun_as = "nobody"\n', "did you mean 'local'"),
    (b"[plugin.local]\nstandbye = true\n", "did you mean 'standby'"),
])
def test_the_embedding_api_refuses_the_same_mistakes_before_creating_anything(tmp_path: Path, toml: bytes,
                                                                            says: str) -> None:
    """``Runtime.open`` checks the plugin tables as every command does: an embedding host with a
    misspelled table gets the same one-line ConfigError, and no data dir is created."""
    from ql_core.config import load_config
    from ql_core.errors import ConfigError
    from ql_core.runtime import Runtime

    (tmp_path / "ql.toml").write_bytes(toml)
    data = tmp_path / "data"
    config = load_config(data_dir=data, environ={"QL_CONFIG": str(tmp_path / "ql.toml")}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=says):
        Runtime.open(config, environ={})
    assert not data.exists()
