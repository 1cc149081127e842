"""The ``local`` plugin: registers the ``local`` executor (one POSIX launcher per task).

Import-light on purpose (``ql plugins`` imports this module): the executor is
built by its factory only when a runtime needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ql_core.hookspecs import RegisterExecutor, hookimpl

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.ports import Executor, RuntimeContext

__all__ = ["ql_register_executors", "ql_check_config", "ql_effective_settings", "ql_doctor_checks"]


def _containment(settings: dict[str, Any]) -> tuple[str, str | None]:
    """``(containment, cgroup_parent)`` of a ``[plugin.local]`` table; ConfigError naming the key."""
    from ql_core.errors import ConfigError

    from .settings import CONTAINMENT_CHOICES

    containment = settings.get("containment", "auto")
    if containment not in CONTAINMENT_CHOICES:
        raise ConfigError(f"[plugin.local] containment must be one of {', '.join(map(repr, CONTAINMENT_CHOICES))}, "
                          f"not {containment!r}")
    parent = settings.get("cgroup_parent")
    if parent is not None and (not isinstance(parent, str) or not parent.startswith("/")):
        raise ConfigError('[plugin.local] cgroup_parent must be an absolute path of a cgroup v2 directory, '
                          'e.g. cgroup_parent = "/sys/fs/cgroup/ql"')
    return containment, parent


def _settings(settings: dict[str, Any], *, here: bool = True) -> tuple[str, bool, tuple[int, int] | None]:
    """``(launcher, standby, run_as ids)`` of a ``[plugin.local]`` table; ConfigError naming the key.
    ``here``: this process runs tasks (run_as then also needs root and setpriv)."""
    from ql_core.errors import ConfigError, unknown_setting

    from .settings import LAUNCHER_CHOICES, SETTINGS, run_as_user

    bad = unknown_setting("plugin.local", settings, SETTINGS)
    if bad is not None:
        raise bad
    _containment(settings)
    launcher = settings.get("launcher", "auto")
    if launcher not in LAUNCHER_CHOICES:
        raise ConfigError(f"[plugin.local] launcher must be one of {', '.join(map(repr, LAUNCHER_CHOICES))}, "
                          f"not {launcher!r}")
    standby = settings.get("standby", True)
    if not isinstance(standby, bool):
        raise ConfigError("[plugin.local] standby must be true or false (docs/launcher.md: standby launchers)")
    run_as = settings.get("run_as")
    return launcher, standby, (run_as_user(run_as, here=here) if run_as is not None else None)


def _executor(context: RuntimeContext) -> Executor:
    from ql_core.errors import ConfigError

    from .compiled import CompiledLauncherError
    from .executor import LocalProcessExecutor

    settings = context.plugin_config("local")
    launcher, standby, run_as_ids = _settings(settings)
    containment, cgroup_parent = _containment(settings)
    try:
        return LocalProcessExecutor(run_as=run_as_ids, launcher=launcher, standby=standby, containment=containment,
                                    cgroup_parent=cgroup_parent)
    except CompiledLauncherError as exc:  # only launcher = "compiled" builds here
        raise ConfigError(f"[plugin.local] launcher = \"compiled\": {exc}; install the ql-runner wheel for this "
                          f"machine or a C compiler (e.g. gcc) "
                          f"or use launcher = \"auto\" or \"shell\"") from None


@hookimpl
def ql_register_executors(register: RegisterExecutor) -> None:
    register("local", _executor)


@hookimpl
def ql_check_config(config: Config) -> None:
    """Every command refuses a ``[plugin.local]`` key or value the executor would refuse (a reader
    run by another user than the root host is not refused for run_as needing root)."""
    _settings(dict(config.plugin_settings.get("local", {})), here=False)


@hookimpl
def ql_effective_settings(config: Config) -> dict[str, object]:
    """``[plugin.local]`` in force: containment and cgroup_parent (empty: found), launcher, standby and
    run_as (empty: tasks run as the host's user)."""
    table = dict(config.plugin_settings.get("local", {}))
    launcher, standby, _ids = _settings(table, here=False)
    containment, parent = _containment(table)
    return {"cgroup_parent": parent or "", "containment": containment, "launcher": launcher,
            "run_as": table.get("run_as", ""), "standby": standby}


@hookimpl
def ql_doctor_checks(config: Config) -> list[tuple[str, bool, str]]:
    """``containment``: cgroup v2 (with its parent) or the process group (with the reason).
    ``launcher``: which launcher this config's tasks get on this machine and why (the shipped
    one, one built here, or the shell script), as :func:`.compiled.which_launcher` finds it with
    doctor's own environment; never builds it. Failed only for ``launcher = "compiled"`` with none."""
    if config.executor != "local":
        return []
    import os

    from .compiled import which_launcher

    from .containment import find_containment

    settings = dict(config.plugin_settings.get("local", {}))
    launcher, standby, _run_as = _settings(settings, here=False)
    found = which_launcher(os.environ, launcher)
    detail = found.detail
    if found.kind == "compiled":
        detail += "; standby launchers " + ("on" if standby else "off ([plugin.local] standby = false)")
    containment = find_containment(*_containment(settings), create=False)
    return [("launcher", found.usable, detail), ("containment", True, containment.describe())]
