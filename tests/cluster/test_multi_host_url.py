"""A ``database_url`` naming several hosts (libpq's failover form, ``h1:p1,h2:p2`` with
``target_session_attrs=read-write``) works everywhere ql connects. The failover itself is
tests/cluster/test_failover.py."""

from __future__ import annotations

import json
import uuid
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.cluster.worker_support import Harness

pytestmark = pytest.mark.postgres


def test_a_multi_host_url_reaches_the_writable_host(postgres_url: str, tmp_path: Path) -> None:
    """Every way ql connects takes libpq's multi-host URL as written — the schema migrations through
    SQLAlchemy (whose URL parser takes one host: a first `ql control`, `ql db upgrade`), the run
    store (`ql run --detach`)
    and the readers (`ql status`): here the first host is down and the second is the server."""
    from port_for import get_port

    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/postgres"
    name = f"ql_mh_{uuid.uuid4().hex[:12]}"
    with closing(psycopg.connect(admin, autocommit=True, connect_timeout=10)) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        parts = urlsplit(admin)
        user = parts.username + (f":{parts.password}" if parts.password else "")
        url = (f"postgresql+psycopg://{user}@127.0.0.1:{get_port(None)},{parts.hostname}:{parts.port or 5432}/{name}"
               f"?target_session_attrs=read-write")
        from ql_core.db.migrate import migrate_url

        migrate_url(url)  # what a first `ql control` does on an empty database
        h = Harness(url, tmp_path)
        upgraded = h.ql("db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr
        submitted = h.ql("--json", "run", "--detach", "true")
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout.splitlines()[0])["run_id"]
        status = h.ql("status", run_id)
        assert status.returncode == 0 and "queued" in status.stdout, (status.stdout, status.stderr)
    finally:
        with closing(psycopg.connect(admin, autocommit=True, connect_timeout=10)) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
