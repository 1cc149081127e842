"""Schema migrations (Alembic), applied on start and by ``ql db upgrade``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["SCHEMA_HEAD", "upgrade", "migrate_url", "current_revision", "head_revision"]

#: The newest revision in migrations/versions (a test keeps this equal to Alembic's head).
#: Knowing it without Alembic saves every start-up ~0.3 s of importing it.
SCHEMA_HEAD = "0004_cluster_worker"


def _alembic_config(connection=None):  # type: ignore[no-untyped-def]
    from importlib import resources

    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(resources.files("ql_core.db") / "migrations"))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision this version of ql ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    from sqlalchemy import inspect, text

    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return rows[0] if len(rows) == 1 else None


def upgrade(engine: Engine) -> str:
    """Bring the schema to head; idempotent. Returns the head revision."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        if current_revision(engine) == SCHEMA_HEAD:
            return SCHEMA_HEAD
        from alembic import command

        head = head_revision()
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "head")
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot migrate the run database: {type(exc).__name__}: "
                            f"{str(exc.orig if getattr(exc, 'orig', None) else exc)[:200]}") from exc
    return head


def migrate_url(url: str) -> str:
    """Bring the database at ``url`` to head with a short-lived engine (the run stores' own
    connections never load SQLAlchemy). Returns the head revision."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    if url.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise DatabaseError("PostgreSQL needs the psycopg driver: pip install 'ql-runner[cluster]'") from None
    engine = create_engine(url, poolclass=NullPool)
    try:
        return upgrade(engine)
    finally:
        engine.dispose()
