"""``ql logs RUN_ID [--follow] [--offset N]``: the log from a byte offset.

With ``--follow`` it keeps printing until the run has ended and its log is
drained — even when no supervisor runs (the follower settles the run itself).
The log's bytes go to stdout untouched; notes (truncated by the quota, deleted
by retention) go to stderr. ``--json`` prints one object per chunk:
``{"run_id", "offset", "end", "data"}`` (``data`` decoded as UTF-8 with
replacement; ``offset``/``end`` are byte offsets — resume with ``--offset END``).
"""

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
    from ql_core.logs import log_facts

    if args.offset < 0:
        raise UsageError("--offset must be >= 0")
    rt = runtime_from_args(args)
    try:
        for chunk in follow_log(rt, args.run_id, offset=args.offset, follow=args.follow):
            if out.json_mode:
                out.emit({"run_id": args.run_id, "offset": chunk.offset, "end": chunk.end,
                          "data": chunk.data.decode("utf-8", "replace")})
            else:
                sys.stdout.buffer.write(chunk.data)
                sys.stdout.buffer.flush()
        view = rt.status(args.run_id)
        facts = log_facts(rt, view.log_artifact_id) if view.log_artifact_id else None
        if facts is not None and not out.json_mode:
            if facts.deleted:
                sys.stderr.write(f"ql: the log of run {args.run_id} was deleted by retention\n")
            elif facts.truncated:
                sys.stderr.write(f"ql: log truncated at {facts.max_bytes} bytes (log_max_bytes); "
                                 f"later output of the task was dropped\n")
    finally:
        rt.close()
    return 0
