"""The built-in ``postgres`` artifact store passes the artifact-store contract, and its database
functions hold on their own: the proof is checked by the database (stale generation, another
worker, a restarted worker of the same id), and the chunk SHA-256 is recomputed there."""

from __future__ import annotations

import hashlib
import uuid
from typing import Callable, Iterator

import pytest

from ql_core.testing import ArtifactStoreContract
from ql_core.testing.artifact_store import ArtifactWriter
from ql_plugins.cluster_fenced import LeaseFence
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def stores(cluster_dsn: str) -> Iterator[list]:  # type: ignore[type-arg]
    opened: list = []  # type: ignore[type-arg]
    yield opened
    for store in opened:
        store.close()


def _store(cluster_dsn: str, stores: list):  # type: ignore[no-untyped-def,type-arg]
    from ql_plugins.cluster_fenced.artifact_store import PostgresArtifactStore

    store = PostgresArtifactStore(cluster_dsn)
    stores.append(store)
    return store


class TestPostgresArtifactStoreContract(ArtifactStoreContract):
    @pytest.fixture
    def artifact_writer(self, cluster: Cluster, cluster_dsn: str, stores: list  # type: ignore[type-arg]
                        ) -> Callable[[], ArtifactWriter]:
        def make() -> ArtifactWriter:
            self.cluster = cluster
            worker = cluster.worker(f"w-{uuid.uuid4().hex[:8]}")
            cluster.submit()
            _claimed, fence = cluster.running_attempt(worker)
            foreign = LeaseFence(fence.worker_id, fence.worker_generation, fence.session, fence.attempt_id,
                                 fence.lease_generation, "not-the-token")
            return ArtifactWriter(_store(cluster_dsn, stores), fence.attempt_id, fence, foreign,
                                  reader=_store(cluster_dsn, stores))
        return make

    def end_run(self, writer: ArtifactWriter, *, ended_ago_s: float) -> None:
        run_id = self.cluster.attempt(writer.attempt_id)["run_id"]
        if self.cluster.run(run_id)["status"] == "running":
            assert str(self.cluster.complete(writer.proof).answer) == "applied"
        # Time travel for the run's end alone (the database clock decides retention).
        self.cluster.sql.execute("UPDATE ql_run SET finished_at_ms = ql__clock_ms() - %s WHERE id = %s",
                                 (int(ended_ago_s * 1000), run_id))


def test_the_database_checks_the_proof(cluster: Cluster, cluster_dsn: str, stores: list) -> None:  # type: ignore[type-arg]
    store = _store(cluster_dsn, stores)
    w1 = cluster.worker("w1")
    cluster.submit()
    _claimed, fence = cluster.running_attempt(w1)
    assert not store.open(fence.attempt_id, fence, max_bytes=1 << 20).fenced
    assert str(store.append(fence.attempt_id, fence, 0, b"one", _sha(b"one")).answer) == "appended"

    # Another worker presenting the right lease identity (it saw the token somehow): wrong worker.
    w2 = cluster.worker("w2")
    other = LeaseFence("w2", w2.generation, w2.session, fence.attempt_id, fence.lease_generation, fence.lease_token)
    assert store.append(fence.attempt_id, other, 3, b"x", _sha(b"x")).fence_reason == "WRONG_WORKER"

    # The same worker id re-registered (a restart: new generation and session): the OLD process is
    # fenced, the new one may go on with the token it persisted — also after the attempt ended.
    w1b = cluster.worker("w1")
    assert store.append(fence.attempt_id, fence, 3, b"two", _sha(b"two")).fence_reason == "STALE_WORKER_GENERATION"
    resumed = LeaseFence("w1", w1b.generation, w1b.session, fence.attempt_id, fence.lease_generation,
                         fence.lease_token)
    assert store.open(fence.attempt_id, resumed, max_bytes=1 << 20).committed_bytes == 3
    assert str(store.append(fence.attempt_id, resumed, 3, b"two", _sha(b"two")).answer) == "appended"
    cluster.sql.execute("UPDATE ql_attempt_lease SET status = 'ended', end_reason = 'worker_lost', "
                        "ended_at_ms = ql__clock_ms() WHERE attempt_id = %s", (fence.attempt_id,))
    assert store.finalize(fence.attempt_id, resumed, total_bytes=6, sha256=_sha(b"onetwo")).acknowledged

    # A session that expired may not write (a partitioned zombie of the current generation).
    cluster.submit()
    _c2, fence2 = cluster.running_attempt(w1b)
    proof2 = LeaseFence("w1", w1b.generation, w1b.session, fence2.attempt_id, fence2.lease_generation,
                        fence2.lease_token)
    assert not store.open(fence2.attempt_id, proof2, max_bytes=100).fenced
    cluster.sql.execute("UPDATE ql_worker SET lease_expires_at_ms = ql__clock_ms() - 1 WHERE id = 'w1'")
    assert store.append(fence2.attempt_id, proof2, 0, b"z", _sha(b"z")).fence_reason == "SESSION_EXPIRED"


