"""``ql status RUN_ID``: run status, exit code, attempts (a run whose task ended is settled first)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ql_core.cli.output import Output

if TYPE_CHECKING:
    from ql_core.records import RunView

HELP = "show a run's status, exit code and attempts"
EPILOG = ("A run that is not terminal is settled first, as a supervisor round would: its task's receipt "
          "or process identity decides, and a passed deadline becomes a timeout. Nothing is created: a "
          "mistyped --data-dir is an error.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", help="a run id, a unique prefix of one, or `last` (the newest run)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.quick_read import quick_reader_for_run

    quick = quick_reader_for_run(args)
    if quick is not None:  # a terminal run needs no settling: the quick path shows it
        reader, run_id = quick
        try:
            view = reader.status(run_id)
        except Exception:  # noqa: BLE001 - the full path reports it
            view = None
        finally:
            reader.close()
        if view is not None and view.terminal:
            return _show(view, out)
    from ql_core.cli.common import reader_for_run, settle_shown

    rt, run_id = reader_for_run(args)
    try:
        (view,) = settle_shown(rt, [rt.status(run_id)], limit=1)
    finally:
        rt.close()
    return _show(view, out)


def _show(view: RunView, out: Output) -> int:
    from ql_core.cli.common import printable

    lines = [f"run {view.run_id}  {view.status}" + (f"  exit {view.exit_code}" if view.exit_code is not None else "")
             + (f"  ({printable(view.reason)})" if view.reason else "")]
    if view.name:
        lines.append(f"  name {printable(view.name)}")
    for a in view.attempts:
        lines.append(f"  attempt {a.attempt_id}  {a.status}"
                     + (f"  exit {a.exit_code}" if a.exit_code is not None else "")
                     + (f"  ({printable(a.reason)})" if a.reason else ""))
    out.emit(view.as_dict(), "\n".join(lines))
    return 0
