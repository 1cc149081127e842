"""Configuration: one TOML file, environment overrides, validated against the profile.

Where the settings come from, strongest first: command-line options, the
environment (``QL_DATA_DIR``, ``QL_PROFILE``, ``QL_DATABASE_URL``), the file
(``--config`` / ``QL_CONFIG`` / ``./ql.toml``), the built-in edge defaults.

```toml
profile = "standalone"            # edge | standalone | cluster-control | cluster-worker
data_dir = "/var/lib/myhost/ql"
plugins = ["watchfiles"]          # added to the profile's own plugins
database_url = "sqlite:////var/lib/myhost/ql/ql.db"

[limits]                          # any profile number, within its hard range
page_size = 16
```
Every rejection is a :class:`~ql_core.errors.ConfigError` naming the key and
the allowed values; nothing is silently ignored.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .profiles import LIMIT_RANGES, PROFILES, Profile

__all__ = ["Config", "load_config", "DEFAULT_CONFIG_NAME"]

DEFAULT_CONFIG_NAME = "ql.toml"
_TOP_LEVEL_KEYS = {"profile", "data_dir", "plugins", "database_url", "limits"}


@dataclass(frozen=True, slots=True)
class Config:
    """The validated settings of one ql runtime."""

    profile: Profile
    data_dir: Path
    database_url: str
    plugins: tuple[str, ...]
    #: Where the settings came from (a path or "built-in edge defaults"), for messages.
    source: str

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def _default_data_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "ql"


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass an existing --config or unset QL_CONFIG") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None


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


def _check_plugins(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError('plugins must be a list of plugin names, e.g. plugins = ["watchfiles"]')
    return tuple(value)


def _validate(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    unknown = sorted(set(raw) - _TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {source}; allowed keys: "
                          f"{', '.join(sorted(_TOP_LEVEL_KEYS))}")
    out: dict[str, Any] = {}
    if "profile" in raw:
        out["profile"] = _check_str("profile", raw["profile"])
    if "data_dir" in raw:
        out["data_dir"] = _check_str("data_dir", raw["data_dir"])
    if "database_url" in raw:
        out["database_url"] = _check_str("database_url", raw["database_url"])
    if "plugins" in raw:
        out["plugins"] = _check_plugins(raw["plugins"])
    limits = raw.get("limits", {})
    if not isinstance(limits, dict):
        raise ConfigError("limits must be a table: [limits]")
    bad = sorted(set(limits) - set(LIMIT_RANGES))
    if bad:
        raise ConfigError(f"unknown key limits.{bad[0]} in {source}; allowed: {', '.join(sorted(LIMIT_RANGES))}")
    out["limits"] = {k: _check_limit(k, v) for k, v in limits.items()}
    return out


def load_config(
    *,
    config_path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    profile: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Config:
    """Resolve and validate the configuration (see the module docstring for precedence)."""
    env = os.environ if environ is None else environ
    base = Path(cwd) if cwd is not None else Path.cwd()
    path: Path | None
    if config_path is not None:
        path = Path(config_path)
    elif env.get("QL_CONFIG"):
        path = Path(env["QL_CONFIG"])
    elif (base / DEFAULT_CONFIG_NAME).is_file():
        path = base / DEFAULT_CONFIG_NAME
    else:
        path = None
    source = str(path) if path else "built-in edge defaults"
    settings = _validate(_read_file(path) if path else {}, source)

    name = profile or env.get("QL_PROFILE") or settings.get("profile") or "edge"
    if name not in PROFILES:
        raise ConfigError(f"profile {name!r} does not exist; choose one of: {', '.join(PROFILES)}")
    chosen = PROFILES[name].with_overrides(settings["limits"])

    raw_dir = data_dir or env.get("QL_DATA_DIR") or settings.get("data_dir")
    if raw_dir:
        directory = Path(os.path.expanduser(str(raw_dir)))
        if not directory.is_absolute():
            # Relative to the config file, like every other tool's config.
            directory = ((path.parent if path else base) / directory)
    else:
        directory = _default_data_dir()
    directory = Path(os.path.abspath(directory))

    url = env.get("QL_DATABASE_URL") or settings.get("database_url")
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

    plugins = tuple(dict.fromkeys(chosen.default_plugins + settings.get("plugins", ())))
    return Config(profile=chosen, data_dir=directory, database_url=url, plugins=plugins, source=source)
