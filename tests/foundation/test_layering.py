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


# -- the import graph of the project's own modules ------------------------------------------------------------

PROJECT = ("ql_core", "ql_plugins", "ql_executors")


def _project_modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported project module, line) for every import statement in ``path``: module level, inside
    functions, and under ``if TYPE_CHECKING:`` too — a type that needs the other module is a
    dependency on it as much as a call is."""
    found = []
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level else node.module or "")
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                if target in modules:
                    found.append((target, node.lineno))
    return found


def _import_cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    modules = _project_modules()
    graph = {name: sorted({t for t, _ in _imports_of(name, path, modules) if t != name})
             for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(frozenset(component))
    return cycles


#: Import cycles left in files other branches own, each removed by the change named; an entry that no
#: longer occurs fails the test too, so it is deleted the day its cycle goes.
ALLOWED_CYCLES: set[frozenset[str]] = set()


def test_the_import_graph_finds_a_circle_when_there_is_one(tmp_path: Path) -> None:
    """The walker itself: a function-level import back and a type-only one both close a circle."""
    pkg = tmp_path / "ql_core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    modules = {"ql_core": pkg / "__init__.py", "ql_core.a": pkg / "a.py", "ql_core.b": pkg / "b.py"}
    assert _imports_of("ql_core.a", pkg / "a.py", modules) == [("ql_core.b", 2)]
    assert _imports_of("ql_core.b", pkg / "b.py", modules) == [("ql_core.a", 3)]


def test_no_import_cycle_among_project_modules() -> None:
    """ql_core, ql_plugins and ql_executors import each other without a circle — counting imports
    inside functions and type-only ones — so every module can be read, tested and replaced after
    the ones it depends on."""
    cycles = set(_import_cycles())
    assert sorted(sorted(c) for c in cycles - ALLOWED_CYCLES) == []
    assert sorted(sorted(c) for c in ALLOWED_CYCLES - cycles) == [], "a cycle is gone: delete its entry"


def test_core_imports_no_plugin_module() -> None:
    """ql_core imports nothing of ql_plugins or ql_executors — module level, inside functions and
    type-only alike: a plugin reaches core through the hooks (ql_register_commands for its
    commands), never core the plugin."""
    modules = _project_modules()
    hits = [f"{path.relative_to(ROOT)}:{line} imports {target}"
            for name, path in modules.items() if name.split(".")[0] == "ql_core"
            for target, line in _imports_of(name, path, modules) if target.split(".")[0] != "ql_core"]
    assert hits == []


# -- private names stay in their module ---------------------------------------------------------------------

#: Underscore names that are public API of the standard library: namedtuple's methods, os._exit.
PUBLIC_UNDERSCORE = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"})

#: Private names still used across modules in files other branches own; each goes with the change
#: named. An entry that no longer occurs fails the test too.
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(path: Path) -> list[tuple[int, str, str]]:
    """(line, name, how) for each private name of another module this file imports or calls.

    Imported: ``from <project module> import _x`` (or a private module). Called: ``obj._x(...)``
    on anything but ``self``/``cls``/``super()``, when this module defines no ``_x`` of its own
    (so the method is another module's) or ``obj`` is a name this module imported.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    own: set[str] = set()
    imported: set[str] = set()
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            project = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0]
                                                             in PROJECT))
            for alias in node.names:
                parts = alias.name.split(".")
                if isinstance(node, ast.Import) and parts[0] in PROJECT and any(_private(p) for p in parts):
                    hits.append((node.lineno, alias.name, "imports"))
                elif project and _private(alias.name):
                    hits.append((node.lineno, alias.name, "imports"))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, node.func.value
        if not _private(name) or name in PUBLIC_UNDERSCORE:
            continue
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            continue
        if (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name)
                and receiver.func.id == "super"):
            continue
        if name not in own or (isinstance(receiver, ast.Name) and receiver.id in imported):
            hits.append((node.lineno, f"{ast.unparse(node.func)}()", "calls"))
    return hits


def test_the_private_name_check_sees_imports_and_calls(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from ql_core.logs import _LogDir, LogKeeper\nfrom . import child\n"
                      "def _mine(): pass\n"
                      "def f(rt, x):\n    rt._spawn()\n    child._mine()\n    x._replace(a=1)\n    _mine()\n"
                      "class C:\n    def g(self):\n        self._h()\n    def _h(self):\n        pass\n")
    assert _private_uses(source) == [(1, "_LogDir", "imports"), (5, "rt._spawn()", "calls"),
                                     (6, "child._mine()", "calls")]


def test_no_private_name_is_used_across_product_modules() -> None:
    """A name with a leading underscore belongs to its module: product code neither imports one from
    another module nor calls one on another module's object (tests may). What another module needs
    is public, named so and documented."""
    found = set()
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = str(path.relative_to(ROOT))
            found.update((rel, name.removesuffix("()").rpartition(".")[2], f"{rel}:{line} {how} {name}")
                         for line, name, how in _private_uses(path))
    assert sorted(where for rel, name, where in found if (rel, name) not in ALLOWED_PRIVATE) == []
    used = {(rel, name) for rel, name, _where in found}
    assert sorted(ALLOWED_PRIVATE - used) == [], "a private use is gone: delete its entry"


def test_the_runtime_stays_a_thin_facade() -> None:
    """runtime.py forwards to the modules that own the protocols (node, submit, wait, reconciler, ...)."""
    assert len((CORE / "runtime.py").read_text().splitlines()) <= 250


#: A module past this many lines is doing more than one job: split it (migrations excepted: a
#: revision is written once and never edited; launcher.c is one static binary by design).
MODULE_MAX_LINES = 600


def test_no_module_outgrows_one_job() -> None:
    too_long = [f"{path.relative_to(ROOT)}: {n} lines"
                for package in PROJECT for path in sorted((ROOT / package).rglob("*.py"))
                if "migrations" not in path.parts
                and (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_MAX_LINES]
    assert too_long == []
