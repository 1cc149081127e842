"""docs/cli.md against the product (issue 26, acceptance): its command table against the argparse
parser (every subcommand, every option of each), its event table against ``ql_core.event_types``,
and that list against the event types the code can write (Python and the cluster's SQL functions)."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from ql_core.event_types import ENDED_STATES, EVENT_TYPES
from ql_core.states import RUN_TERMINAL

ROOT = Path(__file__).resolve().parents[2]
CLI_MD = ROOT / "docs" / "cli.md"
GLOBAL_OPTIONS = {"--data-dir", "--config", "--profile", "--json", "-h", "--help"}


def _between(marker: str) -> str:
    text = CLI_MD.read_text()
    match = re.search(rf"<!-- {marker} -->\n(.*?)<!-- /{marker} -->", text, re.S)
    assert match, f"docs/cli.md has no <!-- {marker} --> table"
    return match.group(1)


def _table_rows(marker: str) -> list[list[str]]:
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in _between(marker).splitlines() if line.startswith("|")]
    return rows[2:]  # without the header and its rule


def _leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    from ql_core.cli.main import build_parser

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(actions[0].choices) if actions else {}

    return subparsers(build_parser())


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o not in GLOBAL_OPTIONS}


def test_the_command_table_lists_every_subcommand_and_option_of_the_parser() -> None:
    documented: dict[str, set[str]] = {}
    for command, _arguments, options in _table_rows("commands"):
        name = re.fullmatch(r"`ql ([a-z-]+)`", command)
        assert name, f"not a command cell: {command!r}"
        documented[name.group(1)] = set(re.findall(r"`(-[-\w]+)", options)) | set(re.findall(r"\((-\w)\)", options))
        documented[name.group(1)] |= set(re.findall(r"\(`(-\w)`\)", options))
    parsers = _leaf_parsers()
    assert sorted(documented) == sorted(parsers), "docs/cli.md's command table and the parser's subcommands differ"
    drift = {name: (sorted(_options(parser) - documented[name]), sorted(documented[name] - _options(parser)))
             for name, parser in parsers.items() if _options(parser) != documented[name]}
    assert drift == {}, "command: (options the table lacks, options the parser lacks)"


def test_every_command_has_its_section() -> None:
    text = CLI_MD.read_text()
    for name in _leaf_parsers():
        assert re.search(rf"^### .*`ql {name}\b", text, re.M), name


def test_the_event_table_is_the_list_of_event_types() -> None:
    documented = [t for row in _table_rows("event-types") for t in re.findall(r"`([a-z_]+\.[a-z_]+)`", row[0])]
    assert len(documented) == len(set(documented)), "an event type is listed twice"
    assert sorted(documented) == sorted(EVENT_TYPES)
    assert set(ENDED_STATES) == RUN_TERMINAL


def test_design_md_names_every_event_type() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    assert [t for t in EVENT_TYPES if f"`{t}`" not in design] == []


def _python_event_types() -> set[str]:
    """Event types the Python code writes: the first argument of ``EventSpec(...)``, ``type=`` of a
    ``RunEventInfo(...)``, and the ``*_EVENT`` constants they use; an f-string ``f"run.{status}"``
    stands for every ended state."""
    found: set[str] = set()
    constants: dict[str, str] = {}
    sources = [p for base in ("ql_core", "ql_plugins") for p in (ROOT / base).rglob("*.py")
               if "testing" not in p.relative_to(ROOT).parts]
    trees = [ast.parse(p.read_text(), str(p)) for p in sources]
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str) and re.fullmatch(r"[a-z]+\.[a-z_]+", node.value.value):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = node.value.value

    def value(expr: ast.expr) -> set[str]:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.Name) and expr.id in constants:
            return {constants[expr.id]}
        if isinstance(expr, ast.Attribute) and expr.attr in constants:
            return {constants[expr.attr]}
        if isinstance(expr, ast.Attribute) and expr.attr == "type":
            return set()  # a copy of an event's type (RunEventInfo(type=e.type)): counted where it was made
        if isinstance(expr, ast.JoinedStr) and isinstance(expr.values[0], ast.Constant):
            prefix = expr.values[0].value
            return {f"{prefix}{state}" for state in ENDED_STATES}
        raise AssertionError(f"an event type the test cannot read: {ast.dump(expr)[:120]}")

    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "EventSpec" and node.args:
                found |= value(node.args[0])
            if name == "RunEventInfo":
                for keyword in node.keywords:
                    if keyword.arg == "type":
                        found |= value(keyword.value)
    return found


def _sql_event_types() -> set[str]:
    """Event types the cluster's SQL functions write: ``ql__event(run, seq, 'type', ...)``; a
    ``'run.' || v_status`` stands for every ended state."""
    found: set[str] = set()
    for path in (ROOT / "ql_core" / "db" / "migrations").rglob("*.py"):
        text = path.read_text()
        found |= set(re.findall(r"ql__event\([^,]+,[^,]+,\s*'([a-z_]+\.[a-z_]+)'", text))
        for prefix in re.findall(r"ql__event\([^,]+,[^,]+,\s*'([a-z_]+\.)'\s*\|\|", text):
            found |= {f"{prefix}{state}" for state in ENDED_STATES}
    return found


def test_the_code_writes_exactly_the_listed_event_types() -> None:
    written = _python_event_types() | _sql_event_types()
    assert sorted(written - set(EVENT_TYPES)) == [], "written but not in ql_core.event_types (nor docs/cli.md)"
    assert sorted(set(EVENT_TYPES) - written) == [], "listed but nothing writes it any more"
