"""The ``file`` plugin: completion receipts as files under ``<data_dir>/receipts`` (ADR-0007 §2.4).

Its own plugin, so that choosing another executor (or disabling ``local``)
keeps the receipt store. Import-light: the store is built only when needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterReceiptStore, hookimpl

if TYPE_CHECKING:
    from ql_core.ports import ReceiptStore, RuntimeContext

__all__ = ["ql_register_receipt_stores"]


def _file_store(context: RuntimeContext) -> ReceiptStore:
    from ql_core.errors import ConfigError
    from ql_core.paths import ensure_private_dir, receipts_root
    from ql_core.receipts.file_store import FileReceiptStore

    if context.plugin_config("file"):
        raise ConfigError("[plugin.file] takes no settings; receipts always live in <data_dir>/receipts")
    root = receipts_root(context.data_dir)
    if not context.existing_only:
        ensure_private_dir(root)
    return FileReceiptStore(root, create=not context.existing_only)


@hookimpl
def ql_register_receipt_stores(register: RegisterReceiptStore) -> None:
    register("file", _file_store)
