"""The Python client: lazy driver import, transient vs final errors, no secrets in errors or reprs."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from ql_plugins.cluster_fenced import (
    CompletionAnswer,
    ControlDB,
    ControlDBError,
    LeaseAnswer,
    TransientError,
    with_retries,
)
from tests.cluster.support import Cluster, seal

pytestmark = pytest.mark.postgres


def test_importing_the_package_does_not_import_psycopg() -> None:
    code = ("import sys, ql_plugins.cluster_fenced as c; import ql_plugins.cluster_fenced.control_db;"
            " assert 'psycopg' not in sys.modules, 'eager'; print(sorted(c.__all__)[:1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_client_needs_autocommit(cluster: Cluster) -> None:
    with psycopg.connect(cluster.dsn) as conn:
        with pytest.raises(ValueError, match="autocommit"):
            ControlDB(conn)
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        db = ControlDB(conn)
        assert db.sweep().acted == 0
        db.close()  # not ours: left open
        assert not conn.closed


def test_final_errors_name_the_argument_never_its_value(cluster: Cluster) -> None:
    secret = "s3cr3t-env-value"
    with pytest.raises(ControlDBError) as err:
        cluster.db.submit("run-" + secret, sealed=seal("run-" + secret, {"env": {"TOKEN": secret}}))
    assert not isinstance(err.value, TransientError)
    assert secret not in str(err.value) and secret not in repr(err.value)
    assert err.value.sqlstate == "22023" and "run_id" in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_lost_connection_is_transient_and_the_client_reconnects(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    db = cluster.client()
    try:
        pid = db._connection().info.backend_pid
        cluster.sql.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(TransientError):
            db.renew(fence)
        # Replaying the same call on a new connection is safe and final.
        assert with_retries(lambda: db.renew(fence)).answer is LeaseAnswer.OK
        first = with_retries(lambda: cluster.complete(fence, 0, finished_at_ms=5, db=db))
        assert first.answer is CompletionAnswer.APPLIED
        # The applying COMMIT "lost its answer": the replay is recognised.
        assert cluster.complete(fence, 0, finished_at_ms=5, db=db).answer is CompletionAnswer.ALREADY_COMPLETED
    finally:
        db.close()


def test_statement_timeout_is_transient(cluster: Cluster) -> None:
    """A call blocked behind a lock past statement_timeout: retryable, nothing half-done."""
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    db = ControlDB.connect(cluster.dsn, statement_timeout_ms=200)
    blocker = psycopg.connect(cluster.dsn)
    try:
        blocker.execute("SELECT 1 FROM ql_run WHERE id = %s FOR UPDATE", (run_id,))
        with pytest.raises(TransientError) as err:
            db.renew(fence)
        assert err.value.sqlstate == "57014"
        blocker.rollback()
        assert db.renew(fence).answer is LeaseAnswer.OK
    finally:
        blocker.close()
        db.close()


def test_with_retries_gives_up_after_its_attempts() -> None:
    calls = []

    def failing() -> None:
        calls.append(1)
        raise TransientError("renew", "OperationalError", "08006")

    with pytest.raises(TransientError):
        with_retries(failing, attempts=3, sleep=lambda s: None)
    assert len(calls) == 3
    with pytest.raises(ControlDBError):
        with_retries(lambda: (_ for _ in ()).throw(ControlDBError("x", "bad")), sleep=lambda s: None)


def test_reprs_hide_the_token_and_the_spec(cluster: Cluster) -> None:
    cluster.submit(spec={"command": ["echo", "top-secret"], "env": {"K": "v"}})
    w = cluster.worker()
    (claimed,) = cluster.claim(w)
    fence = claimed.fence(w)
    for text in (repr(claimed), repr(fence), str(fence)):
        assert claimed.lease_token not in text and "top-secret" not in text
