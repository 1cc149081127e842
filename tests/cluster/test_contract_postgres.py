"""The cluster-fenced run store on PostgreSQL passes the journal-backend contract suite.

Each test gets a private database cloned from the migrated template (tests/cluster/conftest.py),
so paging and lists see only that test's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from ql_core.ports.journal import JournalBackend
from ql_core.testing import JournalBackendContract

pytestmark = pytest.mark.postgres


class TestPostgresJournalContract(JournalBackendContract):
    @pytest.fixture
    def make_backend(self, cluster_dsn: str) -> Callable[[Path], JournalBackend]:
        from ql_plugins.cluster_fenced.pg_store import PostgresJournal

        return lambda _tmp: PostgresJournal(cluster_dsn)


def test_every_statement_prepares_against_the_migrated_schema(cluster_dsn: str) -> None:
    import psycopg

    from ql_plugins.cluster_fenced import pg_statements

    with psycopg.connect(cluster_dsn, autocommit=True) as conn:
        for name in pg_statements.__all__:
            text = getattr(pg_statements, name)
            if not isinstance(text, str) or not text.lstrip().upper().startswith(
                    ("SELECT", "INSERT", "UPDATE", "DELETE")):
                continue
            conn.execute("BEGIN")
            try:
                # EXPLAIN plans the statement with NULL parameters: every table and column must exist.
                params = [None] * text.count("%s")
                conn.execute(f"EXPLAIN {text}", params)
            finally:
                conn.execute("ROLLBACK")
