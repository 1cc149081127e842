"""Every on-disk state a power loss may leave after a prefix of recorded operations.

The model (deliberately weaker than any real file system, so what survives it survives them):

- the crash happens after any prefix of the operations (including none and all);
- a directory entry change (creat, link, unlink, rename) is durable only once its directory was
  fsynced afterwards (or the whole system was synced); until then it may or may not have reached
  the disk, independently of every other such change;
- file data is durable only up to the last fsync of that file (any of its names); data written
  after it may be there whole, missing, cut in half, or replaced by zeros of the same length (a
  size update without the data blocks);
- a name refers to an inode: a link made durable keeps the inode's content reachable even when the
  name it was linked from never became durable.

``crash_states`` returns distinct states only: a mapping path -> bytes of every file reachable
under the directories of interest.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .strace_ops import Op

__all__ = ["CrashState", "crash_states"]

_DIR_OPS = ("creat", "link", "unlink", "rename")
DATA_VARIANTS = ("whole", "missing", "half", "zeros")


@dataclass(frozen=True)
class CrashState:
    files: Mapping[str, bytes]
    prefix: int  # operations that had been issued
    how: str = field(compare=False)  # which optional changes survived, for failure messages

    def key(self) -> frozenset[tuple[str, bytes]]:
        return frozenset(self.files.items())


def _dir_of(op: Op) -> str:
    return os.path.dirname(op.path)


def _tail(data: bytes, variant: str) -> bytes:
    if variant == "whole":
        return data
    if variant == "missing":
        return b""
    if variant == "half":
        return data[: len(data) // 2]
    return b"\0" * len(data)


def _replay_names(
    ops: list[Op], keep: set[int], baseline: Mapping[str, bytes]
) -> tuple[dict[str, str], dict[str, bytes]]:
    """Names -> inode ids after the kept directory operations; baseline inodes by path."""
    names = {path: f"base:{path}" for path in baseline}
    for i, op in enumerate(ops):
        if op.kind not in _DIR_OPS or i not in keep:
            continue
        if op.kind == "creat":
            names[op.path] = f"ino:{op.path}:{i}"
        elif op.kind == "link":
            # Durable link: the inode is reachable even if its first name did not survive.
            names[op.path2] = _inode_at(ops, i, op.path)
        elif op.kind == "unlink":
            names.pop(op.path, None)
        elif op.kind == "rename":
            names[op.path2] = _inode_at(ops, i, op.path)
            names.pop(op.path, None)
    return names, {f"base:{p}": data for p, data in baseline.items()}


def _inode_at(ops: list[Op], index: int, path: str) -> str:
    """The inode ``path`` named just before operation ``index``, in the full (uncrashed) history."""
    inode = f"base:{path}"
    for i, op in enumerate(ops[:index]):
        if op.kind == "creat" and op.path == path:
            inode = f"ino:{path}:{i}"
        elif op.kind in ("link", "rename") and op.path2 == path:
            inode = _inode_at(ops, i, op.path)
    return inode


def _writes_by_inode(ops: list[Op]) -> dict[str, list[tuple[int, bytes]]]:
    out: dict[str, list[tuple[int, bytes]]] = {}
    for i, op in enumerate(ops):
        if op.kind == "write":
            out.setdefault(_inode_at(ops, i, op.path), []).append((i, op.data))
    return out


def _last_file_sync(ops: list[Op], inode: str) -> int:
    last = -1
    for i, op in enumerate(ops):
        if op.kind == "sync" or (op.kind == "fsync" and _inode_at(ops, i, op.path) == inode):
            last = i
    return last


def _durable_dir_ops(ops: list[Op]) -> set[int]:
    durable = set()
    for i, op in enumerate(ops):
        if op.kind not in _DIR_OPS:
            continue
        dirs = {_dir_of(op)} | ({os.path.dirname(op.path2)} if op.path2 else set())
        for later in ops[i + 1 :]:
            if later.kind == "sync" or (later.kind == "fsync" and later.path in dirs):
                durable.add(i)
                break
    return durable


def _states_after(ops: list[Op], baseline: Mapping[str, bytes], prefix: int) -> Iterator[CrashState]:
    issued = ops[:prefix]
    durable = _durable_dir_ops(issued)
    optional = [i for i, op in enumerate(issued) if op.kind in _DIR_OPS and i not in durable]
    writes = _writes_by_inode(issued)
    for picked in itertools.product((True, False), repeat=len(optional)):
        keep = durable | {i for i, on in zip(optional, picked) if on}
        names, contents = _replay_names(issued, keep, baseline)
        reachable = sorted(set(names.values()))
        # Per reachable inode: its durable bytes, and the un-fsynced tail's possible forms.
        fixed: dict[str, bytes] = {}
        tails: dict[str, bytes] = {}
        for inode in reachable:
            base = contents.get(inode, b"")
            chunks = writes.get(inode, [])
            synced = _last_file_sync(issued, inode)
            fixed[inode] = base + b"".join(d for i, d in chunks if i < synced)
            tail = b"".join(d for i, d in chunks if i > synced)
            if tail:
                tails[inode] = tail
        variable = sorted(tails)
        for forms in itertools.product(DATA_VARIANTS, repeat=len(variable)):
            chosen = dict(zip(variable, forms))
            data = {
                inode: fixed[inode] + (_tail(tails[inode], chosen[inode]) if inode in tails else b"")
                for inode in reachable
            }
            files = {path: data[inode] for path, inode in names.items()}
            how = ", ".join(
                [f"{issued[i].describe()}: {'kept' if on else 'lost'}" for i, on in zip(optional, picked)]
                + [f"data of {inode.split(':')[1].rsplit('/', 1)[-1]}: {form}" for inode, form in chosen.items()]
            )
            yield CrashState(files=files, prefix=prefix, how=how or "everything durable")


def crash_states(ops: list[Op], baseline: Mapping[str, bytes]) -> list[CrashState]:
    """Distinct states over every prefix of ``ops`` starting from the durable ``baseline`` files."""
    seen: set[frozenset[tuple[str, bytes]]] = set()
    out: list[CrashState] = []
    for prefix in range(len(ops) + 1):
        for state in _states_after(ops, baseline, prefix):
            if state.key() not in seen:
                seen.add(state.key())
                out.append(state)
    return out
