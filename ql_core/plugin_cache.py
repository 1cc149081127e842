"""The plugin cache: what stevedore found in the ``ql.plugins`` entry-point group, remembered per
environment so that a start which knows every name needs no scan of the installed distributions.

The key is the interpreter and every import path with its modification time: installing, removing
or reinstalling a distribution changes it, and the cache is then ignored and rewritten.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

__all__ = ["PLUGIN_CACHE_ENV", "read_cached_group", "write_cached_group"]

#: ``QL_PLUGIN_CACHE=off`` makes every start ask stevedore (and importlib.metadata) afresh.
PLUGIN_CACHE_ENV = "QL_PLUGIN_CACHE"


def _environment_key() -> str:
    """What an install changes: the interpreter, and every import path with its modification time
    (a distribution added, removed or reinstalled changes its site directory's mtime)."""
    parts = [sys.version, sys.prefix]
    for entry in sys.path:
        try:
            parts.append(f"{entry}\0{os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            parts.append(f"{entry}\0-")
    return "\n".join(parts)


def _cache_file(env: Mapping[str, str]) -> str | None:
    if env.get(PLUGIN_CACHE_ENV, "").strip().lower() == "off":
        return None
    from .paths import user_cache_dir

    directory = user_cache_dir(env)
    if directory is None:
        return None
    import zlib

    return os.path.join(directory, f"plugins-{zlib.crc32(sys.prefix.encode()):08x}.json")


def read_cached_group(env: Mapping[str, str]) -> dict[str, str] | None:
    """The group's ``name -> "module:attr"`` as stevedore found it in this very environment, or None."""
    path = _cache_file(env)
    if path is None:
        return None
    import json
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 256 * 1024 or st.st_uid != os.geteuid():
            return None
        data = json.loads(os.read(fd, st.st_size + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("key") != _environment_key():
        return None
    group = data.get("plugins")
    if not isinstance(group, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in group.items()):
        return None
    return group


def write_cached_group(env: Mapping[str, str], group: Mapping[str, str]) -> None:
    """Remember the group (``name -> "module:attr"``) for the next start (best effort: a read-only home just means no cache)."""
    path = _cache_file(env)
    if path is None:
        return
    import json
    import tempfile

    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        body = json.dumps({"key": _environment_key(), "plugins": dict(group)})
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".plugins-")
        try:
            os.write(fd, body.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        pass
