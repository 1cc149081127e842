"""Strict codec for CompletionReceipt version 1 (ADR-0007 §2.4). Pure: no I/O.

A receipt is untrusted input: the user's command runs as the same OS user and
could write anything at the receipt path. So the parser is deliberately
unforgiving — unknown or duplicate keys, floats, booleans, NaN, nested values,
out-of-range numbers, malformed ids or tokens are all rejected with a stable
:class:`RejectReason`, never repaired. A rejected receipt is quarantined by the
caller; the reason code is what gets persisted and logged.

Privacy rule: a :class:`ReceiptRejection`'s ``detail`` may name one of *our*
field names but never carries anything read from the file (no token, no
values, not even an unknown key's name, which the file chose).

The canonical encoding (:func:`serialize_receipt`) is a byte-for-byte
contract shared with the POSIX shell launcher, which produces it with::

    printf '{"schemaVersion":1,"runId":"%s","attemptId":"%s","callbackSequence":%s,'\
'"token":"%s","startedAtMs":%s,"finishedAtMs":%s,"exitCode":%s}' ...

Keys in exactly that order, no whitespace, no trailing newline, ASCII only.
The parser accepts any well-formed JSON object with exactly these keys (key
order and insignificant whitespace are not part of validity), so
``parse_receipt(serialize_receipt(r)) == r`` for every valid ``r``.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Final

from ql_core.ids import is_uuid7
from ql_core.value_class import value_class

__all__ = [
    "MAX_RECEIPT_BYTES",
    "MAX_SAFE_INTEGER",
    "RECEIPT_KEYS",
    "SCHEMA_VERSION",
    "TOKEN_PATTERN",
    "Receipt",
    "ReceiptRejection",
    "RejectReason",
    "parse_receipt",
    "serialize_receipt",
    "validate_receipt",
]

#: Hard cap on a receipt file's size (ADR-0007 §2.4: at most 4 KiB in version one).
MAX_RECEIPT_BYTES: Final = 4096

#: Largest integer accepted anywhere: 2**53 - 1, so every value survives a
#: round trip through any JSON implementation (JavaScript, jq, SQLite REAL...).
MAX_SAFE_INTEGER: Final = 2**53 - 1

#: The only schema version this codec reads or writes.
SCHEMA_VERSION: Final = 1

#: Wire keys in canonical order.
RECEIPT_KEYS: Final[tuple[str, ...]] = (
    "schemaVersion",
    "runId",
    "attemptId",
    "callbackSequence",
    "token",
    "startedAtMs",
    "finishedAtMs",
    "exitCode",
)

#: A callback token: 32–128 characters of the URL-safe base64 alphabet (DESIGN §6).
TOKEN_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{32,128}")

_UTF8_BOM: Final = b"\xef\xbb\xbf"
_INT_KEYS: Final = frozenset(
    {"schemaVersion", "callbackSequence", "startedAtMs", "finishedAtMs", "exitCode"}
)
_ID_KEYS: Final = frozenset({"runId", "attemptId"})
#: More digits than this cannot be ≤ MAX_SAFE_INTEGER (16 digits), with room for a sign.
_MAX_INT_LITERAL_LEN: Final = 17


@value_class()  # as @dataclass(frozen=True, slots=True), without its import-time code generation
class Receipt:
    """A decoded, version-1 completion receipt (field names are snake_case of the wire keys).

    Construction does not validate — :func:`serialize_receipt` and
    :func:`validate_receipt` do — so a caller can build one from database
    columns and learn *why* it is invalid instead of getting a bare exception.
    """

    __slots__ = ("schema_version", "run_id", "attempt_id", "callback_sequence", "token", "started_at_ms",
                 "finished_at_ms", "exit_code")
    schema_version: int
    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str
    started_at_ms: int
    finished_at_ms: int
    exit_code: int

    def __init__(self, schema_version: int, run_id: str, attempt_id: str, callback_sequence: int, token: str,
                 started_at_ms: int, finished_at_ms: int, exit_code: int) -> None:
        _set = object.__setattr__
        _set(self, "schema_version", schema_version)
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)
        _set(self, "callback_sequence", callback_sequence)
        _set(self, "token", token)
        _set(self, "started_at_ms", started_at_ms)
        _set(self, "finished_at_ms", finished_at_ms)
        _set(self, "exit_code", exit_code)


class RejectReason(enum.StrEnum):
    """Stable reason codes for a rejected receipt; persisted and reported, never renamed."""

    OVERSIZED = "oversized"
    NOT_UTF8 = "not_utf8"
    BOM = "bom"
    INVALID_JSON = "invalid_json"
    NOT_OBJECT = "not_object"
    DUPLICATE_KEY = "duplicate_key"
    UNKNOWN_KEY = "unknown_key"
    MISSING_KEY = "missing_key"
    NESTED_VALUE = "nested_value"
    NON_FINITE_NUMBER = "non_finite_number"
    WRONG_TYPE = "wrong_type"
    INTEGER_OUT_OF_RANGE = "integer_out_of_range"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
    EXIT_CODE_OUT_OF_RANGE = "exit_code_out_of_range"
    NEGATIVE_TIME = "negative_time"
    FINISHED_BEFORE_STARTED = "finished_before_started"
    INVALID_ID = "invalid_id"
    INVALID_TOKEN = "invalid_token"
    INVALID_SEQUENCE = "invalid_sequence"
    # Produced by stores, not by the pure codec:
    NOT_REGULAR_FILE = "not_regular_file"
    ID_MISMATCH = "id_mismatch"


@value_class()  # as @dataclass(frozen=True), without its import-time code generation
class ReceiptRejection:
    """Why a receipt was refused. ``detail`` never contains data read from the file."""

    __slots__ = ("reason", "detail")
    reason: RejectReason
    detail: str

    def __init__(self, reason: RejectReason, detail: str) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)


class _NonFinite:
    """Marker for NaN/Infinity literals, so they are reported instead of becoming floats."""

    __slots__ = ()


class _Float:
    """Marker for any JSON number with a fraction or exponent (never valid here)."""

    __slots__ = ()


class _HugeInt:
    """Marker for an integer literal too long to be in range (avoids big-int parsing)."""

    __slots__ = ()


class _Object:
    """A decoded JSON object kept as its raw pairs, so duplicate keys stay visible."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        self.pairs = pairs


