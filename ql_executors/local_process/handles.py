"""The durable handle of a local task: the JSON document core stores without reading.

It holds the launcher's identity (:mod:`.identity`: boot id, pid, process group, start time) and,
when known, the attempt's start on the boot clock (``start_boot_ms``), from which recovery measures
a deadline as a duration (docs/launcher.md).
"""

from __future__ import annotations

import json

from . import identity

__all__ = ["START_BOOT_KEY", "encode_handle", "decode_handle", "handle_dict", "start_boot"]

#: The handle key of the attempt's start on the boot clock (CLOCK_BOOTTIME ms, :func:`start_boot`).
START_BOOT_KEY = "start_boot_ms"
#: What ``json.dumps(data, separators=(",", ":"), sort_keys=True)`` builds on every call, built once
#: (a handle is encoded for every task).
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def encode_handle(handle: identity.ProcessHandle, *, start_boot_ms: int | None = None) -> str:
    """The stored form of a handle: compact JSON of :func:`identity.handle_to_dict` (well under 512
    bytes), with the attempt's start on the boot clock when known (its boot is the handle's)."""
    data = identity.handle_to_dict(handle)
    if start_boot_ms is not None:
        data[START_BOOT_KEY] = start_boot_ms
    return _ENCODER.encode(data)


def handle_dict(data: str | None) -> dict | None:
    """The stored handle as a dict; anything that is not a JSON object is None."""
    if not data:
        return None
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def decode_handle(data: str | None) -> identity.ProcessHandle | None:
    """Parse a stored handle; anything malformed is None (callers fail closed)."""
    parsed = handle_dict(data)
    if parsed is None:
        return None
    parsed.pop(START_BOOT_KEY, None)
    try:
        return identity.handle_from_dict(parsed)
    except ValueError:
        return None


def start_boot(data: str | None) -> int | None:
    """The attempt's start on the boot clock recorded in a handle, or None."""
    parsed = handle_dict(data)
    value = parsed.get(START_BOOT_KEY) if parsed is not None else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
