"""Wall-clock milliseconds, rounded the way the protocol needs."""

from __future__ import annotations

import time

__all__ = ["now_ms", "now_ms_ceil"]


def now_ms() -> int:
    """Unix time in whole milliseconds (floor)."""
    return time.time_ns() // 1_000_000


def now_ms_ceil() -> int:
    """Unix time in milliseconds rounded *up*: an upper bound of "now" (finish times)."""
    return -(-time.time_ns() // 1_000_000)
