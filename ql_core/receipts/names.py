"""The receipt store's names: the layout's directory and file names, and the id check before any path.

The temp and final names are a contract shared with the POSIX launcher (which publishes with the
same names) and the receipt audit (which classifies a shard's files by :data:`RECEIPT_NAME_PATTERN`
and :data:`TEMP_NAME_PATTERN`).
"""

from __future__ import annotations

import os
import re
from typing import Final

from ql_core.ids import UUID7_PATTERN, is_uuid7

__all__ = ["QUARANTINE_DIR_NAME", "RECEIPT_NAME_PATTERN", "TEMP_NAME_PATTERN", "receipt_name", "temp_name",
           "require_uuid7"]

#: Name of the quarantine directory directly under the receipt root.
QUARANTINE_DIR_NAME: Final = ".quarantine"

#: A final receipt's file name; group ``attempt_id``.
RECEIPT_NAME_PATTERN: Final = re.compile(rf"(?P<attempt_id>{UUID7_PATTERN.pattern})\.json")

#: A publication temp file's name; groups ``attempt_id`` and ``unique``.
TEMP_NAME_PATTERN: Final = re.compile(
    rf"\.(?P<attempt_id>{UUID7_PATTERN.pattern})\.(?P<unique>[A-Za-z0-9]{{1,32}})\.tmp"
)


def require_uuid7(attempt_id: str) -> str:
    """Refuse to build any path from an unvalidated id (no ``..``, no ``/``, no case games)."""
    if not is_uuid7(attempt_id):
        raise ValueError("attempt_id must be a lowercase UUIDv7")
    return attempt_id


def receipt_name(attempt_id: str) -> str:
    """The final receipt's file name in its shard."""
    return f"{attempt_id}.json"


def temp_name(attempt_id: str) -> str:
    """A fresh temp name: pid plus 64 random bits, unique across processes and threads."""
    return f".{attempt_id}.{os.getpid()}r{os.urandom(8).hex()}.tmp"
