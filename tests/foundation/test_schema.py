"""Migrations from empty on a real SQLite file and a real PostgreSQL; metadata == migrated schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from ql_core.db.engine import create_db_engine, session_scope
from ql_core.db.migrate import current_revision, head_revision, upgrade

TABLES = {"ql_run", "ql_run_attempt", "ql_run_event", "ql_log_artifact", "ql_receipt_journal",
          "ql_cancel_dispatch", "alembic_version"}
#: Tables that exist only on SQLite (running totals kept by triggers, revision 0007).
SQLITE_TABLES = {"ql_tally", "ql_attempt_host"}


#: Tables that exist only on PostgreSQL (the cluster control plane, revision 0003).
POSTGRES_TABLES = {"ql_worker", "ql_attempt_lease", "ql_run_spec", "ql_artifact", "ql_artifact_chunk"}


def assert_schema_matches_metadata(engine) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from ql_core.db.migrate import version_locations
    from ql_core.db.models import METADATA, include_object

    version_locations()  # loads the plugins' schema branches, which declare their tables on METADATA

    # Tables declared for other dialects only (Table.info "ql_dialects") are not compared.
    opts = {"compare_type": True, "include_object": include_object(engine.dialect.name)}
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts=opts), METADATA)
    assert diff == []


def test_schema_head_constant_matches_alembic() -> None:
    from ql_core.db.migrate import SCHEMA_HEAD

    assert SCHEMA_HEAD == head_revision()


def test_sqlite_upgrade_from_empty(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'ql.db'}")
    assert current_revision(engine) is None
    assert upgrade(engine) == head_revision()
    assert upgrade(engine) == head_revision()  # idempotent
    assert set(inspect(engine).get_table_names()) == TABLES | SQLITE_TABLES
    assert_schema_matches_metadata(engine)


def test_sqlite_is_wal_with_busy_timeout_and_immediate_writers(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'ql.db'}", busy_timeout_ms=1234)
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 1234
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
    # A write transaction holds the write lock from BEGIN: a second writer cannot start.
    import sqlite3

    with session_scope(engine) as session:
        session.execute(text("SELECT 1"))
        other = sqlite3.connect(tmp_path / "ql.db", timeout=0.05, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()
    # ...while a read-only session does not take it.
    with session_scope(engine, write=False) as session:
        session.execute(text("SELECT 1"))
        other = sqlite3.connect(tmp_path / "ql.db", timeout=0.05, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        other.close()


@pytest.mark.postgres
def test_postgres_upgrade_from_empty(postgres_url: str) -> None:
    engine = create_db_engine(postgres_url)
    try:
        assert current_revision(engine) is None or current_revision(engine) == head_revision()
        assert upgrade(engine) == head_revision()
        assert TABLES | POSTGRES_TABLES <= set(inspect(engine).get_table_names())
        assert_schema_matches_metadata(engine)
    finally:
        engine.dispose()
