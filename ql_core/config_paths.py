"""Where the configuration and the data dir are, resolved without loading the configuration itself.

:func:`ql_core.config.load_config` finds ``./ql.toml`` and resolves the data dir with these; the read
commands' quick path (:mod:`ql_core.cli.quick_read`) uses the same ones to tell, without importing
the config and profile dataclasses, that a command line names only a data dir and the built-in edge
defaults apply (:func:`builtin_data_dir`). One implementation, so both resolve a data dir alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

__all__ = ["DEFAULT_CONFIG_NAME", "default_data_dir", "default_config_path", "check_path_text", "check_path_length",
           "data_dir_of", "builtin_data_dir", "BUILTIN_SWITCHES"]

DEFAULT_CONFIG_NAME = "ql.toml"
#: Longest path component most file systems accept (NAME_MAX).
_NAME_MAX = 255
#: Room kept under PATH_MAX for the longest path ql creates inside the data dir
#: (``receipts/.orphan-quarantine/<xx>/<name>`` and friends).
_PATH_MAX = 4096
_LAYOUT_ROOM = 320
#: The environment variables that choose a configuration other than the built-in edge defaults.
BUILTIN_SWITCHES = ("QL_CONFIG", "QL_PROFILE", "QL_DATABASE_URL", "QL_PLUGINS", "QL_DISABLE_PLUGINS")


def default_data_dir() -> Path:
    """``$XDG_STATE_HOME/ql``, else ``~/.local/state/ql`` (the platform's convention, not a QL_ setting)."""
    state = os.environ.get("XDG_STATE_HOME")
    if state and os.path.isabs(state):
        return Path(state) / "ql"
    home = os.path.expanduser("~")
    if home == "~" or not os.path.isdir(home):
        shown = os.environ.get("HOME", home)
        raise ConfigError(f"no data dir is configured and the home directory (HOME={shown}) does not exist, so "
                          f"the default ~/.local/state/ql cannot be used; pass --data-dir, set QL_DATA_DIR, or "
                          f"set data_dir in ql.toml")
    return Path(home) / ".local" / "state" / "ql"


def default_config_path(base: Path) -> Path | None:
    """``<cwd>/ql.toml`` if anything at all is there (None: nothing is).

    Anything means anything: a dangling symlink, a symlink loop, a directory or a FIFO is found here
    and refused when read, so a broken config is an error and never a silent fall back to the
    built-in defaults (which would run tasks as root in the wrong data dir).
    """
    path = base / DEFAULT_CONFIG_NAME
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ConfigError(f"cannot tell whether {path} exists ({exc.strerror}); ql will not guess and run with "
                          f"built-in defaults: run ql from a directory you may read, or pass --config / set "
                          f"QL_CONFIG") from None
    return path


def check_path_text(key: str, value: str) -> str:
    if "\0" in value:
        raise ConfigError(f"{key} contains a NUL byte, which no path can hold; fix it")
    return value


def check_path_length(directory: Path) -> None:
    raw = os.fsencode(directory)
    for part in raw.split(b"/"):
        if len(part) > _NAME_MAX:
            raise ConfigError(f"data dir {str(directory)[:80]}... has a path component of {len(part)} bytes; file "
                              f"systems allow at most {_NAME_MAX}: choose a shorter --data-dir")
    if len(raw) + _LAYOUT_ROOM > _PATH_MAX:
        raise ConfigError(f"data dir {str(directory)[:80]}... is {len(raw)} bytes long; ql needs it under "
                          f"{_PATH_MAX - _LAYOUT_ROOM} bytes to fit its own files: choose a shorter --data-dir")


def data_dir_of(raw_dir: str | os.PathLike[str] | None, anchor: Path | None) -> Path:
    """The absolute, checked data dir: ``raw_dir`` (``~`` expanded; a relative one under ``anchor``, else
    the working directory), or the default (:func:`default_data_dir`) when it is empty."""
    if raw_dir:
        directory = Path(os.path.expanduser(check_path_text("data_dir", os.fspath(raw_dir))))
        if not directory.is_absolute():
            directory = (anchor if anchor is not None else Path.cwd()) / directory
    else:
        directory = default_data_dir()
    directory = Path(os.path.abspath(directory))
    check_path_length(directory)
    from .paths import refuse_virtual_data_dir

    refuse_virtual_data_dir(directory)  # here, so every command refuses QL_DATA_DIR=/dev/null alike
    return directory


def builtin_data_dir(data_dir: str | None, config_path: str | None, profile: str | None,
                     environ: dict[str, str] | os._Environ[str], cwd: str | None) -> Path | None:
    """The data dir when the built-in edge defaults are the whole configuration — no config file named
    or found at ``<cwd>/ql.toml``, no profile, no ``QL_*`` switch but ``QL_DATA_DIR`` — else None (the
    configuration must be loaded). Resolved as :func:`ql_core.config.load_config` resolves it."""
    if config_path is not None or profile or any(environ.get(name) for name in BUILTIN_SWITCHES):
        return None
    base = Path(cwd) if cwd is not None else None
    if base is not None and default_config_path(base) is not None:
        return None
    return data_dir_of(data_dir or environ.get("QL_DATA_DIR"), base)
