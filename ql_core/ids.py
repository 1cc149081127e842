"""Identifiers: lowercase UUIDv7 (RFC 9562), the receipt shard of an id and a log's time shard.

Python 3.11 has no ``uuid.uuid7``; this is the RFC's layout: 48 bits of Unix
milliseconds, version 7, 12 random bits, variant 10, 62 random bits.
"""

from __future__ import annotations

import os
import re
import time

__all__ = ["new_id", "is_uuid7", "shard_of", "time_shard_of", "UUID7_PATTERN"]

UUID7_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def new_id(now_ms: int | None = None) -> str:
    """Return a fresh lowercase UUIDv7 string."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid7(value: object) -> bool:
    """True when ``value`` is a str holding exactly one lowercase UUIDv7."""
    return isinstance(value, str) and UUID7_PATTERN.fullmatch(value) is not None


def shard_of(identifier: str) -> str:
    """The two-hex-digit shard of an id: its *last* two hex digits (random bits).

    The reference shards by the first two digits, which are the top of a
    timestamp and put every receipt of a decade into one directory.
    """
    return identifier[-2:]


def time_shard_of(identifier: str) -> str:
    """The two-hex-digit *time* shard of a UUIDv7: bits 16-23 of its milliseconds, ``identifier[6:8]``.

    Ids made within the same 2**16 ms (~65 s) share it, and the 256 values come round every ~4.7 h:
    consecutive tasks' logs land in one directory (one directory block, one inode-table block, one
    set of bitmaps dirtied per ext4 journal commit instead of one per task's random shard: ~5 KB
    less per awaited task on the device, ``bench/bench_edge.py --bytes-only``), while the directory
    count stays bounded. The width is reasoned, not measured against others (the bench's tasks run
    back to back, where any width of seconds gives one directory): ~65 s keeps tasks seconds apart
    (``--pace``) together too, while ext4's journal commits every 5 s; a much wider bucket only
    gathers more files in one directory (bigger directory blocks to search and rewrite), a narrower
    one (2**12 ms, ~4 s) would switch directories between tasks a few seconds apart.
    """
    return identifier[6:8]
