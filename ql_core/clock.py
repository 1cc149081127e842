"""Clocks: wall-clock milliseconds rounded the way the protocol needs, and the boot clock.

Timestamps stored and shown are wall-clock (Unix) milliseconds. *Durations* — how long an attempt
has run, whether its deadline passed — are measured on ``CLOCK_BOOTTIME`` within one boot: it
counts suspend and never steps, so a wall clock set back or forward (NTP, a VM resumed, an
operator) moves no deadline. The boot clock only means something together with the boot id
(``/proc/sys/kernel/random/boot_id``); the executor that started a task records both.
"""

from __future__ import annotations

import time

__all__ = ["now_ms", "now_ms_ceil", "boot_ms", "elapsed_ms_ceil"]

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def now_ms() -> int:
    """Unix time in whole milliseconds (floor)."""
    return time.time_ns() // 1_000_000


def now_ms_ceil() -> int:
    """Unix time in milliseconds rounded *up*: an upper bound of "now" (finish times)."""
    return -(-time.time_ns() // 1_000_000)


def _boot_ns() -> int | None:
    if _BOOTTIME is None:
        return None
    try:
        return time.clock_gettime_ns(_BOOTTIME)
    except OSError:
        return None


def boot_ms() -> int | None:
    """``CLOCK_BOOTTIME`` in whole milliseconds (floor), or None where there is none (not Linux)."""
    ns = _boot_ns()
    return None if ns is None else ns // 1_000_000


def elapsed_ms_ceil(since_boot_ms: int) -> int | None:
    """Milliseconds elapsed on ``CLOCK_BOOTTIME`` since ``since_boot_ms``, rounded up (an upper
    bound, as finish times are); None without the clock. Same boot only: the caller checks."""
    ns = _boot_ns()
    if ns is None:
        return None
    return max(0, -(-(ns - since_boot_ms * 1_000_000) // 1_000_000))
