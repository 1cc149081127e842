"""The built-in plugins pass the same contract suites a third-party plugin must pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql_core.testing import ExecutorContract, ReceiptStoreContract


class TestFileReceiptStore(ReceiptStoreContract):
    @pytest.fixture
    def make_store(self):
        from ql_core.receipts.file_store import FileReceiptStore

        return lambda root: FileReceiptStore(root)


class TestLocalProcessExecutor(ExecutorContract):
    @pytest.fixture
    def make_executor(self):
        from ql_executors.local_process.executor import LocalProcessExecutor

        return LocalProcessExecutor
