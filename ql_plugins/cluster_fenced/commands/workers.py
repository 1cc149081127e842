"""``ql workers``: the cluster's workers — generation, slots, held attempts, heartbeat age, state."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

from . import FAIL, USAGE

__all__ = ["HELP", "EPILOG", "EXIT_CODES", "configure", "run"]

HELP = "list the cluster's workers: generation, slots, held attempts, heartbeat age, state"
EPILOG = ("Reads the control database (profile cluster-control). States: alive (session lease live), "
          "draining (got SIGTERM: claims nothing more, finishes or hands back its attempts, then stops), "
          "expired (lease passed without deregistering: the process died or lost the database), stopped "
          "(deregistered after its drain), fenced (attempts still leased to an older generation of the id). "
          "Ages use the database clock. --json prints one object per worker ({\"type\": \"worker\", ...}) and one {\"type\": \"queue\", ...}.")

#: As ``ql workers --help`` lists them (and docs/cli.md).
EXIT_CODES = [("0", "the workers were listed (none is not an error)"), FAIL, USAGE]


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import printable, reader_from_args
    from ql_core.errors import UsageError

    rt = reader_from_args(args)
    try:
        snapshot = getattr(rt.journal, "ops_snapshot", None)
        if snapshot is None:
            raise UsageError(f"`ql workers` reads a cluster's control database; this profile ({rt.profile.name}, "
                             f"journal {rt.config.journal}) has none: use the cluster-control config")
        snap = snapshot()
    finally:
        rt.close()
    for w in snap["worker_rows"]:
        out.emit({"type": "worker", **w},
                 f"{printable(w['worker_id'])}  gen {w['generation']}  {w['state']:<9} slots {w['slots']}  "
                 f"held {w['held']}" + (f" (+{w['held_by_older_generations']} older gen)"
                                        if w['held_by_older_generations'] else "")
                 + f"  heartbeat {w['heartbeat_age_s']:.1f}s ago")
    out.emit({"type": "queue", "queue_depth": snap["queue_depth"], "oldest_queued_age_s": snap["oldest_queued_age_s"]},
             f"queue: {snap['queue_depth']} queued, oldest {snap['oldest_queued_age_s']:.1f}s")
    return 0
