"""``ql cancel RUN_ID``: commit a cancel intent, then dispatch TERM (KILL after the grace)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "cancel a run: the intent is committed first, then TERM/KILL go to its process group"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args

    rt = runtime_from_args(args)
    try:
        result = rt.cancel(args.run_id, "user")
    finally:
        rt.close()
    out.emit({"run_id": args.run_id, "status": str(result)}, f"run {args.run_id}: {result}")
    return 0
