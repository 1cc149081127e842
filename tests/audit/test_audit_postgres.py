"""The audit against a real PostgreSQL run database (cluster worker), read in a READ ONLY transaction.

Uses the session's PostgreSQL server (``postgres_admin_dsn`` in tests/conftest.py:
``QL_TEST_POSTGRES_DSN`` or a throwaway server); a fresh database is created for the test and
dropped afterwards. Skipped with the reason when no server can be had or it is unreachable —
except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Iterator

import pytest
from tests.audit.audit_support import DataDir, clean_env, id_in_shard, insert_attempt, run_ql

from ql_core.audit import audit_receipts
from ql_core.db.audit_reads import _libpq_conninfo, _open_postgres

pytestmark = pytest.mark.postgres


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL test cannot run under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture
def audit_pg_url(postgres_admin_dsn: str) -> Iterator[str]:
    dsn = postgres_admin_dsn
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    assert dsn is not None
    name = f"ql_audit_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(_libpq_conninfo(dsn), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        _unavailable(f"PostgreSQL is unreachable: {str(exc).splitlines()[0]}")
    try:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield make_url(dsn).set(database=name).render_as_string(hide_password=False)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    finally:
        admin.close()


def _migrated(url: str) -> Any:
    from ql_core.db.engine import create_db_engine
    from ql_core.db.migrate import upgrade

    engine = create_db_engine(url)
    upgrade(engine)
    return engine


def test_audit_reads_postgres_read_only(audit_pg_url: str, tmp_path: Path) -> None:
    engine = _migrated(audit_pg_url)
    try:
        journaled, running, blocked, final = (id_in_shard("c4") for _ in range(4))
        insert_attempt(engine, journaled, "succeeded", journal="pending")
        insert_attempt(engine, running, "running")
        insert_attempt(engine, blocked, "blocked")
        insert_attempt(engine, final, "timed_out")
    finally:
        engine.dispose()

    d = DataDir(tmp_path / "worker", audit_pg_url)
    d.path.mkdir(mode=0o700)
    d.receipts.mkdir(mode=0o700)
    unknown = id_in_shard("c4")
    for attempt_id in (journaled, running, blocked, final, unknown):
        d.put("c4", f"{attempt_id}.json")
    # more ids than one IN (...) batch, all unknown to the database
    for _ in range(140):
        d.put("c5", f".{id_in_shard('c5')}.t.tmp")

    report = audit_receipts(d.path, audit_pg_url, shard="c4", shards=2, limit=64)
    classes = {e.ref: str(e.entry_class) for e in report.entries if e.shard == "c4"}
    assert classes == {
        f"c4/{journaled}.json": "journal_registered",
        f"c4/{running}.json": "active_attempt",
        f"c4/{blocked}.json": "active_attempt",
        f"c4/{final}.json": "terminal_or_unknown",
        f"c4/{unknown}.json": "terminal_or_unknown",
    }
    assert [s.status for s in report.shards] == ["ok", "overflow"]

    env = clean_env(QL_DATABASE_URL=audit_pg_url)
    result = run_ql(d.path, "--profile", "cluster-worker", "--shard", "c4", "--shards", "1", "--quarantine",
                    env=env)
    assert result.returncode == 0, result.stderr
    doc = result.json()
    assert doc["moved"] == 2
    assert sorted(os.listdir(d.receipts / "c4")) == sorted(f"{i}.json" for i in (journaled, running, blocked))
    assert sorted(os.listdir(d.orphans / "c4")) == sorted(f"{i}.json" for i in (final, unknown))


def test_session_is_read_only(audit_pg_url: str) -> None:
    """The connection the audit uses refuses writes (a READ ONLY transaction)."""
    import psycopg

    _migrated(audit_pg_url).dispose()
    conn = _open_postgres(audit_pg_url)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("DELETE FROM ql_receipt_journal")
        conn.rollback()
        level = conn.execute("SHOW transaction_isolation").fetchone()
        assert level == ("repeatable read",)
    finally:
        conn.close()


def test_unreachable_postgres_fails_closed(tmp_path: Path) -> None:
    d = DataDir(tmp_path / "worker", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    d.path.mkdir(mode=0o700)
    d.receipts.mkdir(mode=0o700)
    receipt = d.put("c4", f"{id_in_shard('c4')}.json")
    env = clean_env(QL_DATABASE_URL=d.url)
    result = run_ql(d.path, "--profile", "cluster-worker", "--shard", "c4", "--shards", "1", "--quarantine",
                    env=env)
    assert result.returncode == 1, result.stderr
    assert "run database" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert receipt.exists()
