"""The one resolver of a RUN argument (``ql status``, ``logs``, ``events``, ``cancel``, ``wait``):
a full run id, a unique prefix of one (as git and docker take), or ``last``.

- ``last``: the most recently created run in this data dir's run store (newest ``created_at_ms``).
- a prefix: lowercase (or uppercase) hex digits and dashes; looked up as one range of the primary key
  (``id >= p AND id < p_next LIMIT 2``), never a scan. Two matches: a usage error naming the count
  and "give more characters" (exit 2); none: "not found" (exit 1), as for a full id.
- anything else (a character that no run id holds): a usage error, exit 2.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ql_core.runtime import Runtime

__all__ = ["LAST", "resolve_run_id", "check_run_argument"]

#: The RUN argument meaning the newest run.
LAST = "last"
_ID_CHARS = re.compile(r"[0-9a-f-]{1,36}")
_FULL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_run_argument(text: str) -> str:
    """``text`` as a run id or prefix (lowercased), or ``last``; a usage error for anything else.
    Needs no database: a command checks its argument before it opens anything."""
    from ql_core.errors import UsageError

    if text == LAST:
        return text
    lowered = text.strip().lower()
    if not _ID_CHARS.fullmatch(lowered) or not lowered.strip("-"):
        raise UsageError(f"{ascii(text[:80])} is not a run id: give a run id, a unique prefix of one "
                         f"(hex digits), or `last` (see `ql list`)")
    return lowered


def resolve_run_id(rt: Runtime, text: str) -> str:
    """The full run id ``text`` names (see the module doc); ``NotFoundError`` when no run matches."""
    from ql_core.errors import NotFoundError, UsageError

    wanted = check_run_argument(text)
    data_dir = rt.config.data_dir
    if wanted == LAST:
        newest = rt.list_runs(limit=1)
        if not newest:
            raise NotFoundError(f"no run yet in {data_dir}: `last` names the most recently created run")
        return newest[0].run_id
    if _FULL_ID.fullmatch(wanted):
        return wanted  # the read that follows says "not found" when it is unknown
    lookup = getattr(rt.journal, "run_ids_with_prefix", None)
    if lookup is None:  # a third-party journal without prefix reads: full ids only
        raise UsageError(f"run id {wanted!r} is not complete and this run store ({rt.journal.name}) cannot look "
                         f"up prefixes: give the full id (see `ql list`)")
    found = lookup(wanted, 2)
    if not found:
        raise NotFoundError(f"run {wanted!r} not found in {data_dir}; see `ql list`")
    if len(found) > 1:
        raise UsageError(f"run id prefix {wanted!r} is ambiguous: 2 or more runs start with it; "
                         f"give more characters (see `ql list`)")
    return found[0]
