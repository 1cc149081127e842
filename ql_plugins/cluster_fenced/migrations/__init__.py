"""The cluster plugin's schema: its own Alembic branch (label ``cluster_fenced``) in ``versions/``.

Core finds it through the ``ql.migrations`` entry point (``ql_core.db.migrate``) and applies it with
its own revisions. It starts on core's ``0003_cluster_control`` (which also added the run columns
the cluster reads) and keeps the revision ids of the single-chain schema (0004, 0005, 0006, 0008),
so a control database or data dir created before the split upgrades in place.

Loading it declares the plugin's tables on core's ``METADATA`` (:mod:`..tables`), so Alembic's
environment and the schema test compare them with the migrated database.
"""

from .. import tables as _tables  # noqa: F401 - registers the cluster tables

__all__: list[str] = []
