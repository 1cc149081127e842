"""``ql events RUN_ID``: the run's events in order (with ``--json``: one event per line)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list a run's events in order"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", help="a run id, a unique prefix of one, or `last` (the newest run)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import printable, reader_for_run

    rt, run_id = reader_for_run(args)
    try:
        events = [e.as_dict() for e in rt.events(run_id)]
    finally:
        rt.close()
    for e in events:
        extra = " ".join(f"{k}={printable(str(e[k]))}" for k in ("status", "exit_code", "reason")
                         if e.get(k) is not None)
        out.emit(e, f"{e['seq']:>4}  {e['type']:<32} {extra}".rstrip())
    return 0
