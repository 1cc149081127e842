"""``ql reconcile``: one startup-reconciliation pass in bounded rounds; prints counts."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "one reconciliation pass (receipts, identities, deadlines, retention); prints counts"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-rounds", type=int, default=10_000, metavar="N",
                        help="stop after N bounded rounds even if the pass is not complete (default 10000)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args
    from ql_core.errors import UsageError
    from ql_core.reconciler import Reconciler

    if args.max_rounds < 1:
        raise UsageError("--max-rounds must be at least 1")
    rt = runtime_from_args(args)
    report, rounds = Reconciler(rt).full_pass(max_rounds=args.max_rounds)
    counts = report.as_dict()
    out.emit({"status": "ok", "rounds": rounds, "attempts_checked": report.attempts_touched, **counts},
             " ".join(f"{k}={v}" for k, v in counts.items()) + f" rounds={rounds}")
    return 0
