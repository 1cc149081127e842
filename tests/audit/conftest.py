"""Fixtures for the receipt audit: a real data dir, a real migrated SQLite database, real files."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.audit.audit_support import DataDir, make_data_dir


@pytest.fixture
def audit_dir(tmp_path: Path, sqlite_template: Path) -> DataDir:
    return make_data_dir(tmp_path / "data", sqlite_template)
