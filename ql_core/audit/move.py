"""Phase 2 of the receipt audit (only on request): move eligible files into the orphan quarantine.

A move is a same-file-system hard link that never replaces anything, then the unlink of the
original — only while the original still is the very file that was classified. Nothing is deleted.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from contextlib import ExitStack

from ql_core.dirfd import lstat_at, same_file
from ql_core.errors import UnsafePathError

from .dirs import ensure_private_subdir, reverify, verify_dir_path
from .model import ORPHAN_QUARANTINE_DIR_NAME, Action, AuditError, ShardStatus
from .scan import Found, Shard

__all__ = ["move", "quarantine_eligible", "verify_orphan_quarantine"]


def move(shard_fd: int, target_fd: int, found: Found) -> Action:
    """Hard-link into the orphan quarantine (no replace), then unlink the original."""
    name = found.name
    linked_now = False
    try:
        os.link(name, name, src_dir_fd=shard_fd, dst_dir_fd=target_fd, follow_symlinks=False)
        linked_now = True
    except FileExistsError:
        existing = lstat_at(name, target_fd)
        if existing is None or not same_file(existing, found.st):
            return Action.SKIPPED_TARGET_EXISTS  # a different file: never replaced
        # The very same file is already there: an earlier run stopped between link and
        # unlink. Finishing that move is safe; the link below is verified like a new one.
    except FileNotFoundError:
        return Action.SKIPPED_CHANGED
    except OSError as exc:
        raise AuditError(f"cannot link into the orphan quarantine: {exc.strerror}") from exc
    try:
        copy = lstat_at(name, target_fd)
        original = lstat_at(name, shard_fd)
        unchanged = (
            copy is not None
            and stat.S_ISREG(copy.st_mode)
            and same_file(copy, found.st)
            and copy.st_mtime_ns == found.st.st_mtime_ns
            and copy.st_size == found.st.st_size
        )
        if not unchanged:
            # The name now holds another file, or the file was written to since it was
            # classified: withdraw the link made just now, but only while the original name
            # still holds the very same file (so nothing becomes unreachable).
            if (linked_now and copy is not None and original is not None
                    and same_file(copy, original)):
                os.unlink(name, dir_fd=target_fd)
            return Action.SKIPPED_CHANGED
        assert copy is not None  # implied by ``unchanged``
        os.fsync(target_fd)  # the quarantined link is durable before the original goes
        if original is None or not same_file(original, copy):
            return Action.QUARANTINED  # the original name is already gone (or reused: left alone)
        os.unlink(name, dir_fd=shard_fd)
    except OSError as exc:
        raise AuditError(f"cannot move a file into the orphan quarantine: {exc.strerror}") from exc
    return Action.QUARANTINED


def quarantine_eligible(root: str, root_fd: int, shards: Sequence[Shard],
                actions: dict[tuple[str, str], Action], stack: ExitStack) -> None:
    """Phase 2: re-verify and prepare every directory involved, then move eligible files."""
    work: list[tuple[Shard, int, list[Found]]] = []
    for shard in shards:
        if shard.status is ShardStatus.OK and shard.fd is not None:
            files = [f for f in shard.found
                     if actions[(shard.name, f.name)] is Action.WOULD_QUARANTINE]
            if files:
                work.append((shard, shard.fd, files))
    if not work:
        return  # nothing eligible: create nothing
    reverify(root_fd, root, "receipts")
    for shard, fd, _ in work:
        reverify(fd, shard.path, f"receipts/{shard.name}")
    # Every target directory exists and is verified before the first file moves.
    oq_path = os.path.join(root, ORPHAN_QUARANTINE_DIR_NAME)
    oq_what = f"receipts/{ORPHAN_QUARANTINE_DIR_NAME}"
    oq_fd = ensure_private_subdir(root_fd, ORPHAN_QUARANTINE_DIR_NAME, oq_path, oq_what)
    stack.callback(os.close, oq_fd)
    targets: list[int] = []
    for shard, _, _ in work:
        target_fd = ensure_private_subdir(oq_fd, shard.name, os.path.join(oq_path, shard.name),
                                           f"{oq_what}/{shard.name}")
        stack.callback(os.close, target_fd)
        targets.append(target_fd)
    for (shard, fd, files), target_fd in zip(work, targets):
        reverify(fd, shard.path, f"receipts/{shard.name}")  # right before working on it
        moved = False
        for found in files:
            action = move(fd, target_fd, found)
            actions[(shard.name, found.name)] = action
            moved = moved or action is Action.QUARANTINED
        if moved:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise AuditError(f"cannot sync receipts/{shard.name}: {exc.strerror}") from exc


def verify_orphan_quarantine(root: str, shards: Sequence[str], *, private: bool) -> None:
    """The orphan quarantine and its shard dirs, where present, are real and canonical."""
    oq_path = os.path.join(root, ORPHAN_QUARANTINE_DIR_NAME)
    oq_what = f"receipts/{ORPHAN_QUARANTINE_DIR_NAME}"
    checks = [(oq_path, oq_what)] + [(os.path.join(oq_path, s), f"{oq_what}/{s}") for s in shards]
    for i, (path, what) in enumerate(checks):
        st = verify_dir_path(path, what, private=private)
        if st is None:
            if i == 0:
                return
            continue
        if private and stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafePathError(f"{what} must be private (0700); chmod 700 it")
