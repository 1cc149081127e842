"""The entry-point cache: a start that hits it imports the same plugins without stevedore's scan,
and any change to the installed distributions invalidates it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ql_test_plugin"

PROBE = """
import json, sys
from ql_core.plugins import load_plugin_host
host = load_plugin_host(sys.argv[1].split(","), optional=[])
print(json.dumps({"loaded": list(host.loaded), "executors": host.executors.names(),
                  "stevedore": "stevedore" in sys.modules, "metadata": "importlib.metadata" in sys.modules}))
"""


def _probe(env: dict[str, str], names: str, extra_path: Path | None = None) -> dict:
    env = dict(env)
    if extra_path is not None:
        env["PYTHONPATH"] = f"{extra_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run([sys.executable, "-c", PROBE, names], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_") and k != "PYTHONPATH"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def test_a_warm_start_loads_the_same_plugins_without_the_scan(tmp_path: Path) -> None:
    env = _env(tmp_path)
    cold = _probe(env, "local,file,edge-sqlite")
    assert cold["stevedore"] and list((tmp_path / "cache" / "ql").glob("plugins-*.json"))
    warm = _probe(env, "local,file,edge-sqlite")
    assert (warm["loaded"], warm["executors"]) == (cold["loaded"], cold["executors"])
    assert not warm["stevedore"] and not warm["metadata"]


def _install_fixture_plugin(site: Path) -> None:
    """"pip install" the test plugin distribution into the import path ``site``."""
    for item in FIXTURES.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy)(item, site / item.name)


def test_a_newly_installed_distribution_invalidates_the_cache(tmp_path: Path) -> None:
    env = _env(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    _probe(env, "local", extra_path=site)
    _install_fixture_plugin(site)  # the directory's mtime changes
    found = _probe(env, "local,test-echo", extra_path=site)
    assert "test-echo" in found["loaded"] and "echo" in found["executors"]


def test_a_damaged_or_foreign_cache_is_ignored(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _probe(env, "local")
    [path] = (tmp_path / "cache" / "ql").glob("plugins-*.json")
    for damage in (b"{not json", json.dumps({"key": "another environment", "plugins": {"local": "x:y"}}).encode(),
                   json.dumps({"key": None, "plugins": []}).encode(),
                   json.dumps({"entries": [{"key": "another environment", "paths": [],
                                            "plugins": {"local": "x:y"}}]}).encode(),
                   json.dumps({"entries": "not a list"}).encode(), json.dumps(["entries"]).encode()):
        path.write_bytes(damage)
        result = _probe(env, "local")
        assert result["loaded"] == ["local"] and result["stevedore"]


def test_the_cache_can_be_switched_off(tmp_path: Path) -> None:
    env = dict(_env(tmp_path), QL_PLUGIN_CACHE="off")
    _probe(env, "local")
    assert _probe(env, "local")["stevedore"]
    assert not (tmp_path / "cache" / "ql").exists()


def test_a_busy_working_directory_keeps_the_cache(tmp_path: Path) -> None:
    # `python -c` (and `python -m`) puts the working directory first on sys.path: a file written
    # there changes its mtime. No distribution came or went, so the cache still holds.
    env = _env(tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    run = [sys.executable, "-c", PROBE, "local,file"]
    subprocess.run(run, env=env, cwd=cwd, check=True, capture_output=True, timeout=60)
    (cwd / "some-output.log").write_text("x")
    os.utime(cwd, ns=(1, 1))  # whatever the file system's mtime granularity: the entry changed
    warm = json.loads(subprocess.run(run, env=env, cwd=cwd, check=True, capture_output=True, text=True,
                                     timeout=60).stdout)
    assert not warm["stevedore"] and not warm["metadata"]
    assert warm["loaded"] == ["local", "file"]


def test_a_distribution_added_to_a_busy_entry_is_still_seen(tmp_path: Path) -> None:
    # The fallback lists the entry's names again: a new distribution there is a miss, and is found.
    env = _env(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    _probe(env, "local", extra_path=site)
    _install_fixture_plugin(site)
    os.utime(site, ns=(1, 1))  # even an entry whose mtime went back still shows its new names
    found = _probe(env, "local,test-echo", extra_path=site)
    assert "test-echo" in found["loaded"] and "echo" in found["executors"]


def test_two_import_paths_keep_their_own_entries(tmp_path: Path) -> None:
    # `ql` and `python -m` (another first sys.path entry) alternating: each start still hits.
    env = _env(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for where in (a, b):
        assert _probe(env, "local", extra_path=where)["stevedore"]
    for where in (a, b, a):
        assert not _probe(env, "local", extra_path=where)["stevedore"]
