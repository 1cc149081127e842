"""Human or ``--json`` output: one JSON object per line, stable field names (DESIGN.md §7)."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

__all__ = ["Output"]


class Output:
    """Writes results either as text for people or as one JSON object per line."""

    def __init__(self, json_mode: bool, stream: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self.stream = stream or sys.stdout

    def emit(self, record: dict[str, Any], text: str | None = None) -> None:
        """Print ``record`` as JSON, or ``text`` (default: key=value pairs) for people."""
        if self.json_mode:
            line = json.dumps(record, separators=(",", ":"), sort_keys=False)
        else:
            line = text if text is not None else " ".join(f"{k}={v}" for k, v in record.items())
        self.stream.write(line + "\n")
        self.stream.flush()

    def text(self, line: str) -> None:
        """Print a line only in human mode (progress, tables)."""
        if not self.json_mode:
            self.stream.write(line + "\n")
            self.stream.flush()
