"""The ``file`` plugin: completion receipts as files under ``<data_dir>/receipts`` (ADR-0007 §2.4).

Its own plugin, so that choosing another executor (or disabling ``local``)
keeps the receipt store. Import-light: the store is built only when needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterReceiptStore, hookimpl

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.ports import ReceiptStore, RuntimeContext

__all__ = ["ql_register_receipt_stores", "ql_check_config"]

_NO_SETTINGS = "[plugin.file] takes no settings; receipts always live in <data_dir>/receipts: remove the table"


def _file_store(context: RuntimeContext) -> ReceiptStore:
    from ql_core.errors import ConfigError
    from ql_core.paths import ensure_private_dir, receipts_root
    from ql_core.receipts.file_store import FileReceiptStore

    if context.plugin_config("file"):
        raise ConfigError(_NO_SETTINGS)
    root = receipts_root(context.data_dir)
    if not context.existing_only:
        ensure_private_dir(root)
    # The shards up front: one fsync of the root instead of one per shard over the first tasks.
    return FileReceiptStore(root, create=not context.existing_only, shards_up_front=True)


@hookimpl
def ql_register_receipt_stores(register: RegisterReceiptStore) -> None:
    register("file", _file_store)


@hookimpl
def ql_check_config(config: Config) -> None:
    """Every command refuses a ``[plugin.file]`` table, not only the writers that build the store."""
    if config.plugin_settings.get("file"):
        from ql_core.errors import ConfigError

        raise ConfigError(_NO_SETTINGS)
