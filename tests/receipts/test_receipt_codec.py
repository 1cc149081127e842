"""Explicit examples for the receipt codec: the canonical bytes and one test per reject reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ql_core.ids import new_id
from ql_core.receipts import (
    MAX_RECEIPT_BYTES,
    MAX_SAFE_INTEGER,
    RECEIPT_KEYS,
    Receipt,
    ReceiptRejection,
    RejectReason,
    parse_receipt,
    serialize_receipt,
    validate_receipt,
)

RUN_ID = "01890a5d-ac96-774b-bcce-b302099a8057"
ATTEMPT_ID = "01890a5d-ac97-7d4e-9f3a-6b0e2c1d4a5f"
TOKEN = "SECRETtoken_" + "x" * 20 + "-Zz9"  # 36 chars, distinctive so leaks are visible

#: Reasons produced by stores (file type, path/content id), not by the pure codec.
STORE_ONLY_REASONS = {RejectReason.NOT_REGULAR_FILE, RejectReason.ID_MISMATCH}


def make_receipt(**changes: object) -> Receipt:
    fields: dict[str, object] = {
        "schema_version": 1,
        "run_id": RUN_ID,
        "attempt_id": ATTEMPT_ID,
        "callback_sequence": 1,
        "token": TOKEN,
        "started_at_ms": 1_700_000_000_000,
        "finished_at_ms": 1_700_000_000_250,
        "exit_code": 0,
    }
    fields.update(changes)
    return Receipt(**fields)  # type: ignore[arg-type]


def base_pairs() -> list[tuple[str, str]]:
    """The canonical receipt as (key, raw JSON literal) pairs, ready to be tampered with."""
    decoded = json.loads(serialize_receipt(make_receipt()))
    return [(key, json.dumps(decoded[key])) for key in RECEIPT_KEYS]


def render(pairs: list[tuple[str, str]]) -> bytes:
    """JSON object text from raw literals — allows duplicates and invalid values on purpose."""
    return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}").encode()


def with_value(key: str, literal: str) -> bytes:
    return render([(k, literal if k == key else v) for k, v in base_pairs()])


CANONICAL = serialize_receipt(make_receipt())

# (reason, example bytes). Every codec-level reason needs at least one row.
EXAMPLES: list[tuple[RejectReason, bytes]] = [
    (RejectReason.OVERSIZED, CANONICAL + b" " * (MAX_RECEIPT_BYTES + 1 - len(CANONICAL))),
    (RejectReason.OVERSIZED, b"x" * 100_000),
    (RejectReason.NOT_UTF8, CANONICAL.replace(b"SECRET", b"SECR\xff\xfe")),
    (RejectReason.NOT_UTF8, b'{"runId":"\xed\xa0\x80"}'),  # an encoded surrogate
    (RejectReason.NOT_UTF8, b"\xff\xfe" + CANONICAL.decode().encode("utf-16-le")),
    (RejectReason.BOM, b"\xef\xbb\xbf" + CANONICAL),
    (RejectReason.INVALID_JSON, b""),
    (RejectReason.INVALID_JSON, CANONICAL[:-1]),
    (RejectReason.INVALID_JSON, CANONICAL + b"x"),
    (RejectReason.INVALID_JSON, CANONICAL + CANONICAL),
    (RejectReason.INVALID_JSON, CANONICAL.replace(b"SECRET", b"SEC\x01RET")),  # control char
    (RejectReason.INVALID_JSON, with_value("exitCode", "01")),  # leading zero
    (RejectReason.INVALID_JSON, with_value("exitCode", "+1")),
    (RejectReason.NOT_OBJECT, b"[]"),
    (RejectReason.NOT_OBJECT, b"1"),
    (RejectReason.NOT_OBJECT, b'"receipt"'),
    (RejectReason.NOT_OBJECT, b"null"),
    (RejectReason.DUPLICATE_KEY, render([*base_pairs(), ("exitCode", "0")])),
    (RejectReason.DUPLICATE_KEY, render([*base_pairs(), ("x", "1"), ("x", "1")])),
    (RejectReason.UNKNOWN_KEY, render([*base_pairs(), ("extraSecretKey", "1")])),
    (RejectReason.UNKNOWN_KEY, render([*base_pairs(), ("exit_code", "0")])),
    (RejectReason.UNKNOWN_KEY, render([*base_pairs(), ("ExitCode", "0")])),
    (RejectReason.MISSING_KEY, render([p for p in base_pairs() if p[0] != "exitCode"])),
    (RejectReason.MISSING_KEY, b"{}"),
    (RejectReason.NESTED_VALUE, with_value("exitCode", "[0]")),
    (RejectReason.NESTED_VALUE, with_value("runId", '{"a":1}')),
    (RejectReason.NESTED_VALUE, b"[" * 2000 + b"]" * 2000),  # RecursionError inside json
    (RejectReason.NON_FINITE_NUMBER, with_value("exitCode", "NaN")),
    (RejectReason.NON_FINITE_NUMBER, with_value("startedAtMs", "Infinity")),
    (RejectReason.NON_FINITE_NUMBER, with_value("finishedAtMs", "-Infinity")),
    (RejectReason.WRONG_TYPE, with_value("exitCode", "true")),
    (RejectReason.WRONG_TYPE, with_value("exitCode", "false")),
    (RejectReason.WRONG_TYPE, with_value("exitCode", "0.0")),
    (RejectReason.WRONG_TYPE, with_value("exitCode", "1e0")),
    (RejectReason.WRONG_TYPE, with_value("exitCode", "1e999")),
    (RejectReason.WRONG_TYPE, with_value("exitCode", '"0"')),
    (RejectReason.WRONG_TYPE, with_value("exitCode", "null")),
    (RejectReason.WRONG_TYPE, with_value("schemaVersion", "true")),  # True == 1 in Python
    (RejectReason.WRONG_TYPE, with_value("callbackSequence", "1.0")),
    (RejectReason.WRONG_TYPE, with_value("runId", "1")),
    (RejectReason.WRONG_TYPE, with_value("token", "12345678901234567890123456789012345")),
    (RejectReason.INTEGER_OUT_OF_RANGE, with_value("finishedAtMs", str(2**53))),
    (RejectReason.INTEGER_OUT_OF_RANGE, with_value("callbackSequence", str(2**64))),
    (RejectReason.INTEGER_OUT_OF_RANGE, with_value("startedAtMs", "9" * 3500)),
    (RejectReason.UNSUPPORTED_SCHEMA_VERSION, with_value("schemaVersion", "2")),
    (RejectReason.UNSUPPORTED_SCHEMA_VERSION, with_value("schemaVersion", "0")),
    (RejectReason.EXIT_CODE_OUT_OF_RANGE, with_value("exitCode", "256")),
    (RejectReason.EXIT_CODE_OUT_OF_RANGE, with_value("exitCode", "-1")),
    (RejectReason.NEGATIVE_TIME, with_value("startedAtMs", "-1")),
    (RejectReason.FINISHED_BEFORE_STARTED, with_value("finishedAtMs", "1699999999999")),
    (RejectReason.INVALID_ID, with_value("runId", json.dumps(RUN_ID.upper()))),
    (RejectReason.INVALID_ID, with_value("attemptId", '"6f1c7c1e-8d2a-4b9e-9c3f-2a1b0c9d8e7f"')),
    (RejectReason.INVALID_ID, with_value("attemptId", '"../../etc/passwd"')),
    (RejectReason.INVALID_ID, with_value("runId", json.dumps(" " + RUN_ID))),
    (RejectReason.INVALID_TOKEN, with_value("token", json.dumps("a" * 31))),
    (RejectReason.INVALID_TOKEN, with_value("token", json.dumps("a" * 129))),
    (RejectReason.INVALID_TOKEN, with_value("token", json.dumps("a" * 31 + "+"))),
    (RejectReason.INVALID_TOKEN, with_value("token", json.dumps("a" * 31 + "\n"))),
    (RejectReason.INVALID_TOKEN, with_value("token", json.dumps("a" * 31 + "é"))),
    (RejectReason.INVALID_SEQUENCE, with_value("callbackSequence", "0")),
    (RejectReason.INVALID_SEQUENCE, with_value("callbackSequence", "-3")),
]


def test_every_codec_reason_has_an_example() -> None:
    covered = {reason for reason, _ in EXAMPLES}
    assert covered == set(RejectReason) - STORE_ONLY_REASONS


EXAMPLE_IDS = [f"{reason}-{i}" for i, (reason, _) in enumerate(EXAMPLES)]


@pytest.mark.parametrize(("reason", "data"), EXAMPLES, ids=EXAMPLE_IDS)
def test_rejection_example(reason: RejectReason, data: bytes) -> None:
    result = parse_receipt(data)
    assert isinstance(result, ReceiptRejection)
    assert result.reason is reason


@pytest.mark.parametrize(("reason", "data"), EXAMPLES, ids=EXAMPLE_IDS)
def test_rejection_detail_never_echoes_file_content(reason: RejectReason, data: bytes) -> None:
    result = parse_receipt(data)
    assert isinstance(result, ReceiptRejection)
    for secret in ("SECRET", "xxxxx", "extraSecretKey", RUN_ID, ATTEMPT_ID, "passwd", "1700000"):
        assert secret not in result.detail


#: The shell launcher's printf format string, verbatim from docs/receipt-publication.md.
LAUNCHER_PRINTF = (
    '{"schemaVersion":1,"runId":"%s","attemptId":"%s","callbackSequence":%s,'
    '"token":"%s","startedAtMs":%s,"finishedAtMs":%s,"exitCode":%s}'
)


def test_canonical_bytes_are_exactly_the_launcher_format() -> None:
    values = (RUN_ID, ATTEMPT_ID, 1, TOKEN, 1_700_000_000_000, 1_700_000_000_250, 0)
    expected = (LAUNCHER_PRINTF % values).encode("ascii")
    assert expected == CANONICAL
    assert not CANONICAL.endswith(b"\n")


def test_round_trip() -> None:
    receipt = make_receipt(callback_sequence=7, exit_code=255)
    assert parse_receipt(serialize_receipt(receipt)) == receipt


def test_pretty_printed_reordered_json_is_accepted() -> None:
    decoded = json.loads(CANONICAL)
    pretty = json.dumps(dict(reversed(list(decoded.items()))), indent=2).encode() + b"\n"
    assert parse_receipt(pretty) == make_receipt()


def test_exactly_max_bytes_is_accepted() -> None:
    padded = CANONICAL + b" " * (MAX_RECEIPT_BYTES - len(CANONICAL))
    assert len(padded) == MAX_RECEIPT_BYTES
    assert parse_receipt(padded) == make_receipt()


def test_boundary_values_are_accepted() -> None:
    receipt = make_receipt(
        callback_sequence=MAX_SAFE_INTEGER,
        started_at_ms=0,
        finished_at_ms=MAX_SAFE_INTEGER,
        exit_code=255,
        token="A" * 128,
    )
    assert parse_receipt(serialize_receipt(receipt)) == receipt
    same_time = make_receipt(started_at_ms=5, finished_at_ms=5, token="_-" * 16)
    assert parse_receipt(serialize_receipt(same_time)) == same_time


def test_parse_accepts_bytearray_and_memoryview() -> None:
    assert parse_receipt(bytearray(CANONICAL)) == make_receipt()  # type: ignore[arg-type]
    assert parse_receipt(memoryview(CANONICAL)) == make_receipt()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"exit_code": True}, RejectReason.WRONG_TYPE),
        ({"schema_version": True}, RejectReason.WRONG_TYPE),
        ({"exit_code": 1.0}, RejectReason.WRONG_TYPE),
        ({"started_at_ms": "5"}, RejectReason.WRONG_TYPE),
        ({"run_id": None}, RejectReason.WRONG_TYPE),
        ({"token": ["x"]}, RejectReason.NESTED_VALUE),
        ({"exit_code": 256}, RejectReason.EXIT_CODE_OUT_OF_RANGE),
        ({"schema_version": 2}, RejectReason.UNSUPPORTED_SCHEMA_VERSION),
        ({"callback_sequence": 0}, RejectReason.INVALID_SEQUENCE),
        ({"started_at_ms": 2**53}, RejectReason.INTEGER_OUT_OF_RANGE),
        ({"started_at_ms": -1}, RejectReason.NEGATIVE_TIME),
        ({"finished_at_ms": 0}, RejectReason.FINISHED_BEFORE_STARTED),
        ({"attempt_id": ATTEMPT_ID.upper()}, RejectReason.INVALID_ID),
        ({"token": 'a"' * 20}, RejectReason.INVALID_TOKEN),
    ],
)
def test_serialize_refuses_invalid_receipts(
    changes: dict[str, object], reason: RejectReason
) -> None:
    receipt = make_receipt(**changes)
    rejection = validate_receipt(receipt)
    assert rejection is not None and rejection.reason is reason
    with pytest.raises(ValueError, match=str(reason)):
        serialize_receipt(receipt)


def test_serialize_error_does_not_echo_the_token() -> None:
    with pytest.raises(ValueError) as info:
        serialize_receipt(make_receipt(exit_code=999))
    assert "SECRET" not in str(info.value)


def test_fresh_ids_validate() -> None:
    receipt = make_receipt(run_id=new_id(), attempt_id=new_id())
    assert validate_receipt(receipt) is None


def test_receipt_is_frozen_and_slotted() -> None:
    receipt = make_receipt()
    with pytest.raises(AttributeError):
        receipt.exit_code = 3  # type: ignore[misc]
    assert not hasattr(receipt, "__dict__")


def test_reason_codes_are_stable_strings() -> None:
    assert RejectReason.DUPLICATE_KEY == "duplicate_key"
    assert RejectReason("not_regular_file") is RejectReason.NOT_REGULAR_FILE
    assert all(reason.value == reason.name.lower() for reason in RejectReason)


def test_documented_printf_matches_the_codec() -> None:
    """docs/receipt-publication.md is what the launcher author copies: keep it byte-exact."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "receipt-publication.md"
    lines = [line for line in doc.read_text().splitlines() if line.startswith("printf '")]
    assert len(lines) == 1
    assert lines[0].split("'")[1] == LAUNCHER_PRINTF
