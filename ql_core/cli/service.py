"""Running a long-lived role (``ql worker``, ``ql control``) until SIGTERM/SIGINT, with a bounded drain."""

from __future__ import annotations

import argparse
import threading

__all__ = ["add_metrics_listen", "serve"]


def add_metrics_listen(parser: argparse.ArgumentParser) -> None:
    """``--metrics-listen HOST:PORT``, as ``ql supervise``, ``ql worker`` and ``ql control`` take it."""
    parser.add_argument("--metrics-listen", metavar="HOST:PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; needs "
                             "pip install 'ql-runner[metrics]'; docs/operations.md)")


def serve(args: argparse.Namespace, *, role: str, capability: type, method: str, profile_hint: str) -> int:
    """Install the stop handlers first (an early TERM must not kill us mid-start), open the runtime,
    check its journal backend offers ``capability`` and run ``method(node, stop)`` (the runtime's node).

    From the command line main() armed them before parsing (the command's module says
    ``STOPS_ON_SIGNALS = True``): a TERM caught since then is the stop already set."""
    from ql_core.cli.common import early_stop, stop_on_signals

    armed = early_stop()
    with stop_on_signals(armed if armed is not None else threading.Event()) as stop:
        from ql_core import metrics
        from ql_core.cli.common import runtime_from_args
        from ql_core.errors import UsageError

        rt = runtime_from_args(args)
        try:
            metrics.attach_active(rt)  # --metrics-listen: observe this runtime (a no-op when off)
            if not isinstance(rt.journal, capability):
                raise UsageError(f"`ql {role}` needs a journal backend that serves it; the configured one "
                                 f"({rt.config.journal}, profile {rt.profile.name}) does not: use {profile_hint}")
            return int(getattr(rt.journal, method)(rt.node, stop))  # the role takes the node's seams
        finally:
            rt.close()
