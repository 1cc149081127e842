"""``ql logs RUN_ID [--follow] [--offset N]``: the log from a byte offset."""

from __future__ import annotations

import argparse
import sys

from ql_core.cli.output import Output

HELP = "print a run's log from a byte offset; --follow until the run ends"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    parser.add_argument("--offset", type=int, default=0, metavar="N", help="start at this byte offset")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args
    from ql_core.errors import UsageError
    from ql_core.follow import follow_log

    if args.offset < 0:
        raise UsageError("--offset must be >= 0")
    rt = runtime_from_args(args)
    for chunk in follow_log(rt, args.run_id, offset=args.offset, follow=args.follow):
        if out.json_mode:
            out.emit({"run_id": args.run_id, "offset": chunk.offset,
                      "data": chunk.data.decode("utf-8", "replace")})
        else:
            sys.stdout.buffer.write(chunk.data)
            sys.stdout.buffer.flush()
    return 0
