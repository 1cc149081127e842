"""Property tests: valid receipts round-trip; any bytes parse to a result, never an exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ql_core.receipts import (
    MAX_SAFE_INTEGER,
    RECEIPT_KEYS,
    Receipt,
    ReceiptRejection,
    RejectReason,
    parse_receipt,
    serialize_receipt,
    validate_receipt,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOKEN_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
INT_KEYS = ("schemaVersion", "callbackSequence", "startedAtMs", "finishedAtMs", "exitCode")
STR_KEYS = ("runId", "attemptId", "token")


@st.composite
def uuid7s(draw: st.DrawFn) -> str:
    """Lowercase UUIDv7 strings built from drawn bits (deterministic, shrinkable)."""
    value = draw(st.integers(0, 2**48 - 1)) << 80
    value |= 0x7 << 76
    value |= draw(st.integers(0, 2**12 - 1)) << 64
    value |= 0b10 << 62
    value |= draw(st.integers(0, 2**62 - 1))
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@st.composite
def receipts(draw: st.DrawFn) -> Receipt:
    started = draw(st.integers(0, MAX_SAFE_INTEGER))
    finished = draw(st.integers(started, MAX_SAFE_INTEGER))
    return Receipt(
        schema_version=1,
        run_id=draw(uuid7s()),
        attempt_id=draw(uuid7s()),
        callback_sequence=draw(st.integers(1, MAX_SAFE_INTEGER)),
        token=draw(st.text(TOKEN_ALPHABET, min_size=32, max_size=128)),
        started_at_ms=started,
        finished_at_ms=finished,
        exit_code=draw(st.integers(0, 255)),
    )


def literal_pairs(receipt: Receipt) -> list[tuple[str, str]]:
    decoded = json.loads(serialize_receipt(receipt))
    return [(key, json.dumps(decoded[key])) for key in RECEIPT_KEYS]


def render(pairs: list[tuple[str, str]]) -> bytes:
    return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}").encode()


def assert_total(data: bytes) -> Receipt | ReceiptRejection:
    """parse_receipt returned one of its two result types; a Receipt is also fully valid."""
    result = parse_receipt(data)
    assert isinstance(result, (Receipt, ReceiptRejection))
    if isinstance(result, Receipt):
        assert validate_receipt(result) is None
        assert parse_receipt(serialize_receipt(result)) == result
    return result


@FAST
@given(receipts())
def test_valid_receipts_round_trip(receipt: Receipt) -> None:
    data = serialize_receipt(receipt)
    assert parse_receipt(data) == receipt
    assert data.isascii() and b" " not in data and b"\n" not in data
    assert data.startswith(b'{"schemaVersion":1,"runId":"')


@FAST
@given(receipts(), st.permutations(RECEIPT_KEYS), st.sampled_from([None, 0, 1, 4, "\t"]))
def test_key_order_and_whitespace_do_not_matter(
    receipt: Receipt, order: list[str], indent: int | str | None
) -> None:
    decoded = json.loads(serialize_receipt(receipt))
    reordered = {key: decoded[key] for key in order}
    assert parse_receipt(json.dumps(reordered, indent=indent).encode()) == receipt


@FAST
@given(
    receipts(),
    st.text(min_size=0, max_size=20).filter(lambda k: k not in RECEIPT_KEYS),
    st.sampled_from(["0", '"x"', "null", "[]", "{}", "true"]),
    st.integers(0, 8),
)
def test_extra_key_is_rejected(receipt: Receipt, key: str, literal: str, position: int) -> None:
    pairs = literal_pairs(receipt)
    pairs.insert(position, (key, literal))
    result = assert_total(render(pairs))
    assert isinstance(result, ReceiptRejection)
    assert result.reason in {RejectReason.UNKNOWN_KEY, RejectReason.OVERSIZED}


@FAST
@given(receipts(), st.sampled_from(RECEIPT_KEYS), st.integers(0, 8))
def test_duplicate_key_is_rejected(receipt: Receipt, key: str, position: int) -> None:
    pairs = literal_pairs(receipt)
    pairs.insert(position, (key, dict(pairs)[key]))
    result = assert_total(render(pairs))
    assert isinstance(result, ReceiptRejection) and result.reason is RejectReason.DUPLICATE_KEY


@FAST
@given(receipts(), st.sampled_from(RECEIPT_KEYS))
def test_missing_key_is_rejected(receipt: Receipt, key: str) -> None:
    pairs = [pair for pair in literal_pairs(receipt) if pair[0] != key]
    result = assert_total(render(pairs))
    assert isinstance(result, ReceiptRejection) and result.reason is RejectReason.MISSING_KEY


WRONG_FOR_INT = ["true", "false", "null", "1.5", "1.0", "2e0", "-0.0", '"1"', '""']
WRONG_FOR_STR = ["true", "false", "null", "1", "1.5", "0"]


@FAST
@given(receipts(), st.data())
def test_type_swaps_are_rejected(receipt: Receipt, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(RECEIPT_KEYS))
    wrong = data.draw(st.sampled_from(WRONG_FOR_INT if key in INT_KEYS else WRONG_FOR_STR))
    pairs = [(k, wrong if k == key else v) for k, v in literal_pairs(receipt)]
    result = assert_total(render(pairs))
    assert isinstance(result, ReceiptRejection) and result.reason is RejectReason.WRONG_TYPE


@FAST
@given(receipts(), st.sampled_from(RECEIPT_KEYS), st.sampled_from(["[]", "{}", "[1]", '{"a":[]}']))
def test_nested_values_are_rejected(receipt: Receipt, key: str, nested: str) -> None:
    pairs = [(k, nested if k == key else v) for k, v in literal_pairs(receipt)]
    result = assert_total(render(pairs))
    assert isinstance(result, ReceiptRejection) and result.reason is RejectReason.NESTED_VALUE


@FAST
@given(receipts(), st.sampled_from(INT_KEYS), st.sampled_from(["NaN", "Infinity", "-Infinity"]))
def test_non_finite_numbers_are_rejected(receipt: Receipt, key: str, constant: str) -> None:
    pairs = [(k, constant if k == key else v) for k, v in literal_pairs(receipt)]
    result = assert_total(render(pairs))
    assert isinstance(result, ReceiptRejection) and result.reason is RejectReason.NON_FINITE_NUMBER


@settings(max_examples=40, deadline=None)
@given(receipts())
def test_truncation_at_every_offset_is_rejected(receipt: Receipt) -> None:
    data = serialize_receipt(receipt)
    for end in range(len(data)):
        result = assert_total(data[:end])
        assert isinstance(result, ReceiptRejection), end
        assert result.reason is RejectReason.INVALID_JSON


@FAST
@given(receipts(), st.data())
def test_random_byte_flips_never_raise(receipt: Receipt, data: st.DataObject) -> None:
    raw = bytearray(serialize_receipt(receipt))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(raw) - 1))
        raw[index] ^= data.draw(st.integers(1, 255))
    assert_total(bytes(raw))


@FAST
@given(receipts(), st.data())
def test_random_insertions_and_deletions_never_raise(receipt: Receipt, data: st.DataObject) -> None:
    raw = serialize_receipt(receipt)
    start = data.draw(st.integers(0, len(raw)))
    end = data.draw(st.integers(start, min(len(raw), start + 8)))
    filler = data.draw(st.binary(max_size=8))
    assert_total(raw[:start] + filler + raw[end:])


@FAST
@given(st.binary(max_size=5000))
def test_random_bytes_never_raise(data: bytes) -> None:
    assert_total(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@FAST
@given(json_values)
def test_arbitrary_json_never_raises(value: object) -> None:
    result = assert_total(json.dumps(value).encode())
    assert isinstance(result, ReceiptRejection)


@FAST
@given(st.dictionaries(st.sampled_from(RECEIPT_KEYS), json_values, max_size=8))
def test_arbitrary_values_under_real_keys_never_raise(obj: dict[str, object]) -> None:
    assert_total(json.dumps(obj).encode())
