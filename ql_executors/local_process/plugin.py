"""The ``local`` plugin: the LocalProcess executor and the ``file`` receipt store.

Import-light on purpose (``ql plugins`` imports this module): the executor and
the store are built by factories only when a runtime needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterExecutor, RegisterReceiptStore, hookimpl

if TYPE_CHECKING:
    from ql_core.interfaces import Executor, ReceiptStore, RuntimeContext

__all__ = ["ql_register_executors", "ql_register_receipt_stores"]


def _executor(context: RuntimeContext) -> Executor:
    from .executor import LocalProcessExecutor

    return LocalProcessExecutor()


def _file_store(context: RuntimeContext) -> ReceiptStore:
    from ql_core.paths import ensure_private_dir, receipts_root
    from ql_core.receipts.file_store import FileReceiptStore

    root = receipts_root(context.data_dir)
    ensure_private_dir(root)
    return FileReceiptStore(root)


@hookimpl
def ql_register_executors(register: RegisterExecutor) -> None:
    register("local_process", _executor)


@hookimpl
def ql_register_receipt_stores(register: RegisterReceiptStore) -> None:
    register("file", _file_store)
