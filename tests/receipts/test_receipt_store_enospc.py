"""ENOSPC for real on a tiny tmpfs: a failed publication leaves no final receipt, no temp file."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql_core.ids import new_id, shard_of
from ql_core.receipts import (
    FileReceiptStore,
    PublishOutcome,
    ReadStatus,
    Receipt,
    ReceiptPublishError,
)

pytestmark = pytest.mark.root


def make_receipt(attempt_id: str) -> Receipt:
    return Receipt(1, new_id(), attempt_id, 1, "k" * 43, 1_000, 2_000, 0)


@pytest.fixture()
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs mounted for this test only (needs root and mount permission)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(path: Path) -> None:
    """Write until the file system reports ENOSPC (a real one, not a simulated error)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        chunk = b"\0" * 4096
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        with pytest.raises(OSError) as info:  # truly full: not even one byte fits
            os.write(fd, b"\0")
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def assert_no_trace(store: FileReceiptStore, root: Path, attempt_id: str) -> None:
    assert store.read(attempt_id).status is ReadStatus.MISSING
    assert not store.exists(attempt_id)
    shard = root / shard_of(attempt_id)
    leftovers = [] if not shard.exists() else [n for n in os.listdir(shard) if attempt_id in n]
    assert leftovers == []  # no final, no temp


def test_enospc_never_yields_a_visible_receipt(tiny_tmpfs: Path) -> None:
    root = tiny_tmpfs / "receipts"
    store = FileReceiptStore(root)
    earlier = new_id()
    assert store.publish(make_receipt(earlier)) is PublishOutcome.PUBLISHED
    same_shard = new_id()[:-2] + shard_of(earlier)  # shard directory already exists
    new_shard = new_id()[:-2] + ("00" if shard_of(earlier) != "00" else "ff")

    filler = tiny_tmpfs / "filler"
    fill(filler)
    for attempt_id in (same_shard, new_shard):
        with pytest.raises(ReceiptPublishError) as info:
            store.publish(make_receipt(attempt_id))
        assert info.value.final_visible is False
        assert isinstance(info.value.__cause__, OSError)
        assert_no_trace(store, root, attempt_id)
    assert store.read(earlier).status is ReadStatus.VALID  # existing receipts are untouched

    filler.unlink()  # space is back: the very same publication now succeeds
    assert store.publish(make_receipt(same_shard)) is PublishOutcome.PUBLISHED
    assert store.read(same_shard).status is ReadStatus.VALID
