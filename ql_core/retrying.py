"""Bounded retries of whole store transactions (compare-and-set lost, database busy)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from .ports.journal import ConflictError, StoreBusyError

__all__ = ["retrying", "GaveUpError"]

T = TypeVar("T")


class GaveUpError(ConflictError):
    """Still conflicting or busy after the configured number of tries."""


def retrying(call: Callable[[], T], *, retries: int) -> T:
    """Run ``call`` (one transaction); retry it up to ``retries`` times on a lost CAS or a busy store."""
    tries = 0
    while True:
        try:
            return call()
        except (ConflictError, StoreBusyError) as exc:
            tries += 1
            if tries >= retries:
                raise GaveUpError(f"gave up after {tries} tries: {exc}") from exc
        time.sleep(min(0.005 * (2 ** tries), 0.2))
