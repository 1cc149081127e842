"""What the plugin host reports about plugins it has not loaded: the entry points installed, and the
commands plugins register (``ql_register_commands``).

Apart from :mod:`ql_core.plugins` because a command that runs a task or reads a run needs neither:
each frozen dataclass costs ~0.3 ms of CPU to build at import (its generated methods are compiled),
paid by every ``ql`` process that imported them. Only a scan of the entry points (a plugin cache
miss, ``ql plugins``, an error naming what is installed) and a command that is not core's (``ql
--help``, ``ql worker``) import this module. The names stay importable from :mod:`ql_core.plugins`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import PluginError

__all__ = ["InstalledPlugin", "PluginCommand", "PluginCommands"]


@dataclass(frozen=True, slots=True)
class InstalledPlugin:
    """An entry point in ``ql.plugins``, described without importing it."""

    name: str
    value: str
    distribution: str | None


@dataclass(frozen=True, slots=True)
class PluginCommand:
    """``ql <name>`` as a plugin registered it: :meth:`load` gives its command module."""

    name: str
    plugin: str
    target: Any

    def load(self) -> Any:
        """The command module (a registered factory is called here, once per process)."""
        import types

        if isinstance(self.target, types.ModuleType) or not callable(self.target):
            return self.target
        try:
            return self.target()
        except Exception as exc:
            raise PluginError(f"command {self.name!r} of plugin {self.plugin!r} failed to load: "
                              f"{type(exc).__name__}: {exc}; reinstall that plugin's package, or disable it "
                              f"with QL_DISABLE_PLUGINS={self.plugin}") from exc


@dataclass(frozen=True, slots=True)
class PluginCommands:
    """What :func:`ql_core.plugins.plugin_commands` found: the commands by name, and one line per
    plugin that failed."""

    commands: dict[str, PluginCommand]
    problems: tuple[str, ...]
