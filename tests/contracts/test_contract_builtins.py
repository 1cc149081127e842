"""The built-in plugins pass the same contract suites a third-party plugin must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql_core.testing import ExecutorContract, JournalBackendContract, ReceiptStoreContract, WakeupSourceContract


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


class TestEdgeSqliteJournal(JournalBackendContract):
    @pytest.fixture
    def make_backend(self):
        from ql_plugins.edge_sqlite.store import SqliteJournal

        return lambda tmp_path: SqliteJournal(f"sqlite:///{Path(tmp_path) / 'ql.db'}")


class TestWatchfilesWakeup(WakeupSourceContract):
    @pytest.fixture
    def make_source(self):
        from ql_plugins.watch_wakeup.plugin import WatchfilesSource

        return WatchfilesSource
