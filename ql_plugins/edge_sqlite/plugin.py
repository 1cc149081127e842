"""The ``edge-sqlite`` plugin: registers the SQL receipt journal (same transaction as the run).

Kept import-light: ``ql plugins`` loads this module and must not import SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterJournalBackend, hookimpl

if TYPE_CHECKING:
    from ql_core.interfaces import RuntimeContext

__all__ = ["ql_register_journal_backends"]


def _journal(context: RuntimeContext):  # type: ignore[no-untyped-def]
    from ql_core.journal import SqlReceiptJournal

    return SqlReceiptJournal(name="edge-sqlite")


@hookimpl
def ql_register_journal_backends(register: RegisterJournalBackend) -> None:
    register("edge-sqlite", _journal)
