"""``ql events RUN_ID``: the run's events in order (with ``--json``: one event per line)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "list a run's events in order"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", help="a run id, a unique prefix of one, or `last` (the newest run)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import printable
    from ql_core.cli.quick_read import quick_reader_for_run

    events = None
    quick = quick_reader_for_run(args)
    if quick is not None:  # reading events settles nothing: the quick path answers a known run
        reader, run_id = quick
        try:
            found = reader.events(run_id)
        except Exception:  # noqa: BLE001 - the full path reports it
            found = None
        finally:
            reader.close()
        events = None if found is None else [e.as_dict() for e in found]
    if events is None:
        from ql_core.cli.common import reader_for_run

        rt, run_id = reader_for_run(args)
        try:
            events = [e.as_dict() for e in rt.events(run_id)]
        finally:
            rt.close()
    for e in events:
        extra = " ".join(f"{k}={printable(str(e[k]))}" for k in ("status", "exit_code", "reason")
                         if e.get(k) is not None)
        out.emit(e, f"{e['seq']:>4}  {e['type']:<32} {extra}".rstrip())
    return 0
