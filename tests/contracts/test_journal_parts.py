"""The journal port's four parts cover it exactly, and the contract suites follow the split.

A third-party store is read and tested part by part (docs/plugins.md §5, §7): that only holds while
every method of ``JournalBackend`` sits in exactly one part, the whole suite runs every part's tests
(none lost in the split), and every built-in store is every part.
"""

from __future__ import annotations

import inspect

import pytest

from ql_core.ports.journal import JOURNAL_PARTS, JournalBackend
from ql_core.testing import (
    CancelDispatchContract,
    JournalBackendContract,
    LogLedgerContract,
    ReceiptJournalContract,
    RunJournalContract,
)

PART_SUITES = (RunJournalContract, ReceiptJournalContract, CancelDispatchContract, LogLedgerContract)


def _methods(protocol: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(protocol, inspect.isfunction) if not name.startswith("_")}


def _tests(suite: type) -> set[str]:
    return {name for name in dir(suite) if name.startswith("test_")}


def test_every_method_of_the_port_is_in_exactly_one_part() -> None:
    own = [_methods(part) for part in JOURNAL_PARTS]
    assert sum(len(m) for m in own) == len(set().union(*own)), "a method sits in two parts"
    assert _methods(JournalBackend) - set().union(*own) == {"close"}
    assert [len(m) for m in own] == [10, 8, 4, 7]  # docs/plugins.md §5 lists them by part


def test_the_whole_suite_runs_every_parts_tests_and_the_parts_share_none() -> None:
    parts = [_tests(suite) for suite in PART_SUITES]
    assert sum(len(t) for t in parts) == len(set().union(*parts)), "a test sits in two part suites"
    assert set().union(*parts) <= _tests(JournalBackendContract)
    assert all(issubclass(JournalBackendContract, suite) for suite in PART_SUITES)


def _builtin_stores() -> list[type]:
    from ql_plugins.cluster_fenced.pg_store import PostgresJournal
    from ql_plugins.cluster_fenced.worker_store import WorkerJournal
    from ql_plugins.edge_sqlite.store import SqliteJournal

    return [SqliteJournal, PostgresJournal, WorkerJournal]


@pytest.mark.parametrize("store", _builtin_stores(), ids=lambda cls: cls.__name__)
def test_every_builtin_store_is_every_part(store: type) -> None:
    assert [part.__name__ for part in JOURNAL_PARTS if not issubclass(store, part)] == []
