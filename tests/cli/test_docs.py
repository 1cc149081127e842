"""Docs that live in the repo (item 7) and name the right distribution (item 8); the README's own
examples work as written (Quickstart, and the embedding host killed with SIGKILL and restarted)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
#: Text a user reads: docs, examples, messages in the code.
TEXT = [p for p in ROOT.rglob("*") if p.is_file() and p.suffix in (".md", ".py", ".cfg", ".toml", ".txt", ".sh")
        and not any(part.startswith(".") or part in ("__pycache__", "build", "venv")
                    for part in p.relative_to(ROOT).parts)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "../shared" not in text and "/work/shared" not in text
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to {target}, which a clone does not have"


def test_the_design_and_the_contracts_are_written_down() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    for needle in ("queued", "blocked", "The deadline is itself an intent", "never moot", "clamped",
                   "124", "130", "75", "page_size", "scan_interval_s", "node_id", "receipts/<xx>",
                   "two commits", "three commits", "standby"):
        assert needle.lower() in design.lower(), needle
    from ql_core.profiles import LIMIT_RANGES

    assert [k for k in LIMIT_RANGES if f"`{k}`" not in design] == []
    api = (ROOT / "docs" / "api.md").read_text()
    for needle in ("Runtime.open", "create=False", "submit(", "wait(", "status(", "events(", "list_runs(",
                   "settle(", "cancel(", "reconcile(", "supervisor(", "start_wakeups(", "load_config(",
                   "RunView", "AttemptView", "interval_s"):
        assert needle in api, needle


def test_every_command_and_its_exit_codes_are_in_cli_md() -> None:
    from ql_core.cli.main import all_commands, exit_codes

    cli = (ROOT / "docs" / "cli.md").read_text()
    for name in all_commands():
        assert re.search(rf"^### .*`ql {name}\b", cli, re.M), name
    for code in {c for name in all_commands() for c, _ in exit_codes(name) if c.isdigit()}:
        assert f"| {code} |" in cli, code


@pytest.mark.parametrize("path", TEXT, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_distribution_is_ql_runner_everywhere(path: Path) -> None:
    """`ql` on PyPI is an unrelated project: no install hint may name it."""
    text = path.read_text(errors="replace")
    wrong = re.findall(r"pip install\s+(?:-\S+\s+)*['\"]?ql(?:\[[^\]]*\])?['\"]?(?=[\s`'\")]|$)", text)
    wrong += re.findall(r"['\"]ql\[(?:cluster|watch|dev)\]['\"]", text)
    assert wrong == []


def test_setup_cfg_names_ql_runner_and_keeps_the_command() -> None:
    cfg = (ROOT / "setup.cfg").read_text()
    assert re.search(r"^name = ql-runner$", cfg, re.M)
    assert "ql = ql_core.cli.main:console_main" in cfg


def _readme_block(after: str, lang: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(re.escape(after) + r".*?```" + lang + r"\n(.*?)```", text, re.S)
    assert match, after
    return match.group(1)


def test_quickstart_runs_a_task_with_an_empty_home(tmp_path: Path) -> None:
    first = _readme_block("## Quickstart", "sh").strip()
    command = first.split("&& ql ", 1)[1]
    assert command == "run -- sh -c 'echo hello from ql'"
    home = tmp_path / "home"
    home.mkdir()
    out = subprocess.run([sys.executable, "-m", "ql_core.cli.main", "run", "--", "sh", "-c", "echo hello from ql"],
                         env=clean_env(home), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (0, "hello from ql\n", "")
    assert (home / ".local" / "state" / "ql" / "ql.db").is_file()


def test_the_embedding_example_recovers_its_run_after_sigkill(tmp_path: Path) -> None:
    host = _readme_block("Save this as `host.py`", "python")
    data = tmp_path / "myhost-ql"
    assert '"/tmp/myhost-ql"' in host
    script = tmp_path / "host.py"
    script.write_text(host.replace('"/tmp/myhost-ql"', repr(str(data))))
    env = clean_env(tmp_path)
    first = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    line = first.stdout.readline().split()
    assert line[0] == "run", line
    run_id = line[1]
    time.sleep(0.5)
    first.send_signal(signal.SIGKILL)  # the host dies with its task running
    first.communicate()
    second = subprocess.run([sys.executable, str(script), run_id], env=env, capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["failed", "3"]
