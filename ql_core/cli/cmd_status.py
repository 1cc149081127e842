"""``ql status RUN_ID``: run status, exit code, attempts."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "show a run's status, exit code and attempts"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args

    view = runtime_from_args(args).status(args.run_id)
    lines = [f"run {view.run_id}  {view.status}" + (f"  exit {view.exit_code}" if view.exit_code is not None else "")
             + (f"  ({view.reason})" if view.reason else "")]
    for a in view.attempts:
        lines.append(f"  attempt {a.attempt_id}  {a.status}"
                     + (f"  exit {a.exit_code}" if a.exit_code is not None else "")
                     + (f"  ({a.reason})" if a.reason else ""))
    out.emit(view.as_dict(), "\n".join(lines))
    return 0
