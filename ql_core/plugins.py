"""Plugin host: stevedore loads the named plugins, pluggy calls them.

Only plugins that the profile and config name are imported. A missing name or
a plugin whose import raises is fatal, with a message that names the plugin,
the underlying error, what is installed and how to fix it. ``QL_PLUGINS``
(comma-separated allow-list) and ``QL_DISABLE_PLUGINS`` (deny-list) narrow
the set without editing the config.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, TypeVar

import pluggy

from .errors import ConfigError, PluginError, QlError
from .hookspecs import PROJECT_NAME, QlHookSpecs
from .plugin_cache import PLUGIN_CACHE_ENV, read_cached_group, write_cached_group

if TYPE_CHECKING:
    from .config import Config
    from .plugin_records import InstalledPlugin, PluginCommand, PluginCommands
    from .ports import ArtifactStore, Executor, JournalBackend, ReceiptStore, RunEventInfo, RuntimeContext, WakeupSource

__all__ = [
    "ENTRY_POINT_GROUP",
    "InstalledPlugin",
    "Registry",
    "PluginHost",
    "installed_plugins",
    "select_plugin_names",
    "load_plugin_host",
    "check_config_plugins",
    "explain_unregistered",
    "check_plugin_names",
    "require_selected_seams",
    "check_plugin_config",
    "needs_plugin_check",
    "check_extra_limits",
    "PluginCommand",
    "PluginCommands",
    "plugin_commands",
]

ENTRY_POINT_GROUP = "ql.plugins"
T = TypeVar("T")

#: Names of :mod:`ql_core.plugin_records`, still importable from here (built on first access only:
#: a run or a read never pays for their dataclasses).
_RECORDS = ("InstalledPlugin", "PluginCommand", "PluginCommands")


def __getattr__(name: str) -> Any:
    if name in _RECORDS:
        from . import plugin_records

        return getattr(plugin_records, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def installed_plugins() -> list[InstalledPlugin]:
    """Every plugin declared in the entry-point group, sorted by name (nothing is imported)."""
    from importlib import metadata  # ~10 ms: only when the group is really scanned

    from .plugin_records import InstalledPlugin

    found: dict[str, InstalledPlugin] = {}

    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        found.setdefault(ep.name, InstalledPlugin(ep.name, ep.value, dist.name if dist else None))
    return sorted(found.values(), key=lambda p: p.name)


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def select_plugin_names(wanted: Iterable[str], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Apply ``QL_PLUGINS`` (allow-list) and ``QL_DISABLE_PLUGINS`` to the wanted names."""
    env = os.environ if environ is None else environ
    names = list(dict.fromkeys(wanted))
    allow = _split(env.get("QL_PLUGINS"))
    if allow:
        names = [n for n in names if n in allow]
    deny = set(_split(env.get("QL_DISABLE_PLUGINS")))
    return tuple(n for n in names if n not in deny)


