"""An SQLite too old for the schema is refused with the fix named, not a bare syntax error."""

from __future__ import annotations

import sqlite3

import pytest

from ql_core.errors import DatabaseError
from ql_plugins.edge_sqlite.connection import MIN_SQLITE_VERSION, check_sqlite_version


def test_an_sqlite_before_generated_columns_is_refused_naming_both_versions() -> None:
    with pytest.raises(DatabaseError) as err:
        check_sqlite_version((3, 30, 1))
    assert "3.31.0 or newer" in str(err.value) and "3.30.1" in str(err.value)


def test_the_oldest_supported_sqlite_and_this_one_are_accepted() -> None:
    check_sqlite_version(MIN_SQLITE_VERSION)
    check_sqlite_version(sqlite3.sqlite_version_info)

