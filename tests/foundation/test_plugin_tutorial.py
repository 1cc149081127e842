"""docs/plugins.md's tutorial, followed literally: its code blocks, written where their first line says, make a
plugin that passes the executor contract suite (issue 26, third acceptance bullet). Fails when the tutorial rots.

The package is "installed" the way pip would leave it for ql: its modules plus a dist-info declaring the
tutorial pyproject's entry points, on PYTHONPATH; the suite runs in a real pytest subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
SECTION = "### Tutorial: an executor in its own package, from an empty directory"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def tutorial_files() -> dict[str, str]:
    """``relative path -> text`` of every code block of the tutorial whose first line names its file."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC} lost its tutorial section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    body = re.split(r"^#{2,3} ", body, maxsplit=1, flags=re.M)[0]
    files = {}
    for _lang, block in FENCE.findall(body):
        first = block.splitlines()[0]
        match = re.fullmatch(r"# ([\w./-]+\.(?:py|toml))", first)
        if match:
            files[match.group(1)] = block
    return files


def test_the_tutorial_names_each_file_it_asks_for() -> None:
    assert set(tutorial_files()) == {"pyproject.toml", "ql_umask/__init__.py", "ql_umask/plugin.py",
                                     "ql_umask/executor.py", "tests/test_umask.py"}


@pytest.mark.timeout(1200)  # a whole nested pytest run (its own bound below); > 300 s beside the slow tests
def test_the_tutorial_plugin_passes_the_executor_contract_suite(tmp_path: Path) -> None:
    root = tmp_path / "ql-umask"
    for name, text in tutorial_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    # The extra the tutorial installs must exist in ql's own metadata and bring pytest.
    assert "ql-runner[testing]" in project["optional-dependencies"]["test"]
    from importlib import metadata

    requires = metadata.requires("ql-runner") or []
    assert any(r.startswith("pytest") and 'extra == "testing"' in r for r in requires), requires
    info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["ql.plugins"]
    (info / "entry_points.txt").write_text("[ql.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update(PYTHONPATH=str(root), QL_PLUGIN_CACHE="off", HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-rs"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    tail = (out.stdout + out.stderr)[-4000:]
    assert out.returncode == 0, tail
    summary = out.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 40 and "failed" not in summary and "error" not in summary, tail
    # The end-to-end tests ran through a Runtime by the plugin's name (not skipped for want of it).
    assert "end-to-end tests need the installed plugin" not in out.stdout, tail
    # And the plugin is a plugin for the real `ql`: active when selected, its setting shown and checked.
    (root / "ql.toml").write_text('executor = "umask"\n[plugin.umask]\nmask = "022"\n')
    ql = [sys.executable, "-m", "ql_core.cli.main"]
    plugins = subprocess.run([*ql, "plugins"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert plugins.returncode == 0 and re.search(r"^umask\s+active", plugins.stdout, re.M), plugins.stdout
    doctor = subprocess.run([*ql, "--data-dir", str(tmp_path / "data"), "doctor"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=120)
    assert 'mask="022"' in doctor.stdout, doctor.stdout + doctor.stderr
    (root / "ql.toml").write_text('executor = "umask"\n[plugin.umask]\nmaks = "022"\n')
    typo = subprocess.run([*ql, "--data-dir", str(tmp_path / "data"), "list"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert typo.returncode == 2 and "did you mean 'mask'" in typo.stderr, typo.stderr
