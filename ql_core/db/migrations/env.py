"""Alembic environment: runs on a connection handed over by ``ql_core.db.migrate``."""

from __future__ import annotations

from alembic import context

from ql_core.db.models import METADATA

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only through ql_core.db.migrate
    raise RuntimeError("run migrations through `ql db upgrade` or ql_core.db.migrate.upgrade()")

context.configure(
    connection=connection,
    target_metadata=METADATA,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
