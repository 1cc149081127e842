"""The plugin cache: what stevedore found in the ``ql.plugins`` entry-point group, remembered per
environment so that a start which knows every name needs no scan of the installed distributions.

The key is the interpreter and the import path; each import path entry is remembered with its
modification time and the distributions in it (``*.dist-info``, ``*.egg-info``, ``*.egg``, each with
its own modification time). Installing, removing or reinstalling a distribution changes an entry's
distributions, and the cache is then ignored and rewritten. An entry whose modification time
changed for another reason — the working directory or a script's directory, first on ``sys.path``
for ``python -m`` and ``python script.py``, where any file written changes it — is looked at again
(its names only) and still matches: before, every such start missed the cache and paid the scan of
every installed distribution (stevedore, importlib.metadata: ~25-40 ms CPU of a ``ql run``).
One file per interpreter prefix holds up to :data:`MAX_ENTRIES` import paths, most recent first.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

__all__ = ["PLUGIN_CACHE_ENV", "MAX_ENTRIES", "read_cached_group", "write_cached_group"]

#: ``QL_PLUGIN_CACHE=off`` makes every start ask stevedore (and importlib.metadata) afresh.
PLUGIN_CACHE_ENV = "QL_PLUGIN_CACHE"


#: What importlib.metadata reads distributions from, in a path entry (it compares them lowercased).
_DIST_SUFFIXES = (".dist-info", ".egg-info", ".egg")


def _environment_key() -> str:
    """What must match exactly: the interpreter and the import path itself."""
    return "\n".join([sys.version, sys.prefix, *sys.path])


def _mtime_ns(entry: str) -> int | None:
    try:
        return os.stat(entry or ".").st_mtime_ns
    except OSError:
        return None


def _distributions(entry: str) -> list[list[object]] | None:
    """``[name, mtime_ns]`` of every distribution directly in ``entry``, sorted (None: not a directory
    we can list, e.g. a zip file: then only its modification time counts)."""
    found: list[list[object]] = []
    try:
        with os.scandir(entry or ".") as it:
            for child in it:
                if child.name.lower().endswith(_DIST_SUFFIXES):
                    try:
                        found.append([child.name, child.stat(follow_symlinks=True).st_mtime_ns])
                    except OSError:
                        found.append([child.name, None])
    except OSError:
        return None
    return sorted(found, key=lambda item: str(item[0]))


def _path_entries() -> list[list[object]]:
    """``[entry, mtime_ns, distributions]`` for every import path entry, as the cache records them."""
    return [[entry, _mtime_ns(entry), _distributions(entry)] for entry in sys.path]


def _same_distributions(recorded: object) -> bool:
    """Do the import path entries hold the distributions recorded? An entry with its recorded
    modification time is taken as is; only one that changed is listed again (its names, and the
    modification times of its distributions: a reinstall replaces them)."""
    if not isinstance(recorded, list) or len(recorded) != len(sys.path):
        return False
    for item, entry in zip(recorded, sys.path):
        if not isinstance(item, list) or len(item) != 3 or item[0] != entry:
            return False
        if item[1] == _mtime_ns(entry):  # unchanged (or still missing, as python311.zip often is)
            continue
        if item[2] is None or _distributions(entry) != item[2]:
            return False
    return True


def _cache_file(env: Mapping[str, str]) -> str | None:
    if env.get(PLUGIN_CACHE_ENV, "").strip().lower() == "off":
        return None
    from .paths import user_cache_dir

    directory = user_cache_dir(env)
    if directory is None:
        return None
    from binascii import crc32  # zlib's crc32, without importing zlib (one more module per start)

    return os.path.join(directory, f"plugins-{crc32(sys.prefix.encode()):08x}.json")


#: Import paths remembered per file: ``ql`` (its bin directory first on sys.path) and ``python -m``
#: from a directory or two each keep their entry, instead of rewriting one entry at every switch.
MAX_ENTRIES = 8


def _load(path: str) -> list[dict[str, object]]:
    """The entries of the cache file (most recent first); none when it is missing, not ours, too
    large or damaged."""
    import json
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 256 * 1024 or st.st_uid != os.geteuid():
            return []
        data = json.loads(os.read(fd, st.st_size + 1))
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def read_cached_group(env: Mapping[str, str]) -> dict[str, str] | None:
    """The group's ``name -> "module:attr"`` as stevedore found it in this very environment, or None."""
    path = _cache_file(env)
    if path is None:
        return None
    key = _environment_key()
    for entry in _load(path):
        if entry.get("key") != key:
            continue
        if not _same_distributions(entry.get("paths")):
            return None
        group = entry.get("plugins")
        if not isinstance(group, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in group.items()):
            return None
        return group
    return None


def write_cached_group(env: Mapping[str, str], group: Mapping[str, str]) -> None:
    """Remember the group (``name -> "module:attr"``) for the next start (best effort: a read-only home just means no cache)."""
    path = _cache_file(env)
    if path is None:
        return
    import json
    import tempfile

    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        key = _environment_key()
        entries = [{"key": key, "paths": _path_entries(), "plugins": dict(group)}]
        entries += [e for e in _load(path) if e.get("key") != key][:MAX_ENTRIES - 1]
        body = json.dumps({"entries": entries})
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".plugins-")
        try:
            os.write(fd, body.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        pass
