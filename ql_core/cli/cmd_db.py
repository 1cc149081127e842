"""``ql db upgrade``: apply the schema migrations (also applied on every start)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "database maintenance: `ql db upgrade` applies the migrations"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade"], help="upgrade: migrate the schema to head")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import config_from_args
    from ql_core.db.engine import create_db_engine
    from ql_core.db.migrate import current_revision, upgrade
    from ql_core.paths import ensure_data_dir

    config = config_from_args(args)
    if config.is_sqlite:
        ensure_data_dir(config.data_dir)
    engine = create_db_engine(config.database_url, busy_timeout_ms=config.profile.busy_timeout_ms)
    before = current_revision(engine)
    head = upgrade(engine)
    out.emit({"status": "ok", "from_revision": before, "revision": head},
             f"schema at {head}" + ("" if before == head else f" (was {before or 'empty'})"))
    return 0
