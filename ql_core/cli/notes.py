"""ql's own notes on stderr: one text line (``ql: …``), or with ``--json`` one JSON object
``{"note": KIND, "message": TEXT, ...}`` — never mixed into stdout, never a command or its output.

And the end-status of a run as ``ql wait`` and ``ql logs --follow`` report it (the exit status is
:func:`ql_core.states.exit_status_for`, the mapping ``ql run`` exits with).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ql_core.records import RunView

__all__ = ["note", "end_status_text", "note_end_status"]


def note(json_mode: bool, kind: str, message: str, **fields: Any) -> None:
    """One note on stderr; a closed stderr never changes the outcome."""
    from ql_core.cli.output import escape_undecodable

    message = escape_undecodable(message)  # a non-UTF-8 path prints as \xNN, never a surrogate
    if json_mode:
        line = json.dumps({"note": kind, "message": message, **fields}, separators=(",", ":"))
    else:
        line = message if message.startswith("ql") else f"ql: {message}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def end_status_text(run_id: str, status: str | None, exit_code: int | None, reason: str | None) -> str:
    """``ql: run ID failed (exit 3)``, ``ql: run ID timed_out (timeout)``: how the run ended."""
    from ql_core.cli.common import printable

    if exit_code is not None and status in ("succeeded", "failed"):
        detail = f" (exit {exit_code})"
    else:
        detail = f" ({printable(reason)})" if reason else ""
    return f"ql: run {run_id} {status}{detail}"


def note_end_status(json_mode: bool, view: RunView) -> int:
    """Report how ``view`` ended (one note) and return the exit status that goes with it."""
    from ql_core.states import exit_status_for

    status = exit_status_for(view.status, view.exit_code)
    note(json_mode, "ended", end_status_text(view.run_id, view.status, view.exit_code, view.reason),
         run_id=view.run_id, status=view.status, exit_code=view.exit_code, reason=view.reason,
         exit_status=status)
    return status