_NON_FINITE: Final = _NonFinite()
_FLOAT: Final = _Float()
_HUGE_INT: Final = _HugeInt()


def _parse_int(literal: str) -> int | _HugeInt:
    return _HUGE_INT if len(literal) > _MAX_INT_LITERAL_LEN else int(literal)


_DECODER: Final = json.JSONDecoder(
    object_pairs_hook=_Object,
    parse_float=lambda _literal: _FLOAT,
    parse_int=_parse_int,
    parse_constant=lambda _literal: _NON_FINITE,
    strict=True,
)


def _reject(reason: RejectReason, detail: str) -> ReceiptRejection:
    return ReceiptRejection(reason, detail)


def _decode_document(data: bytes) -> object | ReceiptRejection:
    """Bytes → raw JSON value (with markers), or the byte/syntax-level rejection."""
    if len(data) > MAX_RECEIPT_BYTES:
        return _reject(RejectReason.OVERSIZED, f"larger than {MAX_RECEIPT_BYTES} bytes")
    if data.startswith(_UTF8_BOM):
        return _reject(RejectReason.BOM, "starts with a UTF-8 byte order mark")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return _reject(RejectReason.NOT_UTF8, "not valid UTF-8")
    try:
        document: object = _DECODER.decode(text)
    except RecursionError:
        return _reject(RejectReason.NESTED_VALUE, "nesting too deep")
    except ValueError:  # json.JSONDecodeError is a ValueError
        return _reject(RejectReason.INVALID_JSON, "not a single valid JSON document")
    return document


def _check_keys(obj: _Object) -> dict[str, object] | ReceiptRejection:
    """Exactly the eight known keys, each once."""
    seen: dict[str, object] = {}
    duplicate_known: str | None = None
    duplicate_unknown = False
    unknown = 0
    for key, value in obj.pairs:
        if key in seen:
            if key in RECEIPT_KEYS:
                duplicate_known = duplicate_known or key
            else:
                duplicate_unknown = True
        seen[key] = value
        if key not in RECEIPT_KEYS:
            unknown += 1
    if duplicate_known is not None:
        return _reject(RejectReason.DUPLICATE_KEY, f"duplicate key {duplicate_known}")
    if duplicate_unknown:
        return _reject(RejectReason.DUPLICATE_KEY, "duplicate key")
    if unknown:
        return _reject(RejectReason.UNKNOWN_KEY, f"{unknown} unknown key(s)")
    for key in RECEIPT_KEYS:
        if key not in seen:
            return _reject(RejectReason.MISSING_KEY, f"missing key {key}")
    return seen


def _check_scalar(key: str, value: object) -> ReceiptRejection | None:
    """Reject values that are not plain JSON scalars of the right kind."""
    if isinstance(value, (_Object, list)):
        return _reject(RejectReason.NESTED_VALUE, f"{key} is an object or array")
    if value is _NON_FINITE:
        return _reject(RejectReason.NON_FINITE_NUMBER, f"{key} is NaN or Infinity")
    if key in _INT_KEYS:
        if value is _HUGE_INT:
            return _reject(RejectReason.INTEGER_OUT_OF_RANGE, f"{key} is too large")
        if type(value) is not int:  # bool is an int subclass: excluded on purpose
            return _reject(RejectReason.WRONG_TYPE, f"{key} must be an integer")
    elif type(value) is not str:
        return _reject(RejectReason.WRONG_TYPE, f"{key} must be a string")
    return None


