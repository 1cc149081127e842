"""Contract test suites every backend and third-party plugin runs (huey's ``StorageTests`` style).

Subclass a contract in your own test module and provide its factory fixture::

    from ql_core.testing import ExecutorContract

    class TestSlurmExecutor(ExecutorContract):
        @pytest.fixture
        def make_executor(self):
            return lambda: SlurmExecutor()

pytest collects the inherited tests; each one states a promise core relies on.
"""

from .executor import ExecutorContract
from .receipt_store import ReceiptStoreContract

__all__ = ["ExecutorContract", "ReceiptStoreContract"]
