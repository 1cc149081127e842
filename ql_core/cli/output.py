"""Human or ``--json`` output: one JSON object per line, stable field names (``docs/cli.md``)."""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, TextIO

__all__ = ["Output", "escape_undecodable", "silence_stdout"]


def silence_stdout() -> None:
    """The reader of our stdout left: send the rest (and Python's final flush) to /dev/null."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def escape_undecodable(text: str) -> str:
    """``text`` with the bytes a file name could not decode (``\\udcXX`` surrogates, as Python reads a
    non-UTF-8 path) written ``\\xXX``: printable on any stream, and the byte the user would look for."""
    # re's own cache compiles the pattern at the first use: most commands never print a file name.
    return re.sub(_UNDECODABLE, lambda m: f"\\x{ord(m.group(0)) - 0xdc00:02x}", text)


#: What ``os.fsdecode`` makes of a byte that is not UTF-8 (surrogateescape).
_UNDECODABLE = "[\udc80-\udcff]"


class Output:
    """Writes results either as text for people or as one JSON object per line."""

    def __init__(self, json_mode: bool, stream: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self._stream = stream
        #: True once the command's effect is committed (``ql run`` after submit): a reader that
        #: leaves our stdout then only stops the output, never the command or its exit status.
        self.tolerate_broken_pipe = False
        self.broken = False

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def emit(self, record: dict[str, Any], text: str | None = None) -> None:
        """Print ``record`` as JSON, or ``text`` (default: key=value pairs) for people."""
        if self.json_mode:
            line = json.dumps(record, separators=(",", ":"), sort_keys=False)
        else:
            line = text if text is not None else " ".join(f"{k}={v}" for k, v in record.items())
        self._write(line + "\n")

    def text(self, line: str) -> None:
        """Print a line only in human mode (progress, tables)."""
        if not self.json_mode:
            self._write(line + "\n")

    def _write(self, data: str) -> None:
        if self.broken:
            return
        try:
            self.stream.write(escape_undecodable(data))
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            if not self.tolerate_broken_pipe:
                raise BrokenPipeError from None
            self.broken = True
            silence_stdout()
