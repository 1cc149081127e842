"""Contract test suites for the plugin seams (huey's ``StorageTests`` style).

Every built-in runs them, and so must a third-party plugin. Subclass a
contract in your own test module and provide its factory fixture::

    from ql_core.testing import ExecutorContract

    class TestSlurmExecutor(ExecutorContract):
        @pytest.fixture
        def make_executor(self):
            return lambda: SlurmExecutor()

        @pytest.fixture
        def executor_name(self):          # enables the end-to-end tests through a Runtime
            return "slurm"

pytest collects the inherited tests; each states a promise core relies on.
"""

from .artifact_store import ArtifactStoreContract
from .executor import ExecutorContract
from .journal import JournalBackendContract
from .receipt_store import ReceiptStoreContract
from .wakeup import WakeupSourceContract

__all__ = ["ArtifactStoreContract", "ExecutorContract", "JournalBackendContract", "ReceiptStoreContract", "WakeupSourceContract"]
