"""The ``edge-sqlite`` plugin: the run store of the edge and standalone profiles, in one SQLite file.

Kept import-light: ``ql plugins`` loads this module; the store itself (and
``sqlite3``) is imported only when a runtime builds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterJournalBackend, hookimpl

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.ports import JournalBackend, RuntimeContext

__all__ = ["ql_register_journal_backends", "ql_check_config"]


def _journal(context: RuntimeContext) -> JournalBackend:
    from .store import SqliteJournal

    return SqliteJournal.from_context(context)


@hookimpl
def ql_register_journal_backends(register: RegisterJournalBackend) -> None:
    register("edge-sqlite", _journal)


@hookimpl
def ql_check_config(config: Config) -> None:
    """Every command refuses a ``[plugin.edge-sqlite]`` table, as the store itself does."""
    if config.plugin_settings.get("edge-sqlite"):
        from ql_core.errors import ConfigError

        raise ConfigError(f"[plugin.edge-sqlite] takes no settings (got {', '.join(sorted(config.plugin_settings['edge-sqlite']))}); "
                          f"use database_url and [limits] busy_timeout_ms instead")
