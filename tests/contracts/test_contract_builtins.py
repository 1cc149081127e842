"""The built-in plugins pass the same contract suites a third-party plugin must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql_core.testing import ExecutorContract, JournalBackendContract, ReceiptStoreContract, WakeupSourceContract
from tests.conftest import seed_data_dir


class TestFileReceiptStore(ReceiptStoreContract):
    @pytest.fixture
    def make_store(self):
        from ql_core.receipts.file_store import FileReceiptStore

        return lambda root: FileReceiptStore(root)


class TestLocalExecutor(ExecutorContract):
    @pytest.fixture
    def make_executor(self):
        from ql_executors.local_process.executor import LocalProcessExecutor

        return LocalProcessExecutor

    @pytest.fixture
    def executor_name(self) -> str:
        return "local"

    @pytest.fixture
    def node_data_dir(self, data_dir: Path) -> Path:
        return data_dir  # a copy of the session's migrated database (tests/conftest.py)


class TestEdgeSqliteJournal(JournalBackendContract):
    @pytest.fixture
    def make_backend(self, sqlite_template: Path):
        """A fresh store on a copy of the session's migrated database (the migration runs once)."""
        from ql_plugins.edge_sqlite.store import SqliteJournal

        def make(tmp_path: Path) -> SqliteJournal:
            seed_data_dir(Path(tmp_path) / "db", sqlite_template)
            return SqliteJournal(f"sqlite:///{Path(tmp_path) / 'db' / 'ql.db'}")

        return make


class TestWatchfilesWakeup(WakeupSourceContract):
    @pytest.fixture
    def make_source(self):
        from ql_plugins.watch_wakeup.plugin import WatchfilesSource

        return WatchfilesSource
