"""``ql supervise``: periodic reconciliation until SIGTERM/SIGINT, then a bounded drain."""

from __future__ import annotations

import argparse
import threading

from ql_core.cli.output import Output

HELP = "run the periodic supervisor until SIGTERM/SIGINT (bounded drain on stop)"
EPILOG = ("The stop handlers are installed first: a SIGTERM that arrives while ql is still starting stops "
          "it cleanly (exit 0), never kills it. --json prints {\"type\": \"round\", <counts>} for each round "
          "that did something and {\"type\": \"stopped\", \"drained\", \"rounds\"} at the end.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, metavar="S", help="seconds between rounds (default: profile)")
    from ql_core.cli.service import add_metrics_listen

    add_metrics_listen(parser)


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import early_stop, stop_on_signals

    armed = early_stop()  # `ql supervise` from the command line: main() armed it before parsing
    # Before anything slow (imports, opening the database): an early TERM must stop us, not kill us.
    with stop_on_signals(armed if armed is not None else threading.Event()) as stop:
        return _supervise(args, out, stop)


def _supervise(args: argparse.Namespace, out: Output, stop: threading.Event) -> int:
    from ql_core.cli.common import runtime_from_args
    from ql_core.errors import UsageError
    from ql_core.supervisor import Supervisor

    if args.interval is not None and not 0.05 <= args.interval <= 3600:
        raise UsageError("--interval must be between 0.05 and 3600 seconds")
    if args.metrics_listen:
        from ql_core import metrics

        metrics.serve(args.metrics_listen)
    rt = runtime_from_args(args)
    if args.metrics_listen:
        metrics.attach_active(rt)
    if stop.is_set():  # asked to stop while we were starting: nothing ran, nothing to drain
        rt.close()
        out.emit({"type": "stopped", "drained": True, "rounds": 0}, "ql: stopped before the first round")
        return 0

    def report(r) -> None:  # type: ignore[no-untyped-def]
        busy = {k: v for k, v in r.as_dict().items() if v}
        if busy:
            out.emit({"type": "round", **r.as_dict()}, " ".join(f"{k}={v}" for k, v in busy.items()))

    supervisor = Supervisor(rt.node, interval_s=args.interval, on_round=report)
    watcher = rt.start_wakeups(supervisor)
    supervisor.start()
    out.text(f"ql: supervising {rt.config.data_dir} every {supervisor.interval_s:g}s (profile "
             f"{rt.profile.name}); SIGTERM or Ctrl-C stops")
    stop.wait()
    if watcher is not None:
        watcher.stop()
    drained = supervisor.stop()
    if drained:
        rt.close()  # (a loop still draining keeps the engine; the process exits right after anyway)
    out.emit({"type": "stopped", "drained": drained, "rounds": supervisor.rounds},
             f"ql: stopped after {supervisor.rounds} round{'' if supervisor.rounds == 1 else 's'}" + ("" if drained else " (drain timed out)"))
    return 0 if drained else 1