class Registry(Generic[T]):
    """Name -> factory, filled by one registration hook; duplicate names are an error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[[RuntimeContext], T]] = {}
        self._owner: dict[str, str] = {}
        self._current_plugin = "?"

    def register(self, name: str, factory: Callable[[RuntimeContext], T]) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {self._current_plugin!r} registered a {self.kind} without a name")
        if name in self._factories:
            raise PluginError(f"{self.kind} {name!r} is registered twice: by plugin "
                              f"{self._owner[name]!r} and by {self._current_plugin!r}; disable one "
                              f"(QL_DISABLE_PLUGINS) or remove it from the config")
        self._factories[name] = factory
        self._owner[name] = self._current_plugin

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, context: RuntimeContext) -> T:
        try:
            factory = self._factories[name]
        except KeyError:
            have = ", ".join(self.names()) or "none"
            raise PluginError(f"{self.kind} {name!r} not found; registered: {have}; "
                              f"is the plugin that provides it installed and enabled?") from None
        try:
            return factory(context)
        except Exception as exc:
            if _written_for_users(exc):
                # A one-line error written for users: its [plugin.<name>] table is wrong, or the store
                # it opens is unusable (permissions, a symlink, a damaged database) — not a broken package.
                raise
            raise PluginError(f"{self.kind} {name!r} from plugin {self._owner[name]!r} failed to start: "
                              f"{type(exc).__name__}: {exc}; reinstall that plugin's package") from exc


def _written_for_users(exc: Exception) -> bool:
    """Is ``exc`` ql's or a store's own error (its message names the fix)? The ports are imported only
    now that a factory failed: building the seams of every start does not pay for them."""
    from .ports.artifact_store import ArtifactStoreError
    from .ports.journal import StoreError
    from .ports.receipt_store import ReceiptStoreError

    return isinstance(exc, (QlError, StoreError, ReceiptStoreError, ArtifactStoreError))


class PluginHost:
    """The loaded plugins behind a small typed facade; core never calls ``pm.hook`` itself.

    A plain class (it was a ``@dataclass(eq=False, repr=False)``: the same ``__init__``, compared by
    identity, the default repr): a dataclass compiles its ``__init__`` at import, ~0.4 ms of every
    start that loads plugins (``ql run`` included)."""

    def __init__(self, pm: pluggy.PluginManager, loaded: tuple[str, ...], environ: Mapping[str, str] | None = None,
                 executors: Registry[Executor] | None = None, receipt_stores: Registry[ReceiptStore] | None = None,
                 journal_backends: Registry[JournalBackend] | None = None,
                 wakeup_sources: Registry[WakeupSource] | None = None,
                 artifact_stores: Registry[ArtifactStore] | None = None,
                 _failed_observers: set[str] | None = None) -> None:
        self.pm = pm
        self.loaded = loaded
        #: The environment whose QL_PLUGINS / QL_DISABLE_PLUGINS applied (for explaining a missing name).
        self.environ: Mapping[str, str] = {} if environ is None else environ
        self.executors: Registry[Executor] = Registry("executor") if executors is None else executors
        self.receipt_stores: Registry[ReceiptStore] = (Registry("receipt store") if receipt_stores is None
                                                       else receipt_stores)
        self.journal_backends: Registry[JournalBackend] = (Registry("journal backend") if journal_backends is None
                                                           else journal_backends)
        self.wakeup_sources: Registry[WakeupSource] = (Registry("wake-up source") if wakeup_sources is None
                                                       else wakeup_sources)
        self.artifact_stores: Registry[ArtifactStore] = (Registry("artifact store") if artifact_stores is None
                                                         else artifact_stores)
        #: Observers that raised once (logged once each).
        self._failed_observers: set[str] = set() if _failed_observers is None else _failed_observers

    def _collect(self) -> None:
        """Run each registration hook plugin by plugin, so duplicates name their owner."""
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            for registry, hook_name in (
                (self.executors, "ql_register_executors"),
                (self.receipt_stores, "ql_register_receipt_stores"),
                (self.journal_backends, "ql_register_journal_backends"),
                (self.wakeup_sources, "ql_register_wakeup_sources"),
                (self.artifact_stores, "ql_register_artifact_stores"),
            ):
                registry._current_plugin = name
                caller = self.pm.subset_hook_caller(hook_name, remove_plugins=[
                    p for p in self.pm.get_plugins() if p is not plugin])
                caller(register=registry.register)

    def notify_event(self, event: RunEventInfo) -> None:
        """Tell each observer about a committed event, one by one.

        An observer that raises is logged (once per plugin) and skipped: it
        never stops the other observers and never changes a run.
        """
        for impl in self.pm.hook.ql_run_event.get_hookimpls():
            try:
                impl.function(event=event)
            except Exception as exc:  # noqa: BLE001 - observers must not change outcomes
                if impl.plugin_name not in self._failed_observers:
                    self._failed_observers.add(impl.plugin_name)
                    from .log import logger

                    logger.warning("observer {} failed in ql_run_event: {}; it keeps being called, other "
                                   "observers are unaffected", impl.plugin_name, type(exc).__name__)


def _installed_hint() -> str:
    names = [p.name for p in installed_plugins()]
    return ", ".join(names) if names else "none"


def _import_target(name: str, value: str) -> Any:
    """Import an entry point's ``module:attr`` target exactly as stevedore would."""
    import importlib

    module, _, attrs = value.partition(":")
    try:
        target: Any = importlib.import_module(module.strip())
        for attr in attrs.strip().split(".") if attrs.strip() else ():
            target = getattr(target, attr)
    except Exception as exc:
        raise PluginError(_load_failure(name, value, exc)) from exc
    return target


