"""``ql events RUN_ID``: the run's events in order."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list a run's events in order"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args

    events = [e.as_dict() for e in runtime_from_args(args).events(args.run_id)]
    if out.json_mode:
        out.emit({"run_id": args.run_id, "events": events})
        return 0
    for e in events:
        extra = " ".join(f"{k}={e[k]}" for k in ("status", "exit_code", "reason") if e[k] is not None)
        out.text(f"{e['seq']:>4}  {e['type']:<32} {extra}".rstrip())
    return 0
