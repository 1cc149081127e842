"""Layering you can see: core knows no executor's process details and issues no SQL outside ql_core/db.

Domain (states, outcome rules, records) → ports (the four seam protocols) →
adapters (plugins) → CLI. These checks read the source, so a change that
crosses a layer fails here with the file and line named.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "ql_core"

#: Keys of the local executor's handle: only that executor reads or writes them.
HANDLE_KEYS = ("boot_id", "pid", "pgid", "start_time", "process_start_time")
#: SQL as ql writes it (upper-case keywords), also in the constant parts of an f-string.
_SQL = re.compile(r"\b(SELECT\s|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b|"
                  r"CREATE\s+(TABLE|INDEX)\b|PRAGMA\s+\w)")


def _core_sources(*, outside_db: bool = True) -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py")
                  if not (outside_db and p.is_relative_to(CORE / "db")) and "__pycache__" not in p.parts)


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_core_never_names_the_local_executor() -> None:
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in _core_sources(outside_db=False)
            for n, line in enumerate(p.read_text().splitlines(), 1) if "local_process" in line]
    assert hits == []


@pytest.mark.parametrize("path", [p for p in _core_sources(outside_db=False)
                                  if not p.is_relative_to(CORE / "db" / "migrations")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_core_never_reads_a_handle(path: Path) -> None:
    """No handle key as a string literal (``["pid"]``) nor as an attribute (``attempt.pid``).

    Only the migrations name the old handle columns: revision 0002 moved them into the opaque handle.
    """
    hits = [f"line {n}: {value!r}" for n, value in _string_literals(path) if value in HANDLE_KEYS]
    tree = ast.parse(path.read_text())
    hits += [f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in HANDLE_KEYS]
    assert hits == []


@pytest.mark.parametrize("path", _core_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_sql_text_in_core_outside_ql_core_db(path: Path) -> None:
    hits = [f"line {n}: {value[:60]!r}" for n, value in _string_literals(path) if _SQL.search(value)]
    assert hits == []


def test_core_imports_no_orm_outside_ql_core_db_and_the_cli_maintenance_commands() -> None:
    """The ORM and migration machinery stay behind ql_core.db (and `ql doctor` / `ql db`)."""
    allowed = {CORE / "cli" / "cmd_doctor.py", CORE / "cli" / "cmd_db.py"}
    hits = []
    for path in _core_sources():
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.split(".")[0] in ("sqlalchemy", "sqlmodel", "alembic"):
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert hits == []


def test_ports_depend_on_nothing_but_the_domain() -> None:
    """ql_core.ports imports only the standard library, other ports and the domain records."""
    allowed = {"records", "states", "config", "receipts.codec", "ports"}
    for path in sorted((CORE / "ports").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                module = (node.module or "").split(".")
                target = module[0] if node.level == 2 else "ports"
                full = ".".join(module) if node.level == 2 else "ports"
                assert target in allowed or full in allowed, f"{path.name}:{node.lineno} imports {full}"


def test_a_reader_imports_nothing_heavy(tmp_path: Path) -> None:
    """A reader (create=False) loads no ORM or migration machinery, no loguru/asyncio, no launcher,
    no subprocess, no receipt codec: a status costs a SELECT, not those imports."""
    import subprocess
    import sys

    data = tmp_path / "data"
    setup = ("import sys\nfrom ql_core.config import load_config\nfrom ql_core.runtime import Runtime\n"
             "rt = Runtime.open(load_config(data_dir=sys.argv[1], environ={}, cwd=sys.argv[1]))\n"
             "rt.wait(rt.submit(['true'])); rt.close()\n")
    subprocess.run([sys.executable, "-c", setup, str(data)], check=True, timeout=60)
    probe = ("import sys\nfrom ql_core.config import load_config\nfrom ql_core.runtime import Runtime\n"
             "rt = Runtime.open(load_config(data_dir=sys.argv[1], environ={}, cwd=sys.argv[1]), create=False)\n"
             "[rt.status(v.run_id) for v in rt.list_runs()]; rt.close()\n"
             "heavy = ('sqlalchemy', 'sqlmodel', 'alembic', 'loguru', 'asyncio', 'subprocess', 'psycopg')\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in (\n"
             "    'ql_executors.local_process.executor', 'ql_core.receipts.codec', 'ql_core.consumer')))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(data)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_host_that_created_its_data_dir_keeps_no_migration_machinery(tmp_path: Path) -> None:
    """The first open of a fresh data dir migrates in a child process: the host itself (which may
    run for months with hundreds of tasks) never loads SQLAlchemy, SQLModel or Alembic (≈ 50 MiB)."""
    import subprocess
    import sys

    probe = ("import sys\nfrom ql_core.config import load_config\nfrom ql_core.runtime import Runtime\n"
             "rt = Runtime.open(load_config(data_dir=sys.argv[1], environ={}, cwd=sys.argv[1]))\n"
             "view = rt.run(['true']); rt.close()\n"
             "heavy = ('sqlalchemy', 'sqlmodel', 'alembic', 'pydantic', 'mako')\n"
             "print(view.status, sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "fresh")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "succeeded []"
    assert (tmp_path / "fresh" / "ql.db").stat().st_mode & 0o777 == 0o600
