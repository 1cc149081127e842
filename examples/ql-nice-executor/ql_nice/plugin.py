"""The plugin module ``ql.plugins`` points at. Keep it light: ``ql plugins`` imports it.

It registers one executor, ``nice``; the factory runs only when a runtime
selects it (``executor = "nice"`` in ql.toml) and reads ``[plugin.nice]``.
"""

from __future__ import annotations

from ql_core.hookspecs import hookimpl


def _nice_executor(context):  # called with a ql_core.ports.RuntimeContext
    from .executor import NiceExecutor, settings_from

    return NiceExecutor(settings_from(context.plugin_config("nice")))


@hookimpl
def ql_register_executors(register):
    register("nice", _nice_executor)


@hookimpl
def ql_check_config(config):  # every command that loads the config asks: a typo is refused by all
    table = config.plugin_settings.get("nice")
    if table is not None:
        from .executor import settings_from

        settings_from(dict(table))


@hookimpl
def ql_effective_settings(config):  # ql doctor shows what is in force, defaults filled in
    from .executor import settings_from

    settings = settings_from(dict(config.plugin_settings.get("nice", {})))
    return {"niceness": settings.niceness, "io_class": settings.io_class or "", "max_open_files": settings.max_open_files or 0}
