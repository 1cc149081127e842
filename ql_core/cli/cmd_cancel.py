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
    parser.add_argument("run_id", metavar="RUN", help="a run id, a unique prefix of one, or `last` (the newest run)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import reader_for_run

    # Only what exists: a run to cancel lives in a data dir that was used (a typo creates nothing).
    rt, run_id = reader_for_run(args)
    try:
        result = rt.cancel(run_id, "user")
    finally:
        rt.close()
    out.emit({"run_id": run_id, "outcome": str(result)}, f"run {run_id}: {result}")
    return 0
