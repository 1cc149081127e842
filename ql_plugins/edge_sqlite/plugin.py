"""The ``edge-sqlite`` plugin: the run store of the edge and standalone profiles, in one SQLite file.

Kept import-light: ``ql plugins`` loads this module; the store itself (and
``sqlite3``) is imported only when a runtime builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterJournalBackend, hookimpl

if TYPE_CHECKING:
    from ql_core.ports import JournalBackend, RuntimeContext

__all__ = ["ql_register_journal_backends"]


def _journal(context: RuntimeContext) -> JournalBackend:
    from .store import SqliteJournal

    return SqliteJournal.from_context(context)


@hookimpl
def ql_register_journal_backends(register: RegisterJournalBackend) -> None:
    register("edge-sqlite", _journal)