def _load_failure(name: str, value: str, exc: BaseException) -> str:
    return (f"plugin {name!r} ({value}) failed to load: {type(exc).__name__}: {exc}; fix or reinstall the "
            f"package that provides it, or disable it with QL_DISABLE_PLUGINS={name}")


def _stevedore_load(selected: tuple[str, ...]) -> list[tuple[str, Any]]:
    """stevedore loads the named entry points (fatal, explained errors)."""
    from stevedore import NamedExtensionManager

    missing: list[str] = []

    def on_missing(names_missing: Iterable[str]) -> None:
        missing.extend(sorted(names_missing))

    def on_failure(_manager: Any, entry_point: Any, exc: BaseException) -> None:
        raise PluginError(_load_failure(entry_point.name, entry_point.value, exc)) from exc

    _refuse_duplicate_names(selected)
    manager = NamedExtensionManager(
        namespace=ENTRY_POINT_GROUP,
        names=list(selected),
        invoke_on_load=False,
        name_order=True,
        on_load_failure_callback=on_failure,
        on_missing_entrypoints_callback=on_missing,
    )
    if missing:
        raise PluginError(
            f"plugin {missing[0]!r} not found in entry-point group {ENTRY_POINT_GROUP!r}; "
            f"installed: {_installed_hint()}; is the package that provides it installed "
            f"(pip install ...)? Otherwise remove it from the config's plugins"
        )
    return [(ext.name, ext.plugin) for ext in manager]


def load_plugin_host(names: Iterable[str], environ: Mapping[str, str] | None = None, *,
                     optional: Iterable[str] = (), use_cache: bool = True) -> PluginHost:
    """Load exactly the named plugins (after the env switches) and collect their registrations.

    ``optional`` names are loaded when a plugin of that name is installed: a seam selected by
    name (``executor = "nice"``) loads the plugin called ``nice`` without listing it in ``plugins``.

    stevedore finds and loads the entry points. What it found is remembered in a small cache
    (``$XDG_CACHE_HOME/ql``, keyed by the interpreter and the modification times of every import
    path, so installing, removing or upgrading a distribution invalidates it); on a hit the same
    targets are imported directly, which spares every start the scan of all installed
    distributions (~13 ms, most of a `ql status`). ``QL_PLUGIN_CACHE=off`` disables it.
    """
    env = dict(os.environ if environ is None else environ)
    cached = read_cached_group(env) if use_cache else None
    wanted = list(names)
    extra = [n for n in optional if n not in wanted]
    if extra:
        installed = set(cached) if cached is not None else {p.name for p in installed_plugins()}
        wanted += [n for n in extra if n in installed]
    selected = select_plugin_names(wanted, env)
    if cached is not None and all(name in cached for name in selected):
        loaded = [(name, _import_target(name, cached[name])) for name in selected]
    else:
        loaded = _stevedore_load(selected)
        if use_cache:
            write_cached_group(env, {p.name: p.value for p in installed_plugins()})
    return _host_of(loaded, env)


def _host_of(loaded: list[tuple[str, Any]], env: Mapping[str, str]) -> PluginHost:
    """One pluggy manager with the loaded plugins, registrations collected."""

    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(QlHookSpecs)
    for name, plugin in loaded:
        try:
            pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"plugin {name!r} cannot be registered: {exc}") from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(_unknown_hook(pm, loaded, exc)) from exc
    host = PluginHost(pm=pm, loaded=tuple(name for name, _plugin in loaded), environ=env)
    host._collect()
    return host


def _unknown_hook(pm: pluggy.PluginManager, loaded: list[tuple[str, Any]], exc: Exception) -> str:
    """One line for an implementation of a hook ql does not define (``ql_register_executer``): the
    plugin, the hook, the nearest real hook name (difflib) and the fix."""
    import difflib

    specs = sorted(name for name in dir(QlHookSpecs) if name.startswith("ql_"))
    for name, plugin in loaded:
        for attr in dir(plugin):
            if attr in specs or pm.parse_hookimpl_opts(plugin, attr) is None:
                continue
            close = difflib.get_close_matches(attr, specs, n=1)
            guess = f"; did you mean {close[0]!r}?" if close else ""
            where = getattr(plugin, "__name__", type(plugin).__name__)
            return (f"plugin {name!r} implements hook {attr!r}, which ql does not define{guess} Fix the name "
                    f"in {where} (the hooks: ql_core.hookspecs), or disable it with QL_DISABLE_PLUGINS={name}")
    return f"a plugin implements a hook ql does not define: {exc}; see ql_core.hookspecs for the hook names"


