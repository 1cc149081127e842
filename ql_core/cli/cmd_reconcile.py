"""``ql reconcile``: one startup-reconciliation pass in bounded rounds; prints counts."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "one reconciliation pass (receipts, identities, deadlines, retention); prints counts"

#: The counters ``ql reconcile --json`` always prints (0 when nothing happened), in this order.
#: Any other counter a round reports goes under ``other`` (keys may change between releases).
COUNT_KEYS = ("applied", "already_terminal", "quarantined", "still_running", "still_starting", "lost",
              "blocked", "timed_out", "cancelled", "timeouts_requested", "dispatch_signalled",
              "dispatch_killed", "dispatch_already_exited", "dispatch_blocked", "dispatch_retry",
              "journal_registered", "journal_purged", "quarantine_purged", "log_finalized", "log_truncated",
              "log_expired", "log_evicted", "log_errors", "errors")
EPILOG = ("--json prints one object with a fixed set of keys: complete, rounds, attempts_checked, "
          "journal_checked, " + ", ".join(COUNT_KEYS) + ", and other (every further counter).")


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
        report, rounds = Reconciler(rt.node).full_pass(max_rounds=args.max_rounds)
    except CursorStuckError as exc:
        raise DatabaseError(f"reconciliation stopped, failing closed: {exc}; "
                            f"check the database with `ql doctor`") from None
    finally:
        rt.close()
    counts = dict(report.counts)
    # A pass cut short by --max-rounds says so: its cursors had not wrapped yet.
    complete = not report.attempt_cursor and not report.journal_cursor
    record = {"complete": complete, "rounds": rounds, "attempts_checked": report.attempts_touched,
              "journal_checked": report.journal_touched}
    record.update({key: int(counts.pop(key, 0)) for key in COUNT_KEYS})
    record["other"] = {key: int(value) for key, value in sorted(counts.items()) if value}
    shown = report.as_dict()
    out.emit(record, " ".join(f"{k}={v}" for k, v in shown.items()) + f" rounds={rounds}"
             + ("" if complete else " (incomplete: --max-rounds reached)"))
    return 0
