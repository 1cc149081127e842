"""``ql audit receipts``: bounded audit of receipt files outside the journal (ADR-0007 §2.9).

Read-only unless ``--quarantine`` is given; see ``docs/audit.md``. This
command never imports SQLAlchemy, SQLModel or ``ql_core.db``, loads no plugin
and starts no runtime: it reads the run database directly and read-only.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ql_core.cli.output import Output

if TYPE_CHECKING:
    from ql_core.audit import AuditReport

HELP = "audit receipt files the journal does not index (read-only unless --quarantine)"

_EPILOG = (
    "Shards are the 256 directories receipts/00..ff. Each run audits --shards shards "
    "(default 8, at most 32) from --shard, at most --limit entries each (default 32, at most 64), "
    "and prints next_shard for the next run. Without --quarantine nothing is changed. "
    "Files registered in the journal or belonging to an active attempt are never moved; "
    "other regular files older than --min-age are moved (hard link + unlink, never deleted) "
    "into receipts/.orphan-quarantine/<xx>/ only with --quarantine."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = _EPILOG
    parser.add_argument("action", choices=["receipts"],
                        help="receipts: classify (with --quarantine: move) orphan receipt files")
    # Numbers are parsed in run() so that every rejection names its hard cap (exit 2).
    parser.add_argument("--shard", default=None, metavar="XX",
                        help="first shard, two hex digits 00..ff (default 00; wraps after ff)")
    parser.add_argument("--shards", default=None, metavar="N",
                        help="shards to audit (default 8, hard cap 32)")
    parser.add_argument("--limit", default=None, metavar="N",
                        help="entries examined per shard (default 32, hard cap 64); "
                             "a shard with more is reported overflow and nothing in it moves")
    parser.add_argument("--min-age", default=None, metavar="S", dest="min_age",
                        help="seconds since last modification before a file may move "
                             "(default 3600, at least 300)")
    parser.add_argument("--quarantine", action="store_true",
                        help="move eligible files into receipts/.orphan-quarantine/ "
                             "(default: report only)")


def _int_option(flag: str, text: str | None, default: int) -> int:
    from ql_core.audit import AuditOptionError

    if text is None:
        return default
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise AuditOptionError(f"{flag} must be a whole number, got {text[:20]!r}") from None


def _human_lines(report: AuditReport) -> list[str]:
    shards = report.shards
    span = f"{shards[0].shard}..{shards[-1].shard}" if shards else "-"
    head = ("quarantine: eligible files moved to receipts/.orphan-quarantine/"
            if report.mode == "quarantine" else "report only: nothing was changed")
    lines = [f"receipt audit, {head}",
             f"shards {span} ({len(shards)}), limit {report.limit} per shard, "
             f"min age {report.min_age_s} s",
             "",
             f"{'SHARD':<6}{'STATE':<10}{'ENTRIES':>7}"]
    lines += [f"{s.shard:<6}{s.status:<10}{s.entries:>7}" for s in shards]
    if report.entries:
        width = max(len(e.ref) for e in report.entries) + 2
        lines += ["", f"{'REF':<{width}}{'CLASS':<21}{'TYPE':<11}ACTION"]
        lines += [f"{e.ref:<{width}}{e.entry_class:<21}{e.file_type:<11}{e.action}"
                  for e in report.entries]
    lines += ["", "counts: " + " ".join(f"{k}={v}" for k, v in report.counts.items())]
    return lines


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.audit import (
        DEFAULT_LIMIT,
        DEFAULT_MIN_AGE_S,
        DEFAULT_SHARD,
        DEFAULT_SHARDS,
        audit_receipts,
    )
    from ql_core.cli.common import config_from_args
    from ql_core.errors import UsageError

    shard = args.shard if args.shard is not None else DEFAULT_SHARD
    shards = _int_option("--shards", args.shards, DEFAULT_SHARDS)
    limit = _int_option("--limit", args.limit, DEFAULT_LIMIT)
    min_age = _int_option("--min-age", args.min_age, DEFAULT_MIN_AGE_S)

    config = config_from_args(args)
    if config.profile.name == "cluster-control":
        raise UsageError("the cluster control plane never scans worker-local paths; "
                         "run `ql audit receipts` on the worker (profile cluster-worker)")
    from ql_core.paths import existing_data_dir

    existing_data_dir(config.data_dir)  # a mistyped --data-dir is an error, not 256 "missing" shards
    report = audit_receipts(config.data_dir, config.database_url, shard=shard, shards=shards,
                            limit=limit, min_age_s=min_age, quarantine=bool(args.quarantine))
    for line in _human_lines(report):
        out.text(line)
    summary = f"moved {report.moved}; next shard {report.next_shard} " \
              f"(continue with: ql audit receipts --shard {report.next_shard})"
    record = report.to_dict()
    # "status" is reserved for run and attempt states (docs/cli.md): a shard has a "state".
    record["shards"] = [{"shard": s["shard"], "state": s["status"], "entries": s["entries"]}
                        for s in record["shards"]]
    out.emit(record, summary)
    return 0