def _refuse_duplicate_names(selected: Iterable[str]) -> None:
    """A plugin name two distributions declare: which one loads is an accident, so neither does."""
    from importlib import metadata

    wanted = set(selected)
    seen: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in wanted:
            continue
        dist = getattr(ep, "dist", None)
        where = f"{ep.value} (distribution {dist.name if dist else '?'})"
        if ep.name in seen and seen[ep.name] != where:
            raise PluginError(f"plugin name {ep.name!r} is declared twice in {ENTRY_POINT_GROUP!r}: {seen[ep.name]} "
                              f"and {where}; uninstall the distribution you do not want (`ql plugins` shows both)")
        seen[ep.name] = where


def explain_unregistered(key: str, name: str, config: Config, host: PluginHost) -> str:
    """One line for a selected seam name no loaded plugin registered: what is there and the fix."""
    from .config import SEAM_KEYS

    env = host.environ
    kind = SEAM_KEYS.get(key, key)
    registry = {"executor": host.executors, "receipt_store": host.receipt_stores,
                "journal": host.journal_backends, "artifact_store": host.artifact_stores}.get(key)
    have = ", ".join(registry.names()) if registry is not None and registry.names() else "none"
    installed = {p.name for p in installed_plugins()}
    why = ""
    # The fix undoes the cause: an environment variable is fixed in the environment, not in ql.toml.
    fix = (f"set {key} = \"<one of those>\" in {config.source}, or install the package that provides {name!r} "
           f"and add its plugin to plugins = [...]")
    if name in config.disabled_plugins:
        why = f"; plugin {name!r} is disabled by disable_plugins in {config.source}"
        fix = f"remove {name!r} from disable_plugins in {config.source}, or select another {kind}"
    elif name in _split(env.get("QL_DISABLE_PLUGINS")):
        why = f"; plugin {name!r} is disabled by QL_DISABLE_PLUGINS"
        fix = f"remove {name!r} from QL_DISABLE_PLUGINS (or unset it)"
    elif _split(env.get("QL_PLUGINS")) and name not in _split(env.get("QL_PLUGINS")):
        why = f"; QL_PLUGINS does not allow plugin {name!r}"
        fix = f"add {name!r} to QL_PLUGINS (or unset it)"
    elif name not in installed:
        why = f"; no installed plugin is called {name!r} (installed: {_installed_hint()})"
    return (f"{kind} {name!r} is not registered by the loaded plugins "
            f"({', '.join(host.loaded) or 'none'}){why}; registered {kind}s: {have}. Fix: {fix}")