def _check_int_ranges(receipt: Receipt) -> ReceiptRejection | None:
    """Semantic ranges of the integer fields, in canonical key order."""
    if receipt.schema_version != SCHEMA_VERSION:
        return _reject(RejectReason.UNSUPPORTED_SCHEMA_VERSION, "schemaVersion must be 1")
    if receipt.callback_sequence < 1:
        return _reject(RejectReason.INVALID_SEQUENCE, "callbackSequence must be >= 1")
    if receipt.callback_sequence > MAX_SAFE_INTEGER:
        return _reject(RejectReason.INTEGER_OUT_OF_RANGE, "callbackSequence is too large")
    times = (("startedAtMs", receipt.started_at_ms), ("finishedAtMs", receipt.finished_at_ms))
    for key, value in times:
        if value < 0:
            return _reject(RejectReason.NEGATIVE_TIME, f"{key} is negative")
        if value > MAX_SAFE_INTEGER:
            return _reject(RejectReason.INTEGER_OUT_OF_RANGE, f"{key} is too large")
    if receipt.finished_at_ms < receipt.started_at_ms:
        return _reject(RejectReason.FINISHED_BEFORE_STARTED, "finishedAtMs < startedAtMs")
    if not 0 <= receipt.exit_code <= 255:
        return _reject(RejectReason.EXIT_CODE_OUT_OF_RANGE, "exitCode must be 0..255")
    return None


def _check_strings(receipt: Receipt) -> ReceiptRejection | None:
    if not is_uuid7(receipt.run_id):
        return _reject(RejectReason.INVALID_ID, "runId is not a lowercase UUIDv7")
    if not is_uuid7(receipt.attempt_id):
        return _reject(RejectReason.INVALID_ID, "attemptId is not a lowercase UUIDv7")
    if TOKEN_PATTERN.fullmatch(receipt.token) is None:
        return _reject(RejectReason.INVALID_TOKEN, "token must be 32-128 of [A-Za-z0-9_-]")
    return None


def _fields(receipt: Receipt) -> tuple[tuple[str, object], ...]:
    """(wire key, value) pairs in canonical order."""
    return (
        ("schemaVersion", receipt.schema_version),
        ("runId", receipt.run_id),
        ("attemptId", receipt.attempt_id),
        ("callbackSequence", receipt.callback_sequence),
        ("token", receipt.token),
        ("startedAtMs", receipt.started_at_ms),
        ("finishedAtMs", receipt.finished_at_ms),
        ("exitCode", receipt.exit_code),
    )


def validate_receipt(receipt: Receipt) -> ReceiptRejection | None:
    """Return why ``receipt`` is not a valid version-1 receipt, or None if it is.

    The same rules as :func:`parse_receipt` after decoding, including exact
    types (``True`` is not an exit code even though ``bool`` subclasses ``int``).
    """
    for key, value in _fields(receipt):
        problem = _check_scalar(key, value)
        if problem is not None:
            return problem
    return _check_int_ranges(receipt) or _check_strings(receipt)


def parse_receipt(data: bytes) -> Receipt | ReceiptRejection:
    """Decode and validate receipt bytes. Never raises for any ``bytes`` input.

    Checks run in a fixed order (size, BOM, UTF-8, JSON syntax, object, keys,
    value kinds, ranges, ids, token) so the reported reason is deterministic.
    """
    document = _decode_document(bytes(data))
    if isinstance(document, ReceiptRejection):
        return document
    if not isinstance(document, _Object):
        return _reject(RejectReason.NOT_OBJECT, "top-level value is not an object")
    values = _check_keys(document)
    if isinstance(values, ReceiptRejection):
        return values
    for key in RECEIPT_KEYS:
        problem = _check_scalar(key, values[key])
        if problem is not None:
            return problem
    receipt = Receipt(
        schema_version=values["schemaVersion"],  # type: ignore[arg-type]  # checked above
        run_id=values["runId"],  # type: ignore[arg-type]
        attempt_id=values["attemptId"],  # type: ignore[arg-type]
        callback_sequence=values["callbackSequence"],  # type: ignore[arg-type]
        token=values["token"],  # type: ignore[arg-type]
        started_at_ms=values["startedAtMs"],  # type: ignore[arg-type]
        finished_at_ms=values["finishedAtMs"],  # type: ignore[arg-type]
        exit_code=values["exitCode"],  # type: ignore[arg-type]
    )
    return _check_int_ranges(receipt) or _check_strings(receipt) or receipt


def serialize_receipt(receipt: Receipt) -> bytes:
    """Canonical bytes of a valid receipt; raises ValueError if ``receipt`` is invalid.

    Validation first means every string is pure ASCII with no character JSON
    would escape (ids are hex, tokens are ``[A-Za-z0-9_-]``), so plain
    formatting is exactly what ``printf`` in the shell launcher produces.
    """
    problem = validate_receipt(receipt)
    if problem is not None:
        raise ValueError(f"invalid receipt ({problem.reason}): {problem.detail}")
    body = ",".join(
        f'"{key}":"{value}"' if isinstance(value, str) else f'"{key}":{value}'
        for key, value in _fields(receipt)
    )
    return ("{" + body + "}").encode("ascii")
