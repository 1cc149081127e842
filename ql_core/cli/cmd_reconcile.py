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
    from ql_core.errors import DatabaseError, UsageError
    from ql_core.reconciler import CursorStuckError, Reconciler

    if args.max_rounds < 1:
        raise UsageError("--max-rounds must be at least 1")
    rt = runtime_from_args(args)
    try:
        report, rounds = Reconciler(rt).full_pass(max_rounds=args.max_rounds)
    except CursorStuckError as exc:
        raise DatabaseError(f"reconciliation stopped, failing closed: {exc}; "
                            f"check the database with `ql doctor`") from None
    finally:
        rt.close()
    counts = report.as_dict()
    # A pass cut short by --max-rounds says so: its cursors had not wrapped yet.
    complete = not report.attempt_cursor and not report.journal_cursor
    out.emit({"status": "ok" if complete else "incomplete", "rounds": rounds,
              "attempts_checked": report.attempts_touched, "journal_checked": report.journal_touched, **counts},
             " ".join(f"{k}={v}" for k, v in counts.items()) + f" rounds={rounds}"
             + ("" if complete else " (incomplete: --max-rounds reached)"))
    return 0
