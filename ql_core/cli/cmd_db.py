"""``ql db upgrade``: apply the schema migrations (also applied on every start)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "database maintenance: `ql db upgrade` applies the migrations"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade"], help="upgrade: migrate the schema to head")


def run(args: argparse.Namespace, out: Output) -> int:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ql_core.cli.common import config_from_args
    from ql_core.db.migrate import current_revision, migrate_url
    from ql_core.paths import ensure_data_dir

    config = config_from_args(args)
    if config.is_sqlite:
        ensure_data_dir(config.data_dir)
    engine = create_engine(config.database_url, poolclass=NullPool)
    try:
        before = current_revision(engine)
    finally:
        engine.dispose()
    head = migrate_url(config.database_url)
    out.emit({"status": "ok", "from_revision": before, "revision": head},
             f"schema at {head}" + ("" if before == head else f" (was {before or 'empty'})"))
    return 0
