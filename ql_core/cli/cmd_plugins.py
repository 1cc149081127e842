"""``ql plugins``: what is installed in ``ql.plugins``, what is active, and every problem.

Problems (each one line, exit 1): an active plugin that fails to load or lacks what it needs
(``unavailable``: its package is not installed; the row names the install command), an
enabled plugin that is not installed, a plugin name declared by two
distributions, a seam name registered by two active plugins, and a seam the
config selects (``executor``, ``receipt_store``, ``journal``) that no active
plugin registers — for example because its plugin is disabled.
"""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list installed plugins, the active ones, and problems (load errors, duplicates, disabled but selected)"
EPILOG = ("--json prints one object per plugin {name, state: active|installed|unavailable|error|missing, target, "
          "distribution, error}, then one per problem {problem, name, detail}.")


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def _declarations() -> dict[str, list[tuple[str, str | None]]]:
    """Entry-point name -> every (target, distribution) that declares it (nothing is imported)."""
    from importlib import metadata

    from ql_core.plugins import ENTRY_POINT_GROUP

    found: dict[str, list[tuple[str, str | None]]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        entry = (ep.value, dist.name if dist else None)
        if entry not in found.setdefault(ep.name, []):
            found[ep.name].append(entry)
    return found


def _unavailable(host, config) -> str | None:  # type: ignore[no-untyped-def]
    """Why an active plugin cannot work here (its ``ql_check_config`` raised PluginError: a missing
    package, with the install command), or None."""
    from ql_core.errors import PluginError

    for impl in host.pm.hook.ql_check_config.get_hookimpls():
        try:
            impl.function(config=config)
        except PluginError as exc:
            return str(exc)
        except Exception:  # noqa: BLE001 - a config error stopped the command before; the host check reports the rest
            return None
    return None


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import config_from_args
    from ql_core.cli.main import classify
    from ql_core.plugins import check_plugin_config, explain_unregistered, installed_plugins, load_plugin_host, \
        select_plugin_names

    config = config_from_args(args, reports_plugins=True)
    present = {p.name for p in installed_plugins()}
    # A seam selected by name (executor = "nice") loads the plugin of that name: it is active too.
    active = select_plugin_names([*config.plugins, *(n for n in config.seam_plugins if n in present)])
    status = 0
    load_failed = False
    for plugin in installed_plugins():
        error = None
        state = "active" if plugin.name in active else "installed"
        try:
            # Every installed plugin, active or not: a misspelled hook name is found before it is enabled.
            alone = load_plugin_host([plugin.name], environ={}, use_cache=False)
        except Exception as exc:  # noqa: BLE001 - a plugin that cannot load is a row, not a crash
            error, status, state, load_failed = classify(exc, "plugins")[1], 1, "error", True
        else:
            if state == "active":
                error = _unavailable(alone, config)
                if error:
                    state, status = "unavailable", 1
        out.emit({"name": plugin.name, "state": state, "target": plugin.value,
                  "distribution": plugin.distribution, "error": error},
                 f"{plugin.name:<16} {state:<11} {plugin.value}" + (f"\n    {error}" if error else ""))
    installed = {p.name for p in installed_plugins()}
    for name in active:
        if name not in installed:
            status = 1
            msg = f"plugin {name!r} is enabled by profile {config.profile.name!r} or the config but not installed"
            out.emit({"name": name, "state": "missing", "target": None, "distribution": None, "error": msg},
                     f"{name:<16} missing     {msg}")

    problems: list[tuple[str, str, str]] = []
    for name, declared in sorted(_declarations().items()):
        if len(declared) > 1:
            who = "; ".join(f"{target} (distribution {dist or '?'})" for target, dist in declared)
            problems.append(("duplicate_plugin", name,
                             f"plugin name {name!r} is declared {len(declared)} times: {who}; no runtime loads it "
                             f"until one is uninstalled: uninstall the distribution you do not want"))
    # The plugins a runtime would load together: registrations collide only then.
    try:
        host = check_plugin_config(config)  # loads them; each also checks what it needs (its package)
    except Exception as exc:  # noqa: BLE001 - reported as a problem
        text = classify(exc, "plugins")[1]
        if "registered twice" in text:
            problems.append(("duplicate_registration", "-", text))
        elif not load_failed:  # not already shown as a plugin's own load error above
            problems.append(("load_error", "-", text))
        host = None
    if host is not None:
        for key, registry in (("executor", host.executors), ("receipt_store", host.receipt_stores),
                              ("journal", host.journal_backends)):
            name = getattr(config, key)
            if name is not None and name not in registry.names():
                kind = ("disabled_but_selected" if name in config.disabled_plugins
                        or name not in select_plugin_names([name]) else "unregistered_seam")
                problems.append((kind, name, explain_unregistered(key, name, config, host)))
    for kind, name, detail in problems:
        status = 1
        out.emit({"problem": kind, "name": name, "detail": detail}, f"problem: {detail}")
    return status
