"""``ql db grant-worker ROLE``: on the control database (run as its admin), set ``ROLE`` up as a
least-privilege worker role (:mod:`..roles`; idempotent)."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

__all__ = ["HELP", "TARGET", "run"]

HELP = "grant-worker ROLE: make ROLE a least-privilege cluster worker role"
TARGET = "ROLE"


def run(args: argparse.Namespace, role: str, out: Output) -> int:
    from ql_core.cli.common import config_from_args, mask_url
    from ql_core.errors import ConfigError

    config = config_from_args(args)
    if not config.database_url.startswith("postgresql"):
        raise ConfigError(f"grant-worker sets up a role on the cluster's PostgreSQL control database, and "
                          f"database_url is {mask_url(config.database_url)}; run it with the control node's config")
    from ..roles import grant_worker_url

    done = grant_worker_url(config.database_url, role)
    out.emit(done, f"role {done['role']} may now call only the {len(done['functions'])} ql worker functions on "
                   f"database {done['database']} (schema {done['schema']}); no table privileges")
    return 0
