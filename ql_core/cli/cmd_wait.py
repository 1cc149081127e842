"""``ql wait RUN [RUN...] [--timeout S]``: block until each run has ended, exit with its exit status.

Like ``tsp -w`` / ``nq -w``. A reader that settles: each non-terminal run is settled as a supervisor
round would (its receipt, else its process identity; a passed deadline becomes a timeout), so it
needs neither the host that started the run nor a supervisor. Between looks it sleeps at most
``FOLLOW_STATE_S`` (the follower's step), and never past ``--timeout``.

The exit status is ``ql run``'s (:func:`ql_core.states.exit_status_for`): the task's own code when
it succeeded or failed, 124 timed out, 130 cancelled, 75 lost; with several runs the first non-zero
one in the order given. 125: ``--timeout`` passed first (the runs go on).
"""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "wait until runs have ended; exit with the run's exit status (as ql run would)"
EPILOG = ("RUN is a run id, a unique prefix of one, or `last`. Each run that has not ended is settled "
          "as a supervisor round would (receipt, else process identity; a passed deadline becomes a "
          "timeout): the host that started it need not be running. One line per run as it ends: "
          "RUN_ID STATUS [exit N] (--json: {run_id, status, exit_code, reason, exit_status}). With "
          "several runs the exit status is the first non-zero one in the order given.")
#: ``--timeout`` passed before every run ended: we stopped waiting, the runs go on (as ``ql run``'s 125).
EXIT_STOPPED_WAITING = 125


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a run id, a unique prefix of one, or `last` (the newest run)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="stop waiting after S seconds (exit 125; the runs go on)")


def run(args: argparse.Namespace, out: Output) -> int:
    import math
    import time

    from ql_core.cli.common import printable, reader_from_args
    from ql_core.cli.notes import note
    from ql_core.cli.run_ids import check_run_argument, resolve_run_id
    from ql_core.errors import UsageError
    from ql_core.follow import FOLLOW_STATE_S
    from ql_core.states import exit_status_for

    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout >= 0):
        raise UsageError("--timeout must be a number of seconds >= 0")
    for text in args.runs:
        check_run_argument(text)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    rt = reader_from_args(args, run_id=args.runs[0])
    try:
        run_ids = list(dict.fromkeys(resolve_run_id(rt, text) for text in args.runs))
        for run_id in run_ids:
            rt.status(run_id)  # every run exists before we wait for any: not found is exit 1 at once
        statuses: dict[str, int] = {}
        pending = list(run_ids)
        while True:
            rt.node.check_data_dir()
            for run_id in list(pending):
                view = _settled(rt, run_id)
                if not view.terminal:
                    continue
                pending.remove(run_id)
                statuses[run_id] = exit_status_for(view.status, view.exit_code)
                out.emit({"run_id": view.run_id, "status": view.status, "exit_code": view.exit_code,
                          "reason": view.reason, "exit_status": statuses[run_id]},
                         f"{view.run_id}  {view.status}"
                         + (f"  exit {view.exit_code}" if view.exit_code is not None else "")
                         + (f"  ({printable(view.reason)})" if view.reason else ""))
            if not pending:
                break
            step = FOLLOW_STATE_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    note(out.json_mode, "stopped_waiting",
                         f"ql: stopped waiting after {args.timeout:g} s: {len(pending)} of {len(run_ids)} "
                         f"run(s) not ended yet (they go on; ql wait again, or ql cancel)",
                         run_ids=pending, exit_status=EXIT_STOPPED_WAITING)
                    return EXIT_STOPPED_WAITING
                step = min(step, left)
            time.sleep(step)
    finally:
        rt.close()
    return next((statuses[r] for r in run_ids if statuses[r] != 0), 0)


def _settled(rt, run_id: str):  # type: ignore[no-untyped-def]
    """The run's view after settling it once (a busy store: the committed view, settled next time)."""
    from ql_core.db.integrity import on_read_only_fs
    from ql_core.ports.journal import ConflictError, StoreBusyError

    view = rt.status(run_id)
    if view.terminal or on_read_only_fs(rt.config.data_dir):
        return view
    try:
        rt.settle(view)
    except (StoreBusyError, ConflictError):
        return view
    return rt.status(run_id)
