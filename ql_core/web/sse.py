"""Server-Sent Events framing of a run's log (stdlib only): byte offsets as event ids, never a split
UTF-8 character, JSON payloads so newlines and carriage returns survive the framing."""

from __future__ import annotations

__all__ = ["sse_event", "utf8_complete_prefix", "parse_offset", "MAX_OFFSET_DIGITS"]

MAX_OFFSET_DIGITS = 18


def sse_event(*, data: str, event: str | None = None, id: int | None = None) -> bytes:
    """One SSE event; ``data`` must not contain a line break (we send JSON)."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.append(f"data: {data}")
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def utf8_complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 sequence."""
    n = len(data)
    for i in range(n - 1, max(n - 4, -1), -1):
        byte = data[i]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: look further back for the lead byte
        if byte & 0x80 == 0:
            return n
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return n if n - i >= need else i
    return n


def parse_offset(raw: str | None) -> int:
    """A byte offset from ``Last-Event-ID`` or ``?offset=``; ValueError when it is not one."""
    raw = raw or "0"
    if not raw.isascii() or not raw.isdigit() or len(raw) > MAX_OFFSET_DIGITS:
        raise ValueError("not a byte offset")
    return int(raw)
