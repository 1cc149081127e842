"""The data directory's layout (DESIGN.md §6) and the confinement rules for it.

```
<data_dir>/ql.db                               run database (edge/standalone)
<data_dir>/node_id                             this node's stable runtime-owner id
<data_dir>/logs/<xx>/<log_artifact_id>.log     0600, append-only, dirs 0700
<data_dir>/receipts/<xx>/<attempt_id>.json
<data_dir>/receipts/.quarantine/<xx>/<attempt_id>.json
<data_dir>/receipts/.orphan-quarantine/<xx>/<name>
```
``xx`` is the last two hex digits of the id. Every directory we create is
0700 and is checked not to be a symlink, so nothing escapes the data dir.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UnsafePathError
from .ids import is_uuid7, new_id, shard_of

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "ensure_data_dir",
    "ensure_private_dir",
    "logs_root",
    "receipts_root",
    "log_relative_path",
    "log_path",
    "read_or_create_node_id",
    "read_node_id",
    "existing_data_dir",
]

DIR_MODE = 0o700
FILE_MODE = 0o600


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (0700) if missing; refuse a symlink or a non-directory."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} must be a real directory, not a symlink or file; remove it and retry")
    return path


def ensure_data_dir(data_dir: Path) -> Path:
    """Create the data dir (and its parents) with private permissions; return its canonical path."""
    data_dir = Path(os.path.abspath(data_dir))
    if not data_dir.exists():
        os.makedirs(data_dir, DIR_MODE, exist_ok=True)
    if not data_dir.is_dir():
        raise UnsafePathError(f"data dir {data_dir} is not a directory; point --data-dir elsewhere")
    return Path(os.path.realpath(data_dir))


def logs_root(data_dir: Path) -> Path:
    return data_dir / "logs"


def receipts_root(data_dir: Path) -> Path:
    return data_dir / "receipts"


def log_relative_path(log_artifact_id: str) -> str:
    """``<xx>/<id>.log`` relative to the logs root (what the database stores)."""
    if not is_uuid7(log_artifact_id):
        raise ValueError("log artifact id must be a lowercase UUIDv7")
    return f"{shard_of(log_artifact_id)}/{log_artifact_id}.log"


def log_path(data_dir: Path, log_artifact_id: str) -> Path:
    return logs_root(data_dir) / log_relative_path(log_artifact_id)


def existing_data_dir(data_dir: Path) -> Path:
    """The canonical path of a data dir that must already exist (readers never create one)."""
    from .errors import NotFoundError

    path = Path(os.path.abspath(data_dir))
    if not path.is_dir():
        raise NotFoundError(f"no ql data dir at {path}: nothing has run there; check --data-dir / QL_DATA_DIR")
    return Path(os.path.realpath(path))


def read_node_id(data_dir: Path) -> str | None:
    """This node's id if the data dir has one (None: never used); a corrupt one is an error."""
    try:
        return read_existing_node_id(data_dir)
    except FileNotFoundError:
        return None


def read_existing_node_id(data_dir: Path) -> str:
    path = Path(data_dir) / "node_id"
    with open(path, encoding="ascii") as fh:
        value = fh.read(64).strip()
    if is_uuid7(value):
        return value
    raise UnsafePathError(f"{path} is corrupt; it must hold one UUIDv7 (restore it from a backup)")


def read_or_create_node_id(data_dir: Path) -> str:
    """This node's stable id (the attempts' runtime owner), created once, atomically."""
    path = data_dir / "node_id"
    try:
        return read_existing_node_id(data_dir)
    except FileNotFoundError:
        pass
    value = new_id()
    tmp = data_dir / f".node_id.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.write(fd, value.encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # no-replace: a concurrent first start keeps the winner's id
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return read_or_create_node_id(data_dir)
