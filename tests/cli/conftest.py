"""Fixtures for the `ql` command's user-facing contract: real processes, real files, other users."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp dir other users can traverse (pytest's own tmp_path is 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="ql-cli-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
