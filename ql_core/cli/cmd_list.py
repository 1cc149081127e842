"""``ql list [--status S] [--limit N]``: runs, newest first; every row is settled or marked unverified.

Costs O(limit) whatever the history: the runs come from an index in order (``ix_ql_run_status``; on
SQLite without ``--status`` the merge of its per-state ranges, ``ql_core.db.sqlite_runs``), their
attempts by their run (SQLite: the run's key range; PostgreSQL: ``ix_ql_attempt_run``), and at most ``page_size``
non-terminal rows are settled. A non-terminal row beyond that budget (or whose settling found the
run store busy) is printed with ``verified: false`` and a ``?`` marker: what the store says, not yet
checked against its receipt or process.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from ql_core.cli.output import Output

if TYPE_CHECKING:
    from ql_core.records import RunView
    from ql_core.runtime import Runtime

HELP = "list runs, newest first"
EPILOG = ("The non-terminal runs shown (at most the profile's page_size of them) are settled first, as a "
          "supervisor round would; the others are marked '?' (JSON: verified false) — not yet checked. Names are printed with control characters escaped (\\n, \\x1b); "
          "--json prints them as they are.")

#: What --status accepts: every run state.
RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", metavar="S", help=f"only runs in this state: {', '.join(RUN_STATES)}")
    parser.add_argument("--limit", default="50", metavar="N", help="at most this many (1-1000, default 50)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import printable, reader_from_args
    from ql_core.errors import NotFoundError, UsageError

    try:
        limit = int(str(args.limit).strip(), 10)
    except ValueError:
        raise UsageError(f"--limit must be a whole number between 1 and 1000, got {printable(args.limit[:20])!r}") from None
    if not 1 <= limit <= 1000:
        raise UsageError("--limit must be between 1 and 1000")
    if args.status is not None and args.status not in RUN_STATES:
        raise UsageError(f"--status {printable(args.status[:40])!r} is not a run state; choose one of: "
                         f"{', '.join(RUN_STATES)}")
    rows = _quick_rows(args, limit)
    if rows is not None:
        return _show(rows, out)
    try:
        rt = reader_from_args(args)
    except NotFoundError as exc:
        # Nothing has run here yet (or the data dir is mistyped: the note names it): no runs, exit 0.
        from ql_core.cli.notes import note

        note(out.json_mode, "no_runs", f"ql: no runs: {exc}")
        return 0
    try:
        rows = settle_rows(rt, rt.list_runs(status=args.status, limit=limit), budget=rt.profile.page_size)
    finally:
        rt.close()
    return _show(rows, out)


def _quick_rows(args: argparse.Namespace, limit: int) -> list[tuple[RunView, bool]] | None:
    """The rows on the quick path when every run shown is terminal (nothing to settle); else None."""
    from ql_core.cli.quick_read import quick_reader

    reader = quick_reader(args)
    if reader is None:
        return None
    try:
        views = reader.list_runs(status=args.status, limit=limit)
    except Exception:  # noqa: BLE001 - the full path reports it
        return None
    finally:
        reader.close()
    return [(view, True) for view in views] if all(view.terminal for view in views) else None


def _show(rows: list[tuple[RunView, bool]], out: Output) -> int:
    from ql_core.cli.common import printable

    if rows:
        out.text(f"{'RUN':<36}  {'STATUS':<11} {'EXIT':>4}  {'CREATED':<19}  {'DURATION':<16}  NAME")
    now = time.time() * 1000
    for view, verified in rows:
        code = "" if view.exit_code is None else str(view.exit_code)
        out.emit({"run_id": view.run_id, "status": view.status, "exit_code": view.exit_code,
                  "reason": view.reason, "name": view.name, "created_at_ms": view.created_at_ms,
                  "finished_at_ms": view.finished_at_ms, "verified": verified},
                 f"{view.run_id}  {view.status + ('' if verified else '?'):<11} {code:>4}  "
                 f"{_local_time(view.created_at_ms):<19}  {_duration(view, now):<16}  "
                 f"{printable(view.name)}".rstrip())
    return 0


def _local_time(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _duration(view: RunView, now_ms: float) -> str:
    """How long it ran (created to finished), or ``running for …`` (``queued for …``) until now."""
    if view.created_at_ms is None:
        return "-"
    if view.finished_at_ms is not None:
        return human_duration(max(0, view.finished_at_ms - view.created_at_ms) / 1000)
    waited = human_duration(max(0.0, now_ms - view.created_at_ms) / 1000)
    return f"{'queued' if view.status == 'queued' else 'running'} for {waited}"


def human_duration(seconds: float) -> str:
    """``0.4s``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def settle_rows(rt: Runtime, views: list[RunView], *, budget: int) -> list[tuple[RunView, bool]]:
    """Settle up to ``budget`` non-terminal runs (as a supervisor round would); each row with whether
    it is verified: terminal (final), or settled just now. The rest keep the stored state, unverified."""
    from ql_core.ports.journal import ConflictError, StoreBusyError

    rows: list[tuple[RunView, bool]] = []
    for view in views:
        if view.terminal:
            rows.append((view, True))
            continue
        if budget <= 0:
            rows.append((view, False))
            continue
        budget -= 1
        try:
            rt.settle(view)
        except (StoreBusyError, ConflictError):
            rows.append((view, False))  # another process is writing: shown as stored, unverified
            continue
        view = rt.status(view.run_id)
        rows.append((view, True))
    return rows
