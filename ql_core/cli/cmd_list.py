"""``ql list [--status S]``: runs, newest first."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list runs, newest first"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", help="only runs in this status")
    parser.add_argument("--limit", type=int, default=50, help="at most this many (1-1000, default 50)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args
    from ql_core.errors import UsageError

    if not 1 <= args.limit <= 1000:
        raise UsageError("--limit must be between 1 and 1000")
    for view in runtime_from_args(args).list_runs(status=args.status, limit=args.limit):
        code = "" if view.exit_code is None else str(view.exit_code)
        out.emit({"run_id": view.run_id, "status": view.status, "exit_code": view.exit_code,
                  "reason": view.reason, "name": view.name, "created_at_ms": view.created_at_ms},
                 f"{view.run_id}  {view.status:<10} {code:>4}  {view.name or ''}".rstrip())
    return 0
