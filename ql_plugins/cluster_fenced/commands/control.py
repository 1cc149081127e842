"""``ql control``: the cluster control plane's bounded sweeper (leases, deadlines, retention) until SIGTERM."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

from . import FAIL, USAGE

__all__ = ["HELP", "EXIT_CODES", "STOPS_ON_SIGNALS", "configure", "run"]

HELP = "cluster control (profile cluster-control): sweep leases, deadlines and retention until SIGTERM"

#: SIGTERM/SIGINT stop it (a drain), from ql's first instruction on: main() arms the handler before
#: it imports anything, and ``serve`` takes over the signal caught meanwhile.
STOPS_ON_SIGNALS = True

#: As ``ql control --help`` lists them (and docs/cli.md).
EXIT_CODES = [("0", "stopped by SIGTERM/SIGINT"), FAIL, USAGE]


def configure(parser: argparse.ArgumentParser) -> None:
    from ql_core.cli.service import add_metrics_listen

    add_metrics_listen(parser)


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.service import serve
    from ql_core.metrics import serve as serve_metrics

    from ..services import ControlService

    serve_metrics(args.metrics_listen)  # before the runtime opens: its events are observed from the start
    return serve(args, role="control", capability=ControlService, method="run_control",
                 profile_hint='profile = "cluster-control" with journal = "cluster-fenced"')
