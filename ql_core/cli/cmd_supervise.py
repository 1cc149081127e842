"""``ql supervise``: periodic reconciliation until SIGTERM/SIGINT, then a bounded drain."""

from __future__ import annotations

import argparse
import signal
import threading

from ql_core.cli.output import Output

HELP = "run the periodic supervisor until SIGTERM/SIGINT (bounded drain on stop)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, metavar="S", help="seconds between rounds (default: profile)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import runtime_from_args
    from ql_core.errors import UsageError
    from ql_core.supervisor import Supervisor

    if args.interval is not None and not 0.05 <= args.interval <= 3600:
        raise UsageError("--interval must be between 0.05 and 3600 seconds")
    rt = runtime_from_args(args)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def report(r) -> None:  # type: ignore[no-untyped-def]
        busy = {k: v for k, v in r.as_dict().items() if v}
        if busy:
            out.emit({"status": "round", **r.as_dict()}, " ".join(f"{k}={v}" for k, v in busy.items()))

    supervisor = Supervisor(rt, interval_s=args.interval, on_round=report)
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
    out.emit({"status": "stopped", "drained": drained, "rounds": supervisor.rounds},
             f"ql: stopped after {supervisor.rounds} rounds" + ("" if drained else " (drain timed out)"))
    return 0 if drained else 1