def check_plugin_names(config: Config, environ: Mapping[str, str] | None = None) -> None:
    """Refuse (:class:`~ql_core.errors.ConfigError`, exit 2) a plugin name that names no installed plugin:
    a ``[plugin.<name>]`` table, an entry of ``disable_plugins``, ``QL_PLUGINS`` or ``QL_DISABLE_PLUGINS``.

    Each would otherwise be ignored without a word: ``[plugin.lcoal] run_as = "nobody"`` left the
    tasks running as root. Checked against the plugin cache first (no scan of the installed
    distributions when it knows every name), then against the entry points themselves.
    """
    env = os.environ if environ is None else environ
    named = [(f"[plugin.{name}] in {config.source}", name, f"fix the table's name in {config.source}, or install "
              f"the package that provides that plugin") for name in config.plugin_settings]
    named += [(f"disable_plugins in {config.source}", name, f"fix the name in {config.source}")
              for name in config.disabled_plugins]
    for variable in ("QL_PLUGINS", "QL_DISABLE_PLUGINS"):
        named += [(variable, name, f"fix {variable} or unset it") for name in _split(env.get(variable))]
    if not named:
        return
    cached = read_cached_group(dict(env))
    if cached is not None and all(name in cached for _, name, _ in named):
        return
    installed = [p.name for p in installed_plugins()]
    for where, name, fix in named:
        if name in installed:
            continue
        import difflib

        close = difflib.get_close_matches(name, installed, n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{where} names plugin {name!r}, which is not installed{guess} (installed plugins: "
                          f"{', '.join(installed) or 'none'}); {fix}")


def require_selected_seams(config: Config, host: PluginHost) -> list[str]:
    """``key=name`` of every seam the config selects; a :class:`PluginError` (one line naming the fix)
    for the first one no loaded plugin registered."""
    chosen = []
    for key, registry in (("executor", host.executors), ("receipt_store", host.receipt_stores),
                          ("journal", host.journal_backends), ("artifact_store", host.artifact_stores)):
        name = getattr(config, key)
        if name is None:
            continue
        if name not in registry.names():
            raise PluginError(explain_unregistered(key, name, config, host))
        chosen.append(f"{key}={name}")
    return chosen


#: The config :func:`check_config_plugins` last passed (by identity): a command checks its config
#: before anything is created, and the node it then opens need not load the plugins twice to ask again.
_LAST_CHECKED: list[Config] = []


def check_config_plugins(config: Config, environ: Mapping[str, str] | None = None, *,
                         reports_plugins: bool = False) -> None:
    """Every plugin mistake a config can hold, before anything is created or run: a ``[plugin.X]``
    table or plugin variable naming no installed plugin (:func:`check_plugin_names`), and a key or
    value a plugin refuses (:func:`check_plugin_config`). ``reports_plugins`` (doctor, plugins): a
    plugin that cannot load is left to the caller to report. A config naming no plugin beyond its
    profile's costs nothing here."""
    if _LAST_CHECKED and _LAST_CHECKED[0] is config:
        return
    if config.plugin_settings or config.disabled_plugins or any(
            (environ if environ is not None else os.environ).get(v) for v in ("QL_PLUGINS", "QL_DISABLE_PLUGINS")):
        check_plugin_names(config, environ)
    host = None
    if needs_plugin_check(config):
        try:
            host = check_plugin_config(config, environ)
        except PluginError:
            if not reports_plugins:
                raise
            return
    check_extra_limits(config, environ, host)
    _LAST_CHECKED[:] = [config]


def _claimed_limits(host: PluginHost) -> set[str]:
    return {str(n) for names in host.pm.hook.ql_limit_names() for n in (names or ())}


def check_extra_limits(config: Config, environ: Mapping[str, str] | None = None,
                       host: PluginHost | None = None) -> None:
    """Refuse a ``[limits]`` key core does not own (``config.extra_limits``) that no plugin claims
    through ``ql_limit_names`` (a moved number an older config still sets there): a typo. The
    plugins of the config (``host``) are asked first; only a key they leave is put to every
    installed plugin (a shared config may set a cluster number on an edge node)."""
    if not config.extra_limits:
        return
    claimed = _claimed_limits(host) if host is not None else set()
    left = set(config.extra_limits) - claimed
    if left:
        try:
            wide = load_plugin_host((), environ, optional=[p.name for p in installed_plugins()])
            claimed |= _claimed_limits(wide)
        except QlError:
            pass  # a plugin that cannot load claims nothing; the key is then named below
        left -= claimed
    if left:
        import difflib

        from .profiles import LIMIT_RANGES

        bad = sorted(left)[0]
        close = difflib.get_close_matches(bad, [*LIMIT_RANGES, *claimed], n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown key limits.{bad} in {config.source}; {guess}allowed: "
                          f"{', '.join(sorted(LIMIT_RANGES))} (a plugin's numbers go in its [plugin.<name>] table)")


def needs_plugin_check(config: Config) -> bool:
    """True when the config gives a plugin something to check: a ``[plugin.<name>]`` table, or a
    plugin beyond the profile's own (``plugins = ["watchfiles"]``). The profile's defaults alone are
    checked when they start; a config without either costs no extra plugin load."""
    return (bool(config.plugin_settings) or bool(config.extra_limits)
            or bool(set(config.plugins) - set(config.profile.default_plugins)))


def check_plugin_config(config: Config, environ: Mapping[str, str] | None = None, *,
                        use_cache: bool = True) -> PluginHost:
    """Load the plugins this config uses (and the plugin of every ``[plugin.<name>]`` table) and ask
    each, through ``ql_check_config``, whether it accepts its settings and has what it needs.

    Raises the plugin's :class:`~ql_core.errors.ConfigError` / :class:`PluginError` (one line); any
    other exception is a :class:`PluginError` naming the plugin. Returns the host it loaded.
    """
    host = load_plugin_host(config.plugins, environ, optional=[*config.seam_plugins, *config.plugin_settings],
                            use_cache=use_cache)
    checkers = {impl.plugin_name for impl in host.pm.hook.ql_check_config.get_hookimpls()}
    for name in config.plugin_settings:
        if name in host.loaded and name not in checkers:
            # Nobody would read the table's keys before a factory runs (or ever): a typo would pass.
            raise ConfigError(f"[plugin.{name}] in {config.source}: plugin {name!r} declares no settings (it "
                              f"implements no ql_check_config hook), so ql cannot tell its keys from typos; "
                              f"remove the table, or add ql_check_config to the plugin (docs/plugins.md)")
    for impl in host.pm.hook.ql_check_config.get_hookimpls():
        try:
            impl.function(config=config)
        except QlError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin {impl.plugin_name!r} failed to check its settings: {type(exc).__name__}: "
                              f"{exc}; fix or reinstall the package that provides it, or disable it with "
                              f"QL_DISABLE_PLUGINS={impl.plugin_name}") from exc
    return host


