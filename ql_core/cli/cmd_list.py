"""``ql list [--status S] [--limit N]``: runs, newest first (the non-terminal ones shown are settled)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list runs, newest first"
EPILOG = ("The non-terminal runs shown (at most the profile's page_size of them) are settled first, as a "
          "supervisor round would. Names are printed with control characters escaped (\\n, \\x1b); "
          "--json prints them as they are.")

#: What --status accepts: every run state.
RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", metavar="S", help=f"only runs in this state: {', '.join(RUN_STATES)}")
    parser.add_argument("--limit", default="50", metavar="N", help="at most this many (1-1000, default 50)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import printable, reader_from_args, settle_shown
    from ql_core.errors import UsageError

    try:
        limit = int(str(args.limit).strip(), 10)
    except ValueError:
        raise UsageError(f"--limit must be a whole number between 1 and 1000, got {printable(args.limit[:20])!r}") from None
    if not 1 <= limit <= 1000:
        raise UsageError("--limit must be between 1 and 1000")
    if args.status is not None and args.status not in RUN_STATES:
        raise UsageError(f"--status {printable(args.status[:40])!r} is not a run state; choose one of: "
                         f"{', '.join(RUN_STATES)}")
    rt = reader_from_args(args)
    try:
        views = settle_shown(rt, rt.list_runs(status=args.status, limit=limit), limit=rt.profile.page_size)
    finally:
        rt.close()
    for view in views:
        code = "" if view.exit_code is None else str(view.exit_code)
        out.emit({"run_id": view.run_id, "status": view.status, "exit_code": view.exit_code,
                  "reason": view.reason, "name": view.name, "created_at_ms": view.created_at_ms,
                  "finished_at_ms": view.finished_at_ms},
                 f"{view.run_id}  {view.status:<10} {code:>4}  {printable(view.name)}".rstrip())
    return 0
