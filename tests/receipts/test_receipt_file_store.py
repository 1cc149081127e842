"""FileReceiptStore on real files: layout, modes, hostile files, symlinks, quarantine, crashes."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ql_core.crashpoints import CRASH_EXIT_CODE
from ql_core.ids import new_id, shard_of
from ql_core.receipts import (
    MAX_RECEIPT_BYTES,
    RECEIPT_NAME_PATTERN,
    TEMP_NAME_PATTERN,
    FileReceiptStore,
    PublishOutcome,
    QuarantineConflictError,
    ReadStatus,
    Receipt,
    RejectReason,
    UnsafePathError,
    serialize_receipt,
)


def make_receipt(attempt_id: str | None = None, token: str | None = None) -> Receipt:
    return Receipt(
        schema_version=1,
        run_id=new_id(),
        attempt_id=attempt_id or new_id(),
        callback_sequence=1,
        token=token or os.urandom(24).hex(),
        started_at_ms=1_700_000_000_000,
        finished_at_ms=1_700_000_000_123,
        exit_code=3,
    )


def same_shard_id(attempt_id: str) -> str:
    """Another valid UUIDv7 in the same shard (the last 12 hex digits are random bits)."""
    other = attempt_id[:-12] + "0" * 10 + attempt_id[-2:]
    return other if other != attempt_id else attempt_id[:-12] + "1" * 10 + attempt_id[-2:]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def all_entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    return tmp_path / "data" / "receipts"


@pytest.fixture()
def store(root: Path) -> FileReceiptStore:
    root.parent.mkdir(mode=0o700)
    return FileReceiptStore(root)


@pytest.fixture()
def outside(tmp_path: Path) -> Iterator[Path]:
    """A directory outside the root that must never be touched."""
    path = tmp_path / "outside"
    path.mkdir(mode=0o700)
    (path / "victim.txt").write_bytes(b"do not touch")
    yield path
    assert (path / "victim.txt").read_bytes() == b"do not touch"


def final_path(root: Path, attempt_id: str) -> Path:
    return root / shard_of(attempt_id) / f"{attempt_id}.json"


def quarantine_path(root: Path, attempt_id: str) -> Path:
    return root / ".quarantine" / shard_of(attempt_id) / f"{attempt_id}.json"


# ------------------------------------------------------------------ publish / read


def test_publish_then_read(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    assert store.publish(receipt) is PublishOutcome.PUBLISHED
    path = final_path(root, receipt.attempt_id)
    assert path.read_bytes() == serialize_receipt(receipt)
    assert os.listdir(path.parent) == [path.name]  # temp removed
    result = store.read(receipt.attempt_id)
    assert result.status == "valid" and result.status is ReadStatus.VALID
    assert result.receipt == receipt and result.rejection is None
    assert store.exists(receipt.attempt_id)


def test_publish_never_overwrites(store: FileReceiptStore, root: Path) -> None:
    first = make_receipt()
    second = make_receipt(attempt_id=first.attempt_id)
    assert store.publish(first) is PublishOutcome.PUBLISHED
    assert store.publish(second, fsync=False) is PublishOutcome.ALREADY_EXISTS
    assert store.read(first.attempt_id).receipt == first
    assert os.listdir(final_path(root, first.attempt_id).parent) == [f"{first.attempt_id}.json"]


def test_shards_by_last_two_hex_digits(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    expected_ref = f"{receipt.attempt_id[-2:]}/{receipt.attempt_id}.json"
    assert store.relative_ref(receipt.attempt_id) == expected_ref
    assert (root / receipt.attempt_id[-2:] / f"{receipt.attempt_id}.json").is_file()
    assert not os.path.isabs(FileReceiptStore.relative_ref(receipt.attempt_id))


def test_modes_are_0600_and_0700(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    assert mode_of(final_path(root, receipt.attempt_id)) == 0o600
    assert mode_of(root) == 0o700
    assert mode_of(root / shard_of(receipt.attempt_id)) == 0o700
    store.quarantine(receipt.attempt_id)
    assert mode_of(root / ".quarantine") == 0o700
    assert mode_of(root / ".quarantine" / shard_of(receipt.attempt_id)) == 0o700
    assert mode_of(quarantine_path(root, receipt.attempt_id)) == 0o600


def test_modes_hold_under_a_hostile_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)  # would strip the owner's write bit from everything
    try:
        store = FileReceiptStore(tmp_path / "receipts")
        receipt = make_receipt()
        assert store.publish(receipt) is PublishOutcome.PUBLISHED
        assert store.quarantine(receipt.attempt_id)
    finally:
        os.umask(old)
    root = tmp_path / "receipts"
    assert mode_of(root) == 0o700
    assert mode_of(root / shard_of(receipt.attempt_id)) == 0o700
    assert mode_of(root / ".quarantine" / shard_of(receipt.attempt_id)) == 0o700
    assert mode_of(quarantine_path(root, receipt.attempt_id)) == 0o600


def test_read_missing(store: FileReceiptStore, root: Path) -> None:
    attempt_id = new_id()
    assert store.read(attempt_id).status is ReadStatus.MISSING  # no shard directory
    store.publish(make_receipt(attempt_id=same_shard_id(attempt_id)))
    missing = store.read(attempt_id)  # shard exists, file does not
    assert missing.status is ReadStatus.MISSING and missing.receipt is None
    assert not store.exists(attempt_id)
    assert not (root / shard_of(attempt_id)).joinpath(f"{attempt_id}.json").exists()


def plant(root: Path, attempt_id: str, content: bytes) -> Path:
    path = final_path(root, attempt_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", RejectReason.INVALID_JSON),
        (b'{"schemaVersion":1', RejectReason.INVALID_JSON),
        (b" " * (10 * MAX_RECEIPT_BYTES), RejectReason.OVERSIZED),
        (b"\xef\xbb\xbf{}", RejectReason.BOM),
    ],
)
def test_read_rejects_bad_content(
    store: FileReceiptStore, root: Path, content: bytes, reason: RejectReason
) -> None:
    attempt_id = new_id()
    plant(root, attempt_id, content)
    result = store.read(attempt_id)
    assert result.status is ReadStatus.INVALID and result.receipt is None
    assert result.rejection is not None and result.rejection.reason is reason


def test_read_rejects_receipt_of_another_attempt(store: FileReceiptStore, root: Path) -> None:
    other = make_receipt()
    attempt_id = new_id()
    plant(root, attempt_id, serialize_receipt(other))
    result = store.read(attempt_id)
    assert result.status is ReadStatus.INVALID
    assert result.rejection is not None and result.rejection.reason is RejectReason.ID_MISMATCH
    assert other.token not in result.rejection.detail


def test_symlink_at_final_path_is_not_followed(
    store: FileReceiptStore, root: Path, outside: Path
) -> None:
    receipt = make_receipt()
    target = outside / "receipt.json"
    target.write_bytes(serialize_receipt(receipt))  # even a *valid* receipt outside is refused
    final = final_path(root, receipt.attempt_id)
    final.parent.mkdir(mode=0o700)
    final.symlink_to(target)
    result = store.read(receipt.attempt_id)
    assert result.status is ReadStatus.INVALID
    assert result.rejection is not None
    assert result.rejection.reason is RejectReason.NOT_REGULAR_FILE
    assert store.exists(receipt.attempt_id)
    assert store.publish(receipt) is PublishOutcome.ALREADY_EXISTS  # never replaces the link
    assert final.is_symlink() and target.read_bytes() == serialize_receipt(receipt)
    assert store.quarantine(receipt.attempt_id)  # the link itself moves, not its target
    assert quarantine_path(root, receipt.attempt_id).is_symlink()
    assert target.read_bytes() == serialize_receipt(receipt)


def test_fifo_at_final_path_does_not_block(store: FileReceiptStore, root: Path) -> None:
    attempt_id = new_id()
    final = final_path(root, attempt_id)
    final.parent.mkdir(mode=0o700)
    os.mkfifo(final, 0o600)
    result = store.read(attempt_id)
    assert result.rejection is not None
    assert result.rejection.reason is RejectReason.NOT_REGULAR_FILE


def test_directory_at_final_path(store: FileReceiptStore, root: Path) -> None:
    attempt_id = new_id()
    final_path(root, attempt_id).mkdir(parents=True, mode=0o700)
    result = store.read(attempt_id)
    assert result.rejection is not None
    assert result.rejection.reason is RejectReason.NOT_REGULAR_FILE


def test_publish_validates_before_touching_disk(store: FileReceiptStore, root: Path) -> None:
    bad = Receipt(1, new_id(), new_id(), 1, "short", 0, 0, 0)
    with pytest.raises(ValueError):
        store.publish(bad)
    assert all_entries(root) == []


@pytest.mark.parametrize(
    "bad_id",
    [
        "",
        "../../etc/passwd",
        "01890A5D-AC97-7D4E-9F3A-6B0E2C1D4A5F",
        "6f1c7c1e-8d2a-4b9e-9c3f-2a1b0c9d8e7f",  # v4
        "01890a5d-ac97-7d4e-9f3a-6b0e2c1d4a5f/..",
        "01890a5d-ac97-7d4e-9f3a-6b0e2c1d4a5f\n",
    ],
)
def test_unvalidated_ids_never_reach_a_path(store: FileReceiptStore, bad_id: str) -> None:
    for operation in (
        store.read,
        store.exists,
        store.remove,
        store.quarantine,
        store.quarantined_exists,
        store.purge_quarantined,
        store.relative_ref,
    ):
        with pytest.raises(ValueError):
            operation(bad_id)


def test_remove(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    assert store.remove(receipt.attempt_id) is True
    assert store.remove(receipt.attempt_id, fsync=False) is False
    assert store.read(receipt.attempt_id).status is ReadStatus.MISSING
    assert store.remove(new_id()) is False  # shard never existed


def test_store_pickles(store: FileReceiptStore) -> None:
    clone = pickle.loads(pickle.dumps(store))
    receipt = make_receipt()
    clone.publish(receipt)
    assert store.read(receipt.attempt_id).receipt == receipt


def test_name_patterns() -> None:
    attempt_id = new_id()
    assert RECEIPT_NAME_PATTERN.fullmatch(f"{attempt_id}.json")
    match = TEMP_NAME_PATTERN.fullmatch(f".{attempt_id}.12345rdeadbeef.tmp")
    assert match and match["attempt_id"] == attempt_id and match["unique"] == "12345rdeadbeef"
    for name in (
        f"{attempt_id}.json.tmp",
        f".{attempt_id}..tmp",
        f".{attempt_id}.{'a' * 33}.tmp",
        f".{attempt_id}.a-b.tmp",
        f".{attempt_id.upper()}.1.tmp",
    ):
        assert not TEMP_NAME_PATTERN.fullmatch(name)
    assert not RECEIPT_NAME_PATTERN.fullmatch(f".{attempt_id}.json")


# ---------------------------------------------------------------------- symlinks


def test_root_through_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafePathError):
        FileReceiptStore(tmp_path / "link")  # the root itself is a symlink
    with pytest.raises(UnsafePathError):
        FileReceiptStore(tmp_path / "link" / "receipts")  # a parent is a symlink
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("root_arg", ["relative/receipts", "receipts"])
def test_relative_root_is_refused(root_arg: str) -> None:
    with pytest.raises(UnsafePathError):
        FileReceiptStore(root_arg)


def test_root_that_is_a_file_or_shared_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UnsafePathError):
        FileReceiptStore(tmp_path / "file")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafePathError):
        FileReceiptStore(shared)


def test_replaced_root_is_refused(store: FileReceiptStore, root: Path) -> None:
    root.rename(root.with_name("old"))
    root.mkdir(mode=0o700)
    with pytest.raises(UnsafePathError):
        store.publish(make_receipt())
    assert list(root.iterdir()) == []


def test_symlinked_shard_is_refused(store: FileReceiptStore, root: Path, outside: Path) -> None:
    receipt = make_receipt()
    (root / shard_of(receipt.attempt_id)).symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        store.publish(receipt)
    for operation in (store.read, store.exists, store.remove, store.quarantine):
        with pytest.raises(UnsafePathError):
            operation(receipt.attempt_id)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_symlinked_quarantine_dir_is_refused(
    store: FileReceiptStore, root: Path, outside: Path
) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    (root / ".quarantine").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        store.quarantine(receipt.attempt_id)
    with pytest.raises(UnsafePathError):
        store.quarantined_exists(receipt.attempt_id)
    assert store.read(receipt.attempt_id).receipt == receipt
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_symlinked_quarantine_shard_is_refused(
    store: FileReceiptStore, root: Path, outside: Path
) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    (root / ".quarantine").mkdir(mode=0o700)
    (root / ".quarantine" / shard_of(receipt.attempt_id)).symlink_to(outside)
    with pytest.raises(UnsafePathError):
        store.quarantine(receipt.attempt_id)
    with pytest.raises(UnsafePathError):
        store.purge_quarantined(receipt.attempt_id)
    assert store.read(receipt.attempt_id).receipt == receipt
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_group_writable_shard_is_refused(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    shard = root / shard_of(receipt.attempt_id)
    shard.mkdir()
    shard.chmod(0o770)
    with pytest.raises(UnsafePathError):
        store.publish(receipt)
    assert list(shard.iterdir()) == []


# -------------------------------------------------------------------- quarantine


def test_quarantine_moves_the_file(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    assert store.quarantine(receipt.attempt_id) is True
    assert not store.exists(receipt.attempt_id)
    assert store.quarantined_exists(receipt.attempt_id)
    assert quarantine_path(root, receipt.attempt_id).read_bytes() == serialize_receipt(receipt)
    assert store.quarantine(receipt.attempt_id) is False  # nothing left to move
    assert store.purge_quarantined(receipt.attempt_id) is True
    assert store.purge_quarantined(receipt.attempt_id) is False
    assert not store.quarantined_exists(receipt.attempt_id)


def test_quarantine_nothing(store: FileReceiptStore) -> None:
    assert store.quarantine(new_id()) is False
    assert store.quarantined_exists(new_id()) is False
    assert store.purge_quarantined(new_id()) is False


def test_quarantine_never_overwrites_a_different_file(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    slot = quarantine_path(root, receipt.attempt_id)
    slot.parent.mkdir(parents=True, mode=0o700)
    slot.write_bytes(b"earlier quarantined content")
    with pytest.raises(QuarantineConflictError):
        store.quarantine(receipt.attempt_id)
    assert slot.read_bytes() == b"earlier quarantined content"
    assert store.read(receipt.attempt_id).receipt == receipt


def test_quarantine_completes_after_a_crash_between_link_and_unlink(
    store: FileReceiptStore, root: Path
) -> None:
    receipt = make_receipt()
    store.publish(receipt)
    result = run_with_crash_point(
        "receipt.quarantine.after_link", root, f"store.quarantine({receipt.attempt_id!r})"
    )
    assert result.returncode == CRASH_EXIT_CODE, result.stderr
    original = final_path(root, receipt.attempt_id)
    copy = quarantine_path(root, receipt.attempt_id)
    assert os.path.samefile(original, copy)  # crashed with both names present

    assert store.quarantine(receipt.attempt_id) is True
    assert not original.exists()
    assert copy.read_bytes() == serialize_receipt(receipt)
    assert copy.stat().st_nlink == 1
    assert store.quarantine(receipt.attempt_id) is False


def test_crash_after_temp_leaves_only_an_auditable_temp(
    store: FileReceiptStore, root: Path
) -> None:
    receipt = make_receipt()
    result = run_with_crash_point(
        "receipt.publish.after_temp", root, "store.publish(receipt_from_env())", receipt
    )
    assert result.returncode == CRASH_EXIT_CODE, result.stderr
    shard = root / shard_of(receipt.attempt_id)
    leftovers = os.listdir(shard)
    assert len(leftovers) == 1
    match = TEMP_NAME_PATTERN.fullmatch(leftovers[0])
    assert match and match["attempt_id"] == receipt.attempt_id
    assert (shard / leftovers[0]).read_bytes() == serialize_receipt(receipt)  # complete, unlinked
    assert store.read(receipt.attempt_id).status is ReadStatus.MISSING

    assert store.publish(receipt) is PublishOutcome.PUBLISHED  # a retry uses a fresh temp name
    assert store.read(receipt.attempt_id).receipt == receipt
    assert sorted(os.listdir(shard)) == sorted([leftovers[0], f"{receipt.attempt_id}.json"])


def test_crash_after_link_leaves_a_valid_receipt(store: FileReceiptStore, root: Path) -> None:
    receipt = make_receipt()
    result = run_with_crash_point(
        "receipt.publish.after_link", root, "store.publish(receipt_from_env())", receipt
    )
    assert result.returncode == CRASH_EXIT_CODE, result.stderr
    assert store.read(receipt.attempt_id).receipt == receipt
    names = os.listdir(root / shard_of(receipt.attempt_id))
    assert len(names) == 2 and sum(bool(TEMP_NAME_PATTERN.fullmatch(n)) for n in names) == 1
    assert store.publish(receipt) is PublishOutcome.ALREADY_EXISTS


CHILD_PRELUDE = textwrap.dedent(
    """
    import json, os, sys
    from ql_core.receipts import FileReceiptStore, Receipt
    store = FileReceiptStore(sys.argv[1])
    def receipt_from_env():
        return Receipt(**json.loads(os.environ["RECEIPT_FIELDS"]))
    """
)


def run_with_crash_point(
    point: str, root: Path, statement: str, receipt: Receipt | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one store call in a fresh interpreter that dies hard at ``point``."""
    env = dict(os.environ, QL_CRASH_POINT=point)
    if receipt is not None:
        fields = {name: getattr(receipt, name) for name in Receipt.__slots__}
        env["RECEIPT_FIELDS"] = json.dumps(fields)
    code = CHILD_PRELUDE + statement + "\nsys.exit(0)\n"
    return subprocess.run(
        [sys.executable, "-c", code, str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_prepare_for_the_launcher_is_private_and_refuses_a_symlink(store: FileReceiptStore,
                                                                          root: Path, tmp_path: Path) -> None:
    attempt_id = new_id()
    path = Path(store.prepare(attempt_id))
    assert path == root / shard_of(attempt_id)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o700
    other = new_id()
    while shard_of(other) == shard_of(attempt_id):
        other = new_id()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / shard_of(other)).symlink_to(outside)
    with pytest.raises(UnsafePathError):
        store.prepare(other)
    assert list(outside.iterdir()) == []


def test_shards_up_front_are_made_once_private_with_one_root_fsync(tmp_path) -> None:
    """The file plugin's store makes every shard at its first open (one fsync of the root, not
    one per shard as receipts first land); a second open finds them and makes nothing."""
    import stat as st

    root = tmp_path / "receipts"
    store = FileReceiptStore(str(root), shards_up_front=True)
    names = sorted(os.listdir(root))
    assert names == [f"{i:02x}" for i in range(256)]
    assert all(st.S_IMODE(os.lstat(root / n).st_mode) == 0o700 for n in names)
    before = {n: os.lstat(root / n).st_ino for n in names}
    FileReceiptStore(str(root), shards_up_front=True)
    assert {n: os.lstat(root / n).st_ino for n in names} == before
    assert store.prepare("01a22b46-155c-7d09-872b-21304a3834ff") == str(root / "ff")