def test_the_database_recomputes_the_chunk_sha(cluster: Cluster, cluster_dsn: str) -> None:
    """Straight at the SQL function: a caller that lies about the SHA writes nothing."""
    w1 = cluster.worker("w1")
    cluster.submit()
    _claimed, fence = cluster.running_attempt(w1)
    cluster.sql.execute("SELECT * FROM ql_artifact_open(%s, %s, %s, %s, %s, %s, %s)", (*fence.params(), 100))
    row = cluster.sql.execute("SELECT answer FROM ql_artifact_append(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                              (*fence.params(), 0, b"real", _sha(b"fake"))).fetchone()
    assert row["answer"] == "corrupt"
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_artifact_chunk").fetchone()["n"] == 0


def test_worker_functions_are_security_definer_with_a_pinned_search_path(cluster: Cluster) -> None:
    from ql_plugins.cluster_fenced.artifact_store import ARTIFACT_WORKER_FUNCTIONS

    for signature in ARTIFACT_WORKER_FUNCTIONS:
        row = cluster.sql.execute("SELECT p.prosecdef, p.proconfig FROM pg_proc p WHERE p.oid = %s::regprocedure",
                                  (signature,)).fetchone()
        assert row["prosecdef"] is True, signature
        assert "search_path=pg_catalog, public, pg_temp" in (row["proconfig"] or []), (signature, row)


def test_the_store_is_selected_by_name_and_only_on_cluster_profiles(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ql_core.config import load_config
    from ql_core.errors import ConfigError

    url = "postgresql+psycopg://u@127.0.0.1/db"
    for profile in ("cluster-control", "cluster-worker"):
        path = tmp_path / f"{profile}.toml"
        path.write_text(f'profile = "{profile}"\ndata_dir = "{tmp_path}"\ndatabase_url = "{url}"\n')
        config = load_config(config_path=path, environ={})
        assert config.artifact_store == "postgres" and "postgres" in config.seam_plugins
    edge = tmp_path / "edge.toml"
    edge.write_text(f'data_dir = "{tmp_path}"\nartifact_store = "postgres"\n')
    with pytest.raises(ConfigError, match="artifact_store is for the cluster profiles"):
        load_config(config_path=edge, environ={})
    assert load_config(config_path=None, data_dir=tmp_path, environ={}).artifact_store is None


def test_an_empty_log_is_finalized_without_a_read_back_and_only_when_the_database_holds_no_bytes(
        cluster: Cluster, cluster_dsn: str, stores: list) -> None:  # type: ignore[type-arg]
    store = _store(cluster_dsn, stores)
    worker = cluster.worker(f"w-{uuid.uuid4().hex[:8]}")
    # An empty log: finalized (the database checked that it holds no bytes).
    cluster.submit()
    _claimed, empty = cluster.running_attempt(worker)
    assert not store.open(empty.attempt_id, empty, max_bytes=100).fenced
    assert str(store.finalize(empty.attempt_id, empty, total_bytes=0, sha256=_sha(b"")).answer) == "finalized"
    assert str(store.finalize(empty.attempt_id, empty, total_bytes=0, sha256=_sha(b"")).answer) == "already_finalized"
    # Bytes were shipped but the finalize says the log is empty: refused by the database, not finalized.
    cluster.submit()
    _claimed, shipped = cluster.running_attempt(worker)
    assert not store.open(shipped.attempt_id, shipped, max_bytes=100).fenced
    assert str(store.append(shipped.attempt_id, shipped, 0, b"out", _sha(b"out")).answer) == "appended"
    assert str(store.finalize(shipped.attempt_id, shipped, total_bytes=0, sha256=_sha(b"")).answer) == "mismatch"
    assert str(store.finalize(shipped.attempt_id, shipped, total_bytes=0, sha256=_sha(b"out")).answer) == "mismatch"
    assert str(store.finalize(shipped.attempt_id, shipped, total_bytes=3, sha256=_sha(b"out")).answer) == "finalized"


def test_batched_opens_and_empty_finalizes_answer_each_call_as_alone(
        cluster: Cluster, cluster_dsn: str, stores: list) -> None:  # type: ignore[type-arg]
    """The log shipper's batches (one transaction, one round trip): every call is fenced on its own,
    a fenced or refused one changes nothing for the others, and the answers are the single calls'."""
    from ql_core.ports.artifact_store import FinalizeAnswer

    store = _store(cluster_dsn, stores)
    worker = cluster.worker(f"w-{uuid.uuid4().hex[:8]}")
    fences = []
    for _ in range(3):
        cluster.submit()
        fences.append(cluster.running_attempt(worker)[1])
    empty, shipped, other = fences
    forged = LeaseFence(other.worker_id, other.worker_generation, other.session, other.attempt_id,
                        other.lease_generation, "not-the-token")
    states = store.open_many([(f.attempt_id, f) for f in (empty, shipped, forged)], max_bytes=100)
    assert [s.attempt_id for s in states] == [empty.attempt_id, shipped.attempt_id, other.attempt_id]
    assert [s.fenced for s in states] == [False, False, True]
    assert states[2].fence_reason == "WRONG_TOKEN"
    assert (states[0].committed_bytes, states[0].max_bytes, states[0].finalized) == (0, 100, False)
    assert str(store.append(shipped.attempt_id, shipped, 0, b"out", _sha(b"out")).answer) == "appended"
    # Reopened in a batch: the store's committed offset, as a single open answers it.
    again = store.open_many([(f.attempt_id, f) for f in (empty, shipped)], max_bytes=100)
    single = store.open(shipped.attempt_id, shipped, max_bytes=100)
    assert (again[1].committed_bytes, single.committed_bytes) == (3, 3)
    # Empty finalizes: the empty log finalized, the one holding bytes refused, the forged one fenced —
    # each as alone, in one batch.
    results = store.finalize_empty_many([(f.attempt_id, f) for f in (empty, shipped, forged)])
    assert [r.answer for r in results] == [FinalizeAnswer.FINALIZED, FinalizeAnswer.MISMATCH, FinalizeAnswer.FENCED]
    assert cluster.sql.execute("SELECT status FROM ql_artifact WHERE attempt_id = %s",
                               (shipped.attempt_id,)).fetchone()["status"] != "final"
    assert [str(r.answer) for r in store.finalize_empty_many([(empty.attempt_id, empty)] * 2)] == [
        "already_finalized", "already_finalized"]


def test_a_batch_that_fails_for_good_is_made_call_by_call(
        cluster: Cluster, cluster_dsn: str, stores: list) -> None:  # type: ignore[type-arg]
    """A call that raises inside the batch rolls the whole transaction back; the store then makes
    the calls one by one, so the good ones are answered as alone and the bad one raises alone."""
    from ql_core.ports.artifact_store import ArtifactStoreError

    store = _store(cluster_dsn, stores)
    worker = cluster.worker(f"w-{uuid.uuid4().hex[:8]}")
    cluster.submit()
    good = cluster.running_attempt(worker)[1]
    batches = []
    many = store._db._many

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        batches.append(args[0])
        return many(*args, **kwargs)

    store._db._many = counted
    # A negative max_bytes is refused by ql_artifact_open (an invalid argument): the batch of two fails.
    with pytest.raises(ArtifactStoreError):
        store.open_many([(good.attempt_id, good), (good.attempt_id, good)], max_bytes=-1)
    assert batches == ["artifact_open"]
    (state,) = store.open_many([(good.attempt_id, good)], max_bytes=100)  # one call: no batch
    assert not state.fenced and batches == ["artifact_open"]
