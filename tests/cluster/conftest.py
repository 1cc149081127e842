"""Fixtures of the control-plane tests: one fresh, migrated PostgreSQL database per test.

The session's database (``postgres_url``) is migrated to head once and then used only as a
TEMPLATE: each test gets ``CREATE DATABASE ... TEMPLATE`` (a file copy, ~50 ms), so sweeps and
claims see only that test's rows. At teardown every test's database is checked against the
invariants (:func:`check_invariants`) before it is dropped.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from tests.cluster.support import Cluster, admin_conninfo, check_invariants, conninfo_of


@pytest.fixture(scope="session")
def cluster_template(postgres_url: str) -> str:
    """The session database, migrated to head; from here on only a template."""
    from ql_core.db.engine import create_db_engine
    from ql_core.db.migrate import upgrade

    engine = create_db_engine(postgres_url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return postgres_url.rsplit("/", 1)[1]


@pytest.fixture
def cluster_dsn(postgres_url: str, cluster_template: str) -> Iterator[str]:
    """A private database for this test, cloned from the migrated template (psycopg conninfo)."""
    import psycopg

    name = f"ql_c_{uuid.uuid4().hex[:12]}"
    admin = admin_conninfo(postgres_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{cluster_template}"')
    dsn = conninfo_of(postgres_url.rsplit("/", 1)[0] + "/" + name)
    try:
        yield dsn
        check_invariants(dsn)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def cluster(cluster_dsn: str) -> Iterator[Cluster]:
    c = Cluster(cluster_dsn)
    try:
        yield c
    finally:
        c.close()



@pytest.fixture
def harness(cluster_dsn: str, tmp_path):  # type: ignore[no-untyped-def]
    """Real `ql worker` / `ql control` processes on this test's database (tests/cluster/worker_support.py).

    At teardown: every process is stopped, leftover tasks are killed, and the worker-side invariants
    are checked (the control database's are checked by ``cluster_dsn``)."""
    from tests.cluster.worker_support import Harness, check_workers

    h = Harness(cluster_dsn, tmp_path)
    try:
        yield h
    finally:
        h.stop_all()
    check_workers(h)
    if h._sql is not None:
        h._sql.close()
