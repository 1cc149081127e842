"""The test toolkit itself: pre-migrated data dirs are private copies, and there is one of each helper."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from ql_core.db.migrate import SCHEMA_HEAD

TESTS = Path(__file__).resolve().parents[1]


def _revision(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return ",".join(sorted(r[0] for r in conn.execute("SELECT version_num FROM alembic_version")))


def test_a_data_dir_holds_a_private_copy_of_the_migrated_template(data_dir: Path, sqlite_template: Path) -> None:
    db = data_dir / "ql.db"
    assert data_dir.stat().st_mode & 0o777 == 0o700 and db.stat().st_mode & 0o777 == 0o600
    assert db.stat().st_ino != sqlite_template.stat().st_ino
    assert _revision(db) == SCHEMA_HEAD
    before = sqlite_template.read_bytes()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE only_this_test (x)")
    conn.close()
    assert sqlite_template.read_bytes() == before  # the next test's copy is unchanged


@pytest.mark.fresh_data_dir
def test_a_fresh_data_dir_is_empty(data_dir: Path) -> None:
    assert data_dir.stat().st_mode & 0o777 == 0o700 and list(data_dir.iterdir()) == []


def _sources() -> list[Path]:
    return [p for p in TESTS.rglob("*.py") if "fixtures" not in p.parts]


def test_ql_is_defined_once() -> None:
    defining = [p.relative_to(TESTS).as_posix() for p in _sources()
                if re.search(r"^QL\s*=", p.read_text(), re.M)]
    assert defining == ["conftest.py"]


def test_helpers_are_imported_from_the_tests_package() -> None:
    """One import style: ``from tests.<folder>.<module> import ...``, never a bare sibling module found
    through sys.path (``from recovery_support import ...``). A script the tests run as a program
    (``python kill_host.py``) imports its siblings the way a program does."""
    siblings = {p.stem for p in _sources() if p.name != "__init__.py"}
    bare = re.compile(r"^\s*(?:from|import)\s+([a-z_][a-z0-9_]*)\b", re.M)
    found = sorted(f"{p.relative_to(TESTS)}: {m}" for p in _sources() for m in bare.findall(p.read_text())
                   if m in siblings and m != "tests" and "__main__" not in p.read_text())
    assert found == []
