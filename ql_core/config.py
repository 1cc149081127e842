"""Configuration: one TOML file, environment overrides, validated against the profile.

Where the settings come from, strongest first: the arguments of
:func:`load_config` (the ``ql`` command's options), the environment
(``QL_DATA_DIR``, ``QL_PROFILE``, ``QL_DATABASE_URL``), the file
(``config_path``, else ``QL_CONFIG``, else ``./ql.toml``), the built-in edge
defaults. A library caller chooses its sources: the environment is read only
when ``environ`` is given (``environ=os.environ`` for the process's own) and
``./ql.toml`` only when ``cwd`` is given; the ``ql`` command passes both.

```toml
profile = "standalone"            # edge | standalone | cluster-control | cluster-worker
data_dir = "/var/lib/myhost/ql"
plugins = ["watchfiles"]          # added to the profile's own plugins
disable_plugins = []              # removed from the set (like QL_DISABLE_PLUGINS)
database_url = "sqlite:////var/lib/myhost/ql/ql.db"
executor = "local"                # the seams, each selected by its registered name
receipt_store = "file"            # (defaults: the profile's)
journal = "edge-sqlite"
artifact_store = "postgres"       # cluster profiles only: where workers ship logs
web_token_file = "/etc/ql/web.token"  # `ql web`'s token: a file of this user, mode 0600

[limits]                          # any profile number, within its hard range
page_size = 16                    # (a key core does not own is a plugin's: kept in extra_limits for
                                  # the plugin that claims it, refused by check_config_plugins if none does)

[plugin.nice]                     # handed to that plugin's factories; the plugin validates it
niceness = 10
```
The file must be UTF-8 TOML, a regular file of at most 1 MiB; it is opened
without blocking (a FIFO or device named by mistake is refused, never read).
Anything at ``./ql.toml`` is the config: a dangling symlink, a loop, a
directory or a FIFO there is an error, never a fall back to the defaults.
A data dir on a virtual file system (``/dev/null``) is refused here, so every
command refuses it alike.
A relative ``data_dir`` or ``web_token_file`` in the file is relative to the file's directory.
Every rejection is a :class:`~ql_core.errors.ConfigError` (exit 2) naming the
key or the file and the fix; nothing is silently ignored.
"""

from __future__ import annotations

import os
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

from .config_paths import DEFAULT_CONFIG_NAME, check_path_text as _check_path_text, data_dir_of
from .config_paths import default_config_path as _default_config_path
from .errors import ConfigError, DataDirError, UnsafePathError
from .profiles import LIMIT_RANGES, PROFILES, Profile
from .value_class import FACTORY, lean_dataclass

__all__ = ["Config", "load_config", "DEFAULT_CONFIG_NAME"]

_TOP_LEVEL_KEYS = {"profile", "data_dir", "plugins", "disable_plugins", "database_url", "executor",
                   "receipt_store", "journal", "artifact_store", "web_token_file", "limits", "plugin"}
#: The seams selected by name (config key -> what it names, for messages).
SEAM_KEYS = {"executor": "executor", "receipt_store": "receipt store", "journal": "journal backend",
             "artifact_store": "artifact store"}
#: Deepest nesting accepted inside a ``[plugin.<name>]`` table (a deeper one is a mistake or an attack).
_MAX_PLUGIN_DEPTH = 8
#: A config file larger than this is not a config file.
MAX_CONFIG_BYTES = 1024 * 1024


