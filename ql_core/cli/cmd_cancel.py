"""``ql cancel RUN_ID``: commit a cancel intent, then dispatch TERM (KILL after the grace)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "cancel a run: the intent is committed first, then TERM/KILL go to its process group"
EPILOG = ("outcome: requested (the intent is committed, TERM is on its way), already_requested, or "
          "already_terminal (the run had ended: nothing was changed or signalled). The run's final state "
          "is what `ql status` shows once it has ended: cancelled, or its own outcome if the task had "
          "finished before the intent.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import reader_from_args

    # Only what exists: a run to cancel lives in a data dir that was used (a typo creates nothing).
    rt = reader_from_args(args, run_id=args.run_id)
    try:
        result = rt.cancel(args.run_id, "user")
    finally:
        rt.close()
    out.emit({"run_id": args.run_id, "outcome": str(result)}, f"run {args.run_id}: {result}")
    return 0
