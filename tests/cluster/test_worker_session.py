"""Worker registration, generations and the session lease."""

from __future__ import annotations

import uuid

import pytest

from ql_plugins.cluster_fenced import LeaseAnswer, WorkerFence
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres


def test_register_bumps_generation_and_fences_the_older_process(cluster: Cluster) -> None:
    first = cluster.db.register("w1", str(uuid.uuid4()), slots=2, ql_version="0.test")
    assert first.worker.generation == 1
    assert first.lease_expires_at_ms == first.db_now_ms + 45_000
    second = cluster.db.register("w1", str(uuid.uuid4()), slots=2, ql_version="0.test")
    assert second.worker.generation == 2
    old, new = first.worker, second.worker
    assert cluster.db.heartbeat(old).answer is LeaseAnswer.FENCED
    assert cluster.db.heartbeat(new).answer is LeaseAnswer.OK
    cluster.submit(1)
    assert cluster.db.claim(old, max_n=1, free_slots=1, executor="local", attempt_ids=[_id()],
                            log_ids=[_id()]).answer is LeaseAnswer.FENCED
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run_attempt").fetchone()["n"] == 0
    assert len(cluster.claim(new)) == 1
    # Another worker id is independent.
    assert cluster.db.register("w2", str(uuid.uuid4()), slots=1, ql_version="0.test").worker.generation == 1


def test_register_again_with_the_same_session_keeps_the_generation(cluster: Cluster) -> None:
    """A retry after a lost response must not fence the caller itself."""
    session = str(uuid.uuid4())
    a = cluster.db.register("w1", session, slots=2, ql_version="0.test")
    b = cluster.db.register("w1", session, slots=4, ql_version="0.test")
    assert a.worker == b.worker
    assert cluster.sql.execute("SELECT slots FROM ql_worker WHERE id = 'w1'").fetchone()["slots"] == 4


def test_heartbeat_extends_the_session_lease_and_a_lapsed_one_blocks_claims(cluster: Cluster) -> None:
    w = cluster.worker()
    hb = cluster.db.heartbeat(w, ttl_ms=60_000)
    assert hb.answer is LeaseAnswer.OK and hb.lease_expires_at_ms == hb.db_now_ms + 60_000
    cluster.submit(1)
    cluster.sql.execute("UPDATE ql_worker SET lease_expires_at_ms = ql__clock_ms() - 1")
    result = cluster.db.claim(w, max_n=1, free_slots=1, executor="local", attempt_ids=[_id()], log_ids=[_id()])
    assert result.answer is LeaseAnswer.FENCED and result.attempts == ()
    # Same generation, same session: a heartbeat revives the session lease (its run leases were
    # never the session lease's to fence), and claiming works again.
    assert cluster.db.heartbeat(w).answer is LeaseAnswer.OK
    assert len(cluster.claim(w)) == 1


def test_heartbeat_with_a_wrong_session_or_unknown_worker_is_fenced(cluster: Cluster) -> None:
    w = cluster.worker()
    assert cluster.db.heartbeat(WorkerFence(w.worker_id, w.generation, str(uuid.uuid4()))).answer is LeaseAnswer.FENCED
    assert cluster.db.heartbeat(WorkerFence("nobody", 1, w.session)).answer is LeaseAnswer.FENCED


def _id() -> str:
    from ql_core.ids import new_id

    return new_id()