# -- commands from plugins (ql_register_commands) ----------------------------------------------------
def plugin_commands(reserved: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> PluginCommands:
    """Ask every installed plugin (after ``QL_PLUGINS`` / ``QL_DISABLE_PLUGINS``) for its commands.

    ``reserved``: core's command names; a plugin registering one of them, or two plugins the same
    name, is a :class:`PluginError`. A plugin that fails to import is skipped and named in
    ``problems`` (so one broken package does not take ``ql --help`` down with it).
    """
    env = dict(os.environ if environ is None else environ)
    key = (env.get("QL_PLUGINS"), env.get("QL_DISABLE_PLUGINS"), env.get("HOME"), env.get("XDG_CACHE_HOME"),
           env.get(PLUGIN_CACHE_ENV))
    found = _COMMANDS_SEEN.get(key)
    if found is None:  # once per process: `ql --help` builds `ql db` too, which asks again
        found = _COMMANDS_SEEN[key] = _collect_commands(env)
    for name in sorted(set(reserved) & set(found.commands)):
        plugin = found.commands[name].plugin
        raise PluginError(f"command {name!r} is registered twice: by ql itself and by plugin {plugin!r}; "
                          f"disable one with QL_DISABLE_PLUGINS={plugin}")
    return found


#: What :func:`plugin_commands` found in this process, by its arguments.
_COMMANDS_SEEN: dict[tuple[object, ...], PluginCommands] = {}


def _collect_commands(env: dict[str, str]) -> PluginCommands:
    from .plugin_records import PluginCommand, PluginCommands

    cached = read_cached_group(env)
    if cached is None:
        write_cached_group(env, {p.name: p.value for p in installed_plugins()})
        cached = read_cached_group(env)
    group = cached if cached is not None else {p.name: p.value for p in installed_plugins()}
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(QlHookSpecs)
    problems: list[str] = []
    for name in select_plugin_names(sorted(group), env):
        try:
            pm.register(_import_target(name, group[name]), name=name)
        except PluginError as exc:
            problems.append(str(exc))
        except (ValueError, pluggy.PluginValidationError) as exc:
            problems.append(f"plugin {name!r} cannot be registered: {exc}")
    found: dict[str, PluginCommand] = {}
    for impl in pm.hook.ql_register_commands.get_hookimpls():
        def register(command: str, target: Any, _plugin: str = impl.plugin_name) -> None:
            if not isinstance(command, str) or not command.strip() or command != " ".join(command.split()):
                raise PluginError(f"plugin {_plugin!r} registered a command without a valid name ({command!r})")
            if command in found:
                raise PluginError(f"command {command!r} is registered twice: by {found[command].plugin} and by "
                                  f"plugin {_plugin!r}; disable one with QL_DISABLE_PLUGINS={_plugin}")
            found[command] = PluginCommand(command, _plugin, target)

        impl.function(register=register)
    return PluginCommands(found, tuple(problems))
