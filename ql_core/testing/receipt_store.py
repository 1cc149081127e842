"""The promises a receipt store makes to core (ADR-0007 §2.4, §2.5)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from ql_core.ids import new_id
from ql_core.ports.receipt_store import ReceiptStore
from ql_core.receipts.codec import Receipt

__all__ = ["ReceiptStoreContract", "sample_receipt"]


def sample_receipt(*, exit_code: int = 0, token: str = "t" * 43, attempt_id: str | None = None) -> Receipt:
    return Receipt(schema_version=1, run_id=new_id(), attempt_id=attempt_id or new_id(), callback_sequence=1,
                   token=token, started_at_ms=1_700_000_000_000, finished_at_ms=1_700_000_000_500,
                   exit_code=exit_code)


class ReceiptStoreContract:
    """Subclass and provide ``make_store(root: Path) -> ReceiptStore`` as a fixture."""

    @pytest.fixture
    def make_store(self) -> Callable[[Path], ReceiptStore]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide a make_store fixture")

    @pytest.fixture
    def store(self, make_store: Callable[[Path], ReceiptStore], tmp_path: Path) -> ReceiptStore:
        root = tmp_path / "receipts"
        root.mkdir(mode=0o700)
        return make_store(root)

    def test_published_receipt_reads_back_equal(self, store: ReceiptStore) -> None:
        receipt = sample_receipt(exit_code=7)
        assert str(store.publish(receipt)) == "published"
        read = store.read(receipt.attempt_id)
        assert str(read.status) == "valid" and read.receipt == receipt

    def test_publication_never_overwrites(self, store: ReceiptStore) -> None:
        first = sample_receipt(exit_code=0)
        second = sample_receipt(exit_code=1, token="u" * 43, attempt_id=first.attempt_id)
        store.publish(first)
        assert str(store.publish(second)) == "already_exists"
        assert store.read(first.attempt_id).receipt == first

    def test_missing_is_missing_not_an_error(self, store: ReceiptStore) -> None:
        assert str(store.read(new_id()).status) == "missing"
        assert store.remove(new_id()) is False
        assert store.quarantine(new_id()) is False

    def test_remove_after_consumption(self, store: ReceiptStore) -> None:
        receipt = sample_receipt()
        store.publish(receipt)
        assert store.remove(receipt.attempt_id) is True
        assert str(store.read(receipt.attempt_id).status) == "missing"

    def test_quarantine_moves_and_is_idempotent(self, store: ReceiptStore) -> None:
        receipt = sample_receipt()
        store.publish(receipt)
        assert store.quarantine(receipt.attempt_id) is True
        assert str(store.read(receipt.attempt_id).status) == "missing"
        assert store.quarantined_exists(receipt.attempt_id)
        assert store.quarantine(receipt.attempt_id) is False
        assert store.purge_quarantined(receipt.attempt_id) is True
        assert not store.quarantined_exists(receipt.attempt_id)

    def test_a_valid_receipt_after_a_quarantine_still_publishes(self, store: ReceiptStore) -> None:
        bad = sample_receipt(token="x" * 43)
        store.publish(bad)
        store.quarantine(bad.attempt_id)
        good = sample_receipt(attempt_id=bad.attempt_id)
        assert str(store.publish(good)) == "published"
        assert store.read(bad.attempt_id).receipt == good

    def test_relative_ref_is_bounded_relative_and_stable(self, store: ReceiptStore) -> None:
        attempt_id = new_id()
        ref = store.relative_ref(attempt_id)
        assert isinstance(ref, str) and ref and len(ref) <= 64
        assert not ref.startswith("/") and ".." not in ref.split("/")
        assert store.relative_ref(attempt_id) == ref and store.relative_ref(new_id()) != ref

    def test_prepare_gives_a_location_and_is_idempotent(self, store: ReceiptStore) -> None:
        attempt_id = new_id()
        location = store.prepare(attempt_id)
        assert isinstance(location, str) and location
        assert store.prepare(attempt_id) == location
        assert str(store.read(attempt_id).status) == "missing"  # preparing publishes nothing

    def test_a_second_quarantine_never_overwrites_the_first(self, store: ReceiptStore) -> None:
        from ql_core.ports.receipt_store import QuarantineConflictError

        first = sample_receipt(token="a" * 43)
        store.publish(first)
        store.quarantine(first.attempt_id)
        second = sample_receipt(token="b" * 43, attempt_id=first.attempt_id)
        store.publish(second)
        with pytest.raises(QuarantineConflictError):
            store.quarantine(first.attempt_id)
        assert store.read(first.attempt_id).receipt == second  # kept in place, nothing lost

    def test_ids_are_validated_before_any_path_is_built(self, store: ReceiptStore) -> None:
        for bad in ("../../etc/passwd", "", "01900000-0000-7000-8000-00000000000G"):
            for operation in (store.read, store.remove, store.quarantine, store.prepare, store.relative_ref):
                with pytest.raises(ValueError):
                    operation(bad)