# A dataclass (embedders and tests change it with dataclasses.replace), without generated methods.
@lean_dataclass(frozen=True, slots=True)
class Config:
    """The validated settings of one ql runtime."""

    profile: Profile
    data_dir: Path
    database_url: str
    #: Plugins to load: the profile's and the config's ``plugins``, minus ``disable_plugins`` (the
    #: environment switches apply on load). A selected seam also loads the plugin of its name, if
    #: one is installed (:attr:`seam_plugins`).
    plugins: tuple[str, ...]
    #: Where the settings came from (a path or "built-in edge defaults"), for messages.
    source: str
    #: The selected executor (None: this profile runs no local processes).
    executor: str | None = None
    #: The selected receipt store (None: this profile runs no local processes).
    receipt_store: str | None = None
    journal: str = "edge-sqlite"
    #: The selected log artifact store (cluster profiles; None elsewhere: logs stay local files).
    artifact_store: str | None = None
    #: Plugins the config disables (``disable_plugins``).
    disabled_plugins: tuple[str, ...] = ()
    #: ``[plugin.<name>]`` tables, handed to that plugin's factories through the runtime context.
    plugin_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: ``web_token_file``: the file holding ``ql web``'s token (absolute; None: not configured). Its
    #: owner, mode 0600 and content are checked when ``ql web`` reads it (ql_core.web.auth.load_token).
    web_token_file: Path | None = None
    #: True when no --data-dir, QL_DATA_DIR or data_dir named the data dir (the platform's default).
    data_dir_default: bool = False
    #: ``[limits]`` keys core does not own, as written: numbers that moved to a plugin's own table
    #: (``run_lease_s`` is ``[plugin.cluster-fenced]``'s), still read there by the plugin that claims
    #: them (hook ``ql_limit_names``); :func:`ql_core.plugins.check_config_plugins` refuses any key
    #: no installed plugin claims, as a typo.
    extra_limits: Mapping[str, Any] = field(default_factory=dict)

    def __init__(self, profile: Profile, data_dir: Path, database_url: str, plugins: tuple[str, ...], source: str,
                 executor: str | None = None, receipt_store: str | None = None, journal: str = "edge-sqlite",
                 artifact_store: str | None = None, disabled_plugins: tuple[str, ...] = (),
                 plugin_settings: Mapping[str, Mapping[str, Any]] = FACTORY, web_token_file: Path | None = None,
                 data_dir_default: bool = False, extra_limits: Mapping[str, Any] = FACTORY) -> None:
        _set = object.__setattr__
        _set(self, "profile", profile)
        _set(self, "data_dir", data_dir)
        _set(self, "database_url", database_url)
        _set(self, "plugins", plugins)
        _set(self, "source", source)
        _set(self, "executor", executor)
        _set(self, "receipt_store", receipt_store)
        _set(self, "journal", journal)
        _set(self, "artifact_store", artifact_store)
        _set(self, "disabled_plugins", disabled_plugins)
        _set(self, "plugin_settings", {} if plugin_settings is FACTORY else plugin_settings)
        _set(self, "web_token_file", web_token_file)
        _set(self, "data_dir_default", data_dir_default)
        _set(self, "extra_limits", {} if extra_limits is FACTORY else extra_limits)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def seam_plugins(self) -> tuple[str, ...]:
        """The selected seam names not disabled: each loads the installed plugin of the same name."""
        names = (self.executor, self.receipt_store, self.journal, self.artifact_store)
        return tuple(n for n in dict.fromkeys(names) if n and n not in self.disabled_plugins)


def _describe_unreadable(path: Path, exc: OSError | None, default: bool) -> str:
    """Why the config file at ``path`` cannot be read, and what to do: one line."""
    import errno
    import stat as stat_mod

    fix = ("fix or remove it (ql never runs with built-in defaults while ./ql.toml is there), or pass "
           "--config / set QL_CONFIG" if default else "point --config / QL_CONFIG at the config file")
    try:
        is_link = stat_mod.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        is_link = False
    target = ""
    if is_link:
        try:
            target = f" -> {os.readlink(path)}"
        except OSError:
            pass
    if exc is not None and exc.errno == errno.ELOOP:
        return f"config file {path} is a symlink loop{target}; {fix}"
    if exc is not None and exc.errno == errno.ENOENT:
        if is_link:
            return f"config file {path} is a dangling symlink{target} (its target does not exist); {fix}"
        return f"config file {path} does not exist; {fix}"
    if exc is not None:
        from .errors import explain_os_error

        return explain_os_error(exc, "cannot read config file", path, fix=fix)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    kind = ("a directory" if stat_mod.S_ISDIR(mode) else "a FIFO" if stat_mod.S_ISFIFO(mode)
            else "a socket" if stat_mod.S_ISSOCK(mode) else "a device" if stat_mod.S_ISCHR(mode) or
            stat_mod.S_ISBLK(mode) else "not a regular file")
    via = f" (a symlink{target})" if is_link else ""
    return f"config file {path}{via} is {kind}, not a regular file; {fix}"


def _read_file(path: Path, *, default: bool = False) -> dict[str, Any]:
    """The parsed file; ``default``: it is ``./ql.toml``, found rather than named."""
    from .paths import read_small_file

    def refuse(exc: OSError | None) -> ConfigError:
        return ConfigError(_describe_unreadable(path, exc, default))

    try:
        # Non-blocking, regular files only: a FIFO or device named by mistake never blocks ql.
        raw = read_small_file(path, max_bytes=MAX_CONFIG_BYTES, what="config file", refuse=refuse)
    except (DataDirError, UnsafePathError) as exc:
        raise ConfigError(str(exc)) from None
    return _parse_toml(path, raw)


