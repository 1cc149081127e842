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

pytest collects the inherited tests; each states a promise core relies on. The journal backend's
suite comes in parts as its port does (:class:`RunJournalContract`, :class:`ReceiptJournalContract`,
:class:`CancelDispatchContract`, :class:`LogLedgerContract`); :class:`JournalBackendContract` is all
of them plus the promises of a whole store, and is what a finished backend runs.
"""

from .artifact_store import ArtifactStoreContract
from .executor import ExecutorContract
from .journal import (
    CancelDispatchContract,
    JournalBackendContract,
    LogLedgerContract,
    ReceiptJournalContract,
    RunJournalContract,
)
from .receipt_store import ReceiptStoreContract
from .wakeup import WakeupSourceContract

__all__ = [
    "ArtifactStoreContract",
    "ExecutorContract",
    "JournalBackendContract",
    "RunJournalContract",
    "ReceiptJournalContract",
    "CancelDispatchContract",
    "LogLedgerContract",
    "ReceiptStoreContract",
    "WakeupSourceContract",
]
