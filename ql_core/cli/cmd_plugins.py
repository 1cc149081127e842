"""``ql plugins``: what is installed in ``ql.plugins``, what is active, what fails to load."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list installed plugins, the active ones, and load errors"


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import config_from_args
    from ql_core.errors import PluginError
    from ql_core.plugins import installed_plugins, load_plugin_host, select_plugin_names

    config = config_from_args(args)
    active = select_plugin_names(config.plugins)
    status = 0
    for plugin in installed_plugins():
        error = None
        if plugin.name in active:
            try:
                load_plugin_host([plugin.name], use_cache=False)
            except PluginError as exc:
                error, status = str(exc), 1
        state = "active" if plugin.name in active else "installed"
        if error:
            state = "error"
        out.emit({"name": plugin.name, "state": state, "target": plugin.value,
                  "distribution": plugin.distribution, "error": error},
                 f"{plugin.name:<16} {state:<10} {plugin.value}" + (f"\n    {error}" if error else ""))
    installed = {p.name for p in installed_plugins()}
    for name in active:
        if name not in installed:
            status = 1
            msg = f"plugin {name!r} is enabled by profile {config.profile.name!r} or the config but not installed"
            out.emit({"name": name, "state": "missing", "target": None, "distribution": None, "error": msg},
                     f"{name:<16} missing    {msg}")
    return status
