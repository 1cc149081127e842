"""Completion receipts (ADR-0007 §2.4): the strict codec and the atomic file store."""

from ql_core.receipts.codec import (
    MAX_RECEIPT_BYTES,
    MAX_SAFE_INTEGER,
    RECEIPT_KEYS,
    SCHEMA_VERSION,
    TOKEN_PATTERN,
    Receipt,
    ReceiptRejection,
    RejectReason,
    parse_receipt,
    serialize_receipt,
    validate_receipt,
)
def __getattr__(name: str) -> object:
    """The file store's names (its ``__all__``), loaded on first use (PEP 562): importing the codec
    (every launch encodes a receipt) must not pay for the store, which only the receipt-store
    plugin, the audit and tests open (issue 25 item 3: ~1.6-3.4 ms of a one-shot ``ql run``)."""
    if name[:1].isupper():  # its names are all classes and constants (not `file_store` itself)
        import importlib

        file_store = importlib.import_module(f"{__name__}.file_store")
        if name in file_store.__all__:
            return getattr(file_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MAX_RECEIPT_BYTES",
    "MAX_SAFE_INTEGER",
    "QUARANTINE_DIR_NAME",
    "RECEIPT_KEYS",
    "RECEIPT_NAME_PATTERN",
    "SCHEMA_VERSION",
    "TEMP_NAME_PATTERN",
    "TOKEN_PATTERN",
    "FileReceiptStore",
    "PublishOutcome",
    "QuarantineConflictError",
    "ReadStatus",
    "Receipt",
    "ReceiptPublishError",
    "ReceiptRead",
    "ReceiptRejection",
    "ReceiptStoreError",
    "RejectReason",
    "UnsafePathError",
    "parse_receipt",
    "serialize_receipt",
    "validate_receipt",
]
