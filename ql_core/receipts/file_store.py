"""Atomic, sharded, symlink-proof file store for completion receipts (ADR-0007 §2.4, §2.5).

Layout under ``root`` (= ``<data_dir>/receipts``)::

    root/<xx>/<attempt_id>.json               final receipt, 0600; xx = last two hex digits
    root/<xx>/.<attempt_id>.<unique>.tmp      temp while publishing; unique = [A-Za-z0-9]{1,32}
    root/.quarantine/<xx>/<attempt_id>.json   quarantined receipt (hard link of the original)

Every directory is 0700. The temp and final names are a contract: the receipt
audit classifies files by :data:`TEMP_NAME_PATTERN` and :data:`RECEIPT_NAME_PATTERN`.

Publication protocol (the POSIX shell launcher follows the same steps; see
``docs/receipt-publication.md``):

1. Ensure the shard directory ``root/<xx>`` exists (``mkdir`` mode 0700; if it
   was created now, fsync ``root``). It must be a real directory, not a symlink,
   owned by us.
2. Create the temp file ``root/<xx>/.<attempt_id>.<unique>.tmp`` with
   ``O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC``, mode 0600 — it can never
   be an existing file or a symlink.
3. Write the complete canonical payload (``serialize_receipt``, ≤ 4096 bytes).
4. fsync the temp file and close it.
5. ``link(temp, final)`` in the same directory. If the final name exists
   (EEXIST) the receipt was already published: never overwrite.
6. Unlink the temp file.
7. fsync the shard directory.

Crash points: ``receipt.publish.after_temp`` after step 4,
``receipt.publish.after_link`` after step 5.

The final name only ever appears by ``link`` of a fully written, fsynced
file, so a reader sees either no receipt or a complete one — never a partial
file. A failure in steps 1–5 removes the temp file and raises
:class:`ReceiptPublishError` with no final file visible (ADR §6 gate 14); a
failure in steps 6–7 raises it with ``final_visible=True``.

Every operation walks root → shard with directory file descriptors
(``O_DIRECTORY|O_NOFOLLOW``) and the ``dir_fd=`` form of each system call, and
checks that the root is still the directory it was at construction, so a
path component swapped for a symlink can never redirect a write, link or
unlink outside the root: it raises :class:`UnsafePathError` instead. There is
no in-process state beyond the root's identity, so the store is safe to use
from many threads and processes at once (``O_EXCL`` temp names, no-replace
``link``) and it pickles.

This module is the protocol; the names it publishes under are :mod:`ql_core.receipts.names`, the
file-system steps it orders (verified directories, the temp file, bounded reads) are
:mod:`ql_core.receipts.fs`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Final

from ql_core.crashpoints import crashpoint
from ql_core.dirfd import lstat_at, open_dir, same_file
from ql_core.ids import shard_of
from ql_core.ports.receipt_store import (
    PublishOutcome,
    QuarantineConflictError,
    ReadStatus,
    ReceiptPublishError,
    ReceiptRead,
    ReceiptStoreError,
    UnsafePathError,
)
from ql_core.receipts.codec import (
    MAX_RECEIPT_BYTES,
    Receipt,
    ReceiptRejection,
    RejectReason,
    parse_receipt,
    serialize_receipt,
)
from ql_core.receipts.fs import (
    DIR_MODE,
    FILE_MODE,
    READ_FLAGS,
    TEMP_FLAGS,
    fill_temp,
    open_subdir,
    read_bounded,
    unlink_quietly,
    verify_directory,
)
from ql_core.receipts.names import (
    QUARANTINE_DIR_NAME,
    RECEIPT_NAME_PATTERN,
    TEMP_NAME_PATTERN,
    receipt_name,
    require_uuid7,
    temp_name,
)

__all__ = [
    "QUARANTINE_DIR_NAME",
    "RECEIPT_NAME_PATTERN",
    "TEMP_NAME_PATTERN",
    "FileReceiptStore",
    "PublishOutcome",
    "QuarantineConflictError",
    "ReadStatus",
    "ReceiptPublishError",
    "ReceiptRead",
    "ReceiptStoreError",
    "UnsafePathError",
]

_MISSING: Final = ReceiptRead(ReadStatus.MISSING)


def _require_canonical(path: str) -> None:
    """Refuse a root reached through a symlink: a later swap would move every operation."""
    if os.path.realpath(path) != path:
        raise UnsafePathError("receipt root must not contain symlinks")


#: The shard :meth:`FileReceiptStore._create_shards` makes last (its presence: all were made).
_LAST_SHARD = "ff"


class FileReceiptStore:
    """Receipts as files under one canonical root (see the module docstring for the protocol)."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True, shards_up_front: bool = False) -> None:
        """Open (creating if missing and ``create``, 0700) the receipt root.

        ``shards_up_front`` (with ``create``): make all 256 shard directories now, with one fsync
        of the root, unless they are there (:meth:`_create_shards`); otherwise each is made, and
        the root fsynced, when its first receipt needs it.

        The root must be absolute and already canonical: a path that reaches it
        through a symlink is refused, because a later swap of that symlink
        would silently move every receipt operation elsewhere.
        """
        path = os.fspath(root)
        if not isinstance(path, str) or not os.path.isabs(path):
            raise UnsafePathError("receipt root must be an absolute path")
        path = os.path.abspath(path)
        _require_canonical(path)
        self._root = path
        created = False
        if create:
            try:
                os.mkdir(path, DIR_MODE)
                created = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise ReceiptStoreError(f"cannot create receipt root: {exc.strerror}") from exc
        elif not os.path.lexists(path):
            raise ReceiptStoreError(f"the receipt directory {path} does not exist (this data dir was never used "
                                    f"to run a task, or it was damaged)")
        _require_canonical(path)  # again, in case a component was swapped meanwhile
        self._identity = self._open_and_identify_root(created=created)
        if create and shards_up_front and not os.path.lexists(os.path.join(path, _LAST_SHARD)):
            self._create_shards()  # a new root (or one from before shards were made up front)

    def __repr__(self) -> str:
        return f"FileReceiptStore({self._root!r})"

    @property
    def root(self) -> str:
        """The canonical absolute root (for handing to the launcher; never stored in a database)."""
        return self._root

    # ----------------------------------------------------------------- paths

    @staticmethod
    def relative_ref(attempt_id: str) -> str:
        """Bounded, root-relative reference ``<xx>/<attempt_id>.json`` (never absolute)."""
        require_uuid7(attempt_id)
        return f"{shard_of(attempt_id)}/{receipt_name(attempt_id)}"

    def prepare(self, attempt_id: str) -> str:
        """Create (0700) and verify the attempt's shard directory; return its absolute path.

        For a publisher outside this process (the POSIX launcher), which cannot
        walk directory fds itself: the shard gets the same checks as every
        publish here (real directory, ours, private, under the canonical root).
        """
        require_uuid7(attempt_id)
        with self._shard(attempt_id, create=True):
            pass
        return os.path.join(self._root, shard_of(attempt_id))

    # ------------------------------------------------------ directory access

    def _open_and_identify_root(self, *, created: bool) -> tuple[int, int]:
        fd = self._open_root_fd()
        try:
            if created:
                os.fchmod(fd, DIR_MODE)  # exact mode whatever the umask
            st = verify_directory(fd, "receipt root")
        except OSError as exc:
            raise ReceiptStoreError(f"cannot prepare receipt root: {exc.strerror}") from exc
        finally:
            os.close(fd)
        return st.st_dev, st.st_ino

    def _create_shards(self) -> None:
        """A root gets its 256 shard directories (0700) at once and ONE fsync of the root, instead
        of one fsync per shard as the first receipt of each lands (about 1,500 tasks' worth: most
        of a young data dir's extra syncs per task, issue 25). A shard that is there already (a
        concurrent first start, an older release) is left as it is; every later use still verifies
        it. The last shard is made last: while it is missing, an open with ``create`` runs this."""
        with self._root_dir() as root_fd:
            for i in range(256):
                name = f"{i:02x}"
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=root_fd)
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise ReceiptStoreError(f"cannot create receipt directory: {exc.strerror}") from exc
                fd = open_dir(name, root_fd, unsafe=lambda: UnsafePathError("receipt shard was replaced"),
                              failed=lambda exc: ReceiptStoreError(f"cannot open receipt directory: {exc.strerror}"))
                if fd is None:
                    raise ReceiptStoreError("receipt directory vanished while in use")
                try:
                    os.fchmod(fd, DIR_MODE)  # exact mode whatever the umask
                finally:
                    os.close(fd)
            try:
                os.fsync(root_fd)  # the shards' entries are durable before any receipt goes in
            except OSError as exc:
                raise ReceiptStoreError(f"cannot sync receipt directory: {exc.strerror}") from exc

    def _open_root_fd(self) -> int:
        fd = open_dir(self._root, unsafe=lambda: UnsafePathError("receipt root is a symlink or not a directory"),
                      failed=lambda _exc: ReceiptStoreError("cannot open receipt root"))
        if fd is None:
            raise ReceiptStoreError("cannot open receipt root")
        return fd

    def _verified_root_fd(self) -> int:
        """The root's fd (the caller closes it), verified to be the very directory seen at construction."""
        fd = self._open_root_fd()
        try:
            st = verify_directory(fd, "receipt root")
            if (st.st_dev, st.st_ino) != self._identity:
                raise UnsafePathError("receipt root was replaced")
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _root_dir(self) -> Iterator[int]:
        """The root's fd, verified to be the very directory seen at construction."""
        fd = self._verified_root_fd()
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    @contextlib.contextmanager
    def _subdir(parent_fd: int, name: str, *, create: bool) -> Iterator[int | None]:
        """A verified child directory fd, or None when it is missing and ``create`` is False."""
        fd = open_subdir(parent_fd, name, create=create)
        if fd is None:
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def _shard(self, attempt_id: str, *, create: bool = False) -> _ShardDir:
        """The attempt's verified shard fd (None: missing and not ``create``), under the verified root:
        a context manager closing both."""
        return _ShardDir(self, shard_of(attempt_id), create)

    @contextlib.contextmanager
    def _quarantine_shard(self, attempt_id: str, *, create: bool = False) -> Iterator[int | None]:
        with (
            self._root_dir() as root_fd,
            self._subdir(root_fd, QUARANTINE_DIR_NAME, create=create) as q_fd,
        ):
            if q_fd is None:
                yield None
                return
            with self._subdir(q_fd, shard_of(attempt_id), create=create) as qs_fd:
                yield qs_fd

    # -------------------------------------------------------------- publish

    def publish(self, receipt: Receipt, *, fsync: bool = True) -> PublishOutcome:
        """Publish ``receipt`` atomically at its final path, never replacing an existing one.

        ``fsync=False`` skips steps 4 and 7 (benchmarks and tests only: the
        receipt is then atomic but not durable across power loss). Raises
        ValueError for an invalid receipt (before touching the disk),
        :class:`UnsafePathError` for a symlinked/foreign directory and
        :class:`ReceiptPublishError` for any I/O failure.
        """
        payload = serialize_receipt(receipt)
        attempt_id = receipt.attempt_id
        try:
            with self._shard(attempt_id, create=True) as shard_fd:  # step 1
                assert shard_fd is not None  # create=True never yields None
                return self._publish_in_shard(shard_fd, attempt_id, payload, fsync=fsync)
        except (ReceiptPublishError, UnsafePathError):
            raise
        except (ReceiptStoreError, OSError) as exc:
            raise ReceiptPublishError("receipt directory unavailable") from exc

    def _publish_in_shard(
        self, shard_fd: int, attempt_id: str, payload: bytes, *, fsync: bool
    ) -> PublishOutcome:
        temp = temp_name(attempt_id)
        try:
            fd = os.open(temp, TEMP_FLAGS, FILE_MODE, dir_fd=shard_fd)  # step 2
        except OSError as exc:
            raise ReceiptPublishError(f"cannot create receipt temp: {exc.strerror}") from exc
        try:
            fill_temp(fd, payload, fsync=fsync)  # steps 3-4
            crashpoint("receipt.publish.after_temp")
            linked = self._link_no_replace(shard_fd, temp, attempt_id)  # step 5
        except OSError as exc:
            unlink_quietly(temp, shard_fd)
            raise ReceiptPublishError(f"receipt publication failed: {exc.strerror}") from exc
        if linked:
            crashpoint("receipt.publish.after_link")
        try:
            os.unlink(temp, dir_fd=shard_fd)  # step 6
            if fsync:
                os.fsync(shard_fd)  # step 7
        except OSError as exc:
            raise ReceiptPublishError(
                f"receipt linked but cleanup failed: {exc.strerror}", final_visible=linked
            ) from exc
        return PublishOutcome.PUBLISHED if linked else PublishOutcome.ALREADY_EXISTS

    @staticmethod
    def _link_no_replace(shard_fd: int, temp: str, attempt_id: str) -> bool:
        """Hard-link temp → final; False when the final name already exists (never replaced)."""
        try:
            os.link(
                temp,
                receipt_name(attempt_id),
                src_dir_fd=shard_fd,
                dst_dir_fd=shard_fd,
                follow_symlinks=False,
            )
        except FileExistsError:
            return False
        return True

    # ----------------------------------------------------------------- read

    def read(self, attempt_id: str) -> ReceiptRead:
        """Read and validate the attempt's receipt without following symlinks or blocking.

        Non-regular files (symlink, FIFO, directory, device) are reported
        invalid without being opened for content; a valid receipt must also
        name this very attempt. OS errors other than "not found" raise
        :class:`ReceiptStoreError` (transient: the caller retries next round).
        """
        require_uuid7(attempt_id)
        try:
            with self._shard(attempt_id) as shard_fd:
                if shard_fd is None:
                    return _MISSING
                data = self._read_final(shard_fd, attempt_id)
        except OSError as exc:
            raise ReceiptStoreError(f"cannot read receipt: {exc.strerror}") from exc
        if isinstance(data, ReceiptRead):
            return data
        return self._classify(attempt_id, data)

    @staticmethod
    def _read_final(shard_fd: int, attempt_id: str) -> bytes | ReceiptRead:
        name = receipt_name(attempt_id)
        before = lstat_at(name, shard_fd)
        if before is None:
            return _MISSING
        if not stat.S_ISREG(before.st_mode):
            return _not_regular()
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=shard_fd)
        except FileNotFoundError:
            return _MISSING
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # swapped for a symlink since the lstat
                return _not_regular()
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not same_file(st, before):
                return _not_regular()
            return read_bounded(fd, MAX_RECEIPT_BYTES + 1)
        finally:
            os.close(fd)

    @staticmethod
    def _classify(attempt_id: str, data: bytes) -> ReceiptRead:
        parsed = parse_receipt(data)
        if isinstance(parsed, ReceiptRejection):
            return ReceiptRead(ReadStatus.INVALID, rejection=parsed)
        if parsed.attempt_id != attempt_id:
            rejection = ReceiptRejection(
                RejectReason.ID_MISMATCH, "attemptId does not match the receipt path"
            )
            return ReceiptRead(ReadStatus.INVALID, rejection=rejection)
        return ReceiptRead(ReadStatus.VALID, receipt=parsed)

    def surely_absent(self, attempt_id: str) -> bool:
        """True only when nothing is at the attempt's final receipt path now: one ``lstat`` of the
        whole path, for a caller to whom a missing receipt, an unusable slot and a failed read all
        mean the same (the awaited host's look before it commits the status it reaped: the usual
        task has no receipt, and the checked walk of :meth:`read` costs nine system calls). False —
        something is there, or the look failed — and :meth:`read` decides."""
        require_uuid7(attempt_id)
        try:
            os.lstat(os.path.join(self._root, shard_of(attempt_id), receipt_name(attempt_id)))
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False

    # --------------------------------------------------- existence / removal

    def exists(self, attempt_id: str) -> bool:
        """True when anything (of any file type) is at the attempt's final receipt path."""
        require_uuid7(attempt_id)
        with self._shard(attempt_id) as shard_fd:
            return shard_fd is not None and self._entry_exists(shard_fd, attempt_id)

    def quarantined_exists(self, attempt_id: str) -> bool:
        """True when the attempt has an entry in the quarantine."""
        require_uuid7(attempt_id)
        with self._quarantine_shard(attempt_id) as qs_fd:
            return qs_fd is not None and self._entry_exists(qs_fd, attempt_id)

    @staticmethod
    def _entry_exists(dir_fd: int, attempt_id: str) -> bool:
        try:
            return lstat_at(receipt_name(attempt_id), dir_fd) is not None
        except OSError as exc:
            raise ReceiptStoreError(f"cannot stat receipt: {exc.strerror}") from exc

    def remove(self, attempt_id: str, *, fsync: bool = True) -> bool:
        """Delete the final receipt (only after its terminal commit!); False if already gone."""
        require_uuid7(attempt_id)
        with self._shard(attempt_id) as shard_fd:
            return shard_fd is not None and self._unlink_entry(shard_fd, attempt_id, fsync=fsync)

    def purge_quarantined(self, attempt_id: str, *, fsync: bool = True) -> bool:
        """Delete the quarantined copy (retention expired); False if already gone."""
        require_uuid7(attempt_id)
        with self._quarantine_shard(attempt_id) as qs_fd:
            return qs_fd is not None and self._unlink_entry(qs_fd, attempt_id, fsync=fsync)

    @staticmethod
    def _unlink_entry(dir_fd: int, attempt_id: str, *, fsync: bool) -> bool:
        try:
            os.unlink(receipt_name(attempt_id), dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ReceiptStoreError(f"cannot remove receipt: {exc.strerror}") from exc
        if fsync:
            try:
                os.fsync(dir_fd)
            except OSError as exc:
                raise ReceiptStoreError(f"cannot sync receipt directory: {exc.strerror}") from exc
        return True

    # ----------------------------------------------------------- quarantine

    def quarantine(self, attempt_id: str, *, fsync: bool = True) -> bool:
        """Move the receipt into the quarantine by hard link (no replace) + unlink.

        Idempotent across a crash between the link and the unlink: a
        quarantine entry that is the *same inode* as the original counts as
        already linked. A different file in the quarantine slot raises
        :class:`QuarantineConflictError` and leaves both files alone. Returns
        False when there was nothing to quarantine. Contents are never read.
        """
        require_uuid7(attempt_id)
        try:
            with self._shard(attempt_id) as shard_fd:
                if shard_fd is None:
                    return False
                original = lstat_at(receipt_name(attempt_id), shard_fd)
                if original is None:
                    return False
                with self._quarantine_shard(attempt_id, create=True) as qs_fd:
                    assert qs_fd is not None  # create=True never yields None
                    return self._move_to_quarantine(shard_fd, qs_fd, attempt_id, fsync=fsync)
        except OSError as exc:
            raise ReceiptStoreError(f"cannot quarantine receipt: {exc.strerror}") from exc

    @staticmethod
    def _move_to_quarantine(shard_fd: int, qs_fd: int, attempt_id: str, *, fsync: bool) -> bool:
        name = receipt_name(attempt_id)
        try:
            os.link(name, name, src_dir_fd=shard_fd, dst_dir_fd=qs_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False  # a concurrent quarantine or remove got there first
        except FileExistsError:
            pass  # verified below: only the same inode is acceptable
        original = lstat_at(name, shard_fd)
        copy = lstat_at(name, qs_fd)
        if original is None:
            return False
        if copy is None or not same_file(original, copy):
            raise QuarantineConflictError("quarantine slot holds a different file")
        if fsync:
            os.fsync(qs_fd)  # the copy is durable before the original goes
        crashpoint("receipt.quarantine.after_link")
        try:
            os.unlink(name, dir_fd=shard_fd)
        except FileNotFoundError:
            return False
        if fsync:
            os.fsync(shard_fd)
        return True


def _not_regular() -> ReceiptRead:
    rejection = ReceiptRejection(
        RejectReason.NOT_REGULAR_FILE, "receipt path is not a regular file"
    )
    return ReceiptRead(ReadStatus.INVALID, rejection=rejection)


class _ShardDir:
    """What :meth:`FileReceiptStore._shard` gives: ``with`` it, the shard's fd (or None). The same
    opens and checks as the root's and the shard's context managers nested, in one object: every
    task looks at its shard twice (prepare, then the receipt read), and three generator-based
    context managers cost ~15 Python calls each time."""

    __slots__ = ("_create", "_name", "_root", "_shard", "_store")

    def __init__(self, store: FileReceiptStore, name: str, create: bool) -> None:
        self._store = store
        self._name = name
        self._create = create
        self._root = -1
        self._shard: int | None = None

    def __enter__(self) -> int | None:
        root = self._store._verified_root_fd()
        try:
            self._shard = open_subdir(root, self._name, create=self._create)
        except BaseException:
            os.close(root)
            raise
        self._root = root
        return self._shard

    def __exit__(self, *exc: object) -> None:
        try:
            if self._shard is not None:
                os.close(self._shard)
        finally:
            os.close(self._root)
