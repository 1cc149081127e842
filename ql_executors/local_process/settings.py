"""``[plugin.local]`` values, checked without importing the executor.

Every command that loads a config with a ``[plugin.local]`` table checks it (``ql_check_config``),
readers included: this module must stay as light as the plugin module (no subprocess, no launcher).
"""

from __future__ import annotations

import os

__all__ = ["CONTAINMENT_CHOICES", "LAUNCHER_CHOICES", "SETTINGS", "run_as_user"]

LAUNCHER_CHOICES = ("auto", "compiled", "shell")
#: ``[plugin.local] containment`` (docs/launcher.md, "Containment").
CONTAINMENT_CHOICES = ("auto", "process-group")
#: The keys ``[plugin.local]`` accepts.
SETTINGS = ("cgroup_parent", "containment", "launcher", "run_as", "standby")


def run_as_user(name: object, *, here: bool = True) -> tuple[int, int]:
    """Validate ``[plugin.local] run_as``: an existing user other than root, and (``here``: this
    process will run tasks) a root host and setpriv."""
    import pwd
    import shutil

    from ql_core.errors import ConfigError

    if not isinstance(name, str) or not name:
        raise ConfigError('[plugin.local] run_as must be a user name, e.g. run_as = "qltask"')
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"[plugin.local] run_as: no user {name!r} on this system; create it or fix the name") from None
    if entry.pw_uid == 0:
        raise ConfigError("[plugin.local] run_as must not be root: it exists to run tasks as another user")
    if not here:
        return entry.pw_uid, entry.pw_gid
    if os.geteuid() != 0:
        raise ConfigError(f"[plugin.local] run_as needs the ql host to run as root (it runs as uid {os.geteuid()}); "
                          f"remove run_as or start the host as root")
    if shutil.which("setpriv") is None:
        raise ConfigError("[plugin.local] run_as needs setpriv (util-linux) on PATH")
    return entry.pw_uid, entry.pw_gid