def _parse_toml(path: Path, raw: bytes) -> dict[str, Any]:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError(f"config file {path} is UTF-16 text; save it as UTF-8")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark some editors write: harmless
    if b"\0" in raw:
        raise ConfigError(f"config file {path} contains NUL bytes: it is a binary file, not TOML; "
                          f"point --config / QL_CONFIG at the right file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (invalid byte at offset {exc.start}); "
                          f"save it as UTF-8") from None
    import tomllib  # only when there is a file to parse: most commands run without one

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} nests arrays or tables too deeply to be a config; "
                          f"flatten it") from None


def _check_limit(key: str, value: object) -> float | int:
    kind, low, high = LIMIT_RANGES[key]
    # bool is an int in Python; a limit of `true` is a mistake, not 1.
    ok = isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        ok = ok or isinstance(value, float)
    if not ok:
        raise ConfigError(f"limits.{key} must be {'a number' if kind is float else 'an integer'} "
                          f"between {low:g} and {high:g}, got {type(value).__name__}")
    if not (low <= value <= high):  # type: ignore[operator]
        raise ConfigError(f"limits.{key} = {value} is out of range; allowed {low:g} to {high:g}")
    return kind(value)


def _check_str(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty string, got {type(value).__name__}")
    return value


def _check_plugins(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f'{key} must be a list of plugin names, e.g. {key} = ["watchfiles"]')
    return tuple(value)


def _depth(value: object, limit: int) -> int:
    if limit < 0:
        return 1
    if isinstance(value, dict):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    return 0


def _check_plugin_tables(value: object) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError("plugin settings must be tables: [plugin.<name>] with key = value lines")
    if "web" in value:
        # Never ignore it: a token left there would silently not protect `ql web` on loopback.
        raise ConfigError('[plugin.web] is not a plugin table: name ql web\'s token file with the top-level key '
                          'web_token_file = "/path/to/token" (before any [table]; docs/operations.md)')
    for name, table in value.items():
        if _depth(table, _MAX_PLUGIN_DEPTH) > _MAX_PLUGIN_DEPTH:
            raise ConfigError(f"[plugin.{name}] is nested more than {_MAX_PLUGIN_DEPTH} levels deep; flatten it")
    return {name: dict(table) for name, table in value.items()}


def _validate(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    unknown = sorted(set(raw) - _TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {source}; allowed keys: "
                          f"{', '.join(sorted(_TOP_LEVEL_KEYS))}")
    out: dict[str, Any] = {}
    if "profile" in raw:
        out["profile"] = _check_str("profile", raw["profile"])
    if "data_dir" in raw:
        out["data_dir"] = _check_path_text("data_dir", _check_str("data_dir", raw["data_dir"]))
    if "database_url" in raw:
        out["database_url"] = _check_path_text("database_url", _check_str("database_url", raw["database_url"]))
    if "plugins" in raw:
        out["plugins"] = _check_plugins("plugins", raw["plugins"])
    if "disable_plugins" in raw:
        out["disable_plugins"] = _check_plugins("disable_plugins", raw["disable_plugins"])
    for key in SEAM_KEYS:
        if key in raw:
            out[key] = _check_str(key, raw[key])
    if "web_token_file" in raw:
        value = raw["web_token_file"]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"web_token_file must be a path (a non-empty string), got {type(value).__name__}")
        out["web_token_file"] = _check_path_text("web_token_file", value)
    out["plugin"] = _check_plugin_tables(raw.get("plugin", {}))
    limits = raw.get("limits", {})
    if not isinstance(limits, dict):
        raise ConfigError("limits must be a table: [limits]")
    out["limits"] = {k: _check_limit(k, v) for k, v in limits.items() if k in LIMIT_RANGES}
    extra = {k: v for k, v in limits.items() if k not in LIMIT_RANGES}
    for key, value in extra.items():
        if isinstance(value, (dict, list)):
            raise ConfigError(f"limits.{key} must be a number, got {type(value).__name__}")
    out["extra_limits"] = extra
    return out


def load_config(
    *,
    config_path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    profile: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Config:
    """Resolve and validate the configuration.

    Only the sources the caller names are read: ``config_path`` (a TOML file), ``data_dir`` and
    ``profile`` (overrides); ``environ`` — a mapping such as ``os.environ`` — supplies
    ``QL_CONFIG``, ``QL_DATA_DIR``, ``QL_PROFILE`` and ``QL_DATABASE_URL`` (None: no environment
    is read); ``cwd`` — a directory — is searched for ``ql.toml`` when no file is named (None:
    none is searched) and anchors a relative ``data_dir`` given without a file. Precedence,
    strongest first: arguments, environment, file, the built-in edge defaults.
    Raises :class:`~ql_core.errors.ConfigError` (one line naming the key and the fix).
    """
    env: Mapping[str, str] = {} if environ is None else environ
    base = Path(cwd) if cwd is not None else None
    path: Path | None
    if config_path is not None:
        path = Path(_check_path_text("--config", os.fspath(config_path)))
    elif env.get("QL_CONFIG"):
        path = Path(_check_path_text("QL_CONFIG", env["QL_CONFIG"]))
    elif base is not None:
        path = _default_config_path(base)
    else:
        path = None
    found = path is not None and config_path is None and not env.get("QL_CONFIG")
    source = str(path) if path else "built-in edge defaults"
    settings = _validate(_read_file(path, default=found) if path else {}, source)

    name = profile or env.get("QL_PROFILE") or settings.get("profile") or "edge"
    if name not in PROFILES:
        raise ConfigError(f"profile {name!r} does not exist; choose one of: {', '.join(PROFILES)}")
    chosen = PROFILES[name].with_overrides(settings["limits"])

    from_file = not (data_dir or env.get("QL_DATA_DIR"))
    raw_dir = data_dir or env.get("QL_DATA_DIR") or settings.get("data_dir")
    # In the file: relative to the file, like every other tool's config. On the command line or in
    # the environment: relative to the working directory, like any path there.
    directory = data_dir_of(raw_dir, path.parent if (from_file and path) else base)

    token_file = None
    if "web_token_file" in settings:
        token_file = Path(os.path.expanduser(settings["web_token_file"]))
        if not token_file.is_absolute() and path is not None:
            token_file = path.parent / token_file  # like data_dir: relative to the file naming it
        token_file = Path(os.path.abspath(token_file))

    url = env.get("QL_DATABASE_URL") or settings.get("database_url")
    if url is not None:
        _check_path_text("database_url", url)
    if url is None:
        if chosen.database != "sqlite":
            raise ConfigError(f"profile {name!r} needs database_url = \"postgresql+psycopg://...\" "
                              f"(the control database); it has no SQLite default")
        url = f"sqlite:///{directory / 'ql.db'}"
    if url.startswith("sqlite") and chosen.database != "sqlite":
        raise ConfigError(f"profile {name!r} refuses the SQLite run database; set database_url to "
                          f"a PostgreSQL URL (postgresql+psycopg://...) or use profile edge/standalone")
    if not (url.startswith("sqlite") or url.startswith("postgresql")):
        raise ConfigError("database_url must start with sqlite:/// or postgresql+psycopg://")

    executor = settings.get("executor", chosen.default_executor)
    receipt_store = settings.get("receipt_store", chosen.default_receipt_store)
    if not chosen.runs_tasks and ("executor" in settings or "receipt_store" in settings):
        raise ConfigError(f"profile {name!r} runs no local processes; remove executor/receipt_store from "
                          f"{source} (or use profile standalone or cluster-worker)")
    journal = settings.get("journal", chosen.default_journal)
    if "artifact_store" in settings and chosen.default_artifact_store is None:
        raise ConfigError(f"profile {name!r} keeps logs as local files; artifact_store is for the cluster "
                          f"profiles (cluster-control, cluster-worker): remove it from {source}")
    artifact_store = settings.get("artifact_store", chosen.default_artifact_store)
    disabled = settings.get("disable_plugins", ())
    wanted = chosen.default_plugins + settings.get("plugins", ())
    plugins = tuple(n for n in dict.fromkeys(wanted) if n not in disabled)
    return Config(profile=chosen, data_dir=directory, database_url=url, plugins=plugins, source=source,
                  executor=executor, receipt_store=receipt_store, journal=journal,
                  artifact_store=artifact_store, disabled_plugins=tuple(disabled),
                  plugin_settings=settings["plugin"], web_token_file=token_file, data_dir_default=not raw_dir,
                  extra_limits=settings["extra_limits"])
