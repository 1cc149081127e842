"""The ``local`` plugin: registers the ``local`` executor (one POSIX launcher per task).

Import-light on purpose (``ql plugins`` imports this module): the executor is
built by its factory only when a runtime needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterExecutor, hookimpl

if TYPE_CHECKING:
    from ql_core.ports import Executor, RuntimeContext

__all__ = ["ql_register_executors"]


def _executor(context: RuntimeContext) -> Executor:
    from ql_core.errors import ConfigError

    from .executor import LocalProcessExecutor

    settings = context.plugin_config("local")
    if settings:
        raise ConfigError(f"[plugin.local] has no setting {sorted(settings)[0]!r}; it takes none")
    return LocalProcessExecutor()


@hookimpl
def ql_register_executors(register: RegisterExecutor) -> None:
    register("local", _executor)
