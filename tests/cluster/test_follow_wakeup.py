"""A follower of a shipped log sleeps until the store's notification (``LISTEN ql_artifact``)
instead of polling the chunks: real PostgreSQL, the real store, the fenced writer functions."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest

from ql_core.follow import follow_artifact
from ql_plugins.cluster_fenced.artifact_store import PostgresArtifactStore
from tests.cluster.support import Cluster
from tests.cluster.worker_support import wait_for

pytestmark = pytest.mark.postgres


class CountingStore(PostgresArtifactStore):
    """The real store; it only counts the reads a follower makes."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.reads = 0

    def read(self, attempt_id: str, offset: int, limit: int = 1 << 20) -> bytes:
        self.reads += 1
        return super().read(attempt_id, offset, limit)


def test_a_follower_wakes_on_the_notification_and_reads_nothing_while_the_log_is_quiet(
        cluster: Cluster, cluster_dsn: str) -> None:
    writer, reader = PostgresArtifactStore(cluster_dsn), CountingStore(cluster_dsn)
    got: list[bytes] = []
    errors: list[BaseException] = []
    try:
        worker = cluster.worker("w1")
        cluster.submit()
        _claimed, fence = cluster.running_attempt(worker)
        attempt_id = fence.attempt_id
        run_id = cluster.attempt(attempt_id)["run_id"]
        assert not writer.open(attempt_id, fence, max_bytes=1 << 20).fenced

        def follow() -> None:
            try:
                for chunk in follow_artifact(reader, run_id, follow=True, unfinalized_s=60):
                    got.append(chunk.data)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        assert str(writer.append(attempt_id, fence, 0, b"one\n", hashlib.sha256(b"one\n").hexdigest()).answer) \
            == "appended"
        wait_for(lambda: b"".join(got) == b"one\n", what="the first chunk at the follower")

        # Quiet: the follower sleeps on LISTEN and looks at the run's state once a second; it does
        # not read the chunks again (a poller at 4 Hz would read ~8 times in these 2 s).
        reads = reader.reads
        time.sleep(2.0)
        assert reader.reads - reads <= 1, reader.reads - reads

        assert str(writer.append(attempt_id, fence, 4, b"two\n", hashlib.sha256(b"two\n").hexdigest()).answer) \
            == "appended"
        wait_for(lambda: b"".join(got) == b"one\ntwo\n", what="the second chunk at the follower")
        assert str(cluster.complete(fence).answer) == "applied"
        data = b"one\ntwo\n"
        assert writer.finalize(attempt_id, fence, total_bytes=len(data),
                               sha256=hashlib.sha256(data).hexdigest()).acknowledged
        thread.join(60)
        assert not thread.is_alive(), "the follower did not end after the finalize"
        assert not errors, errors
        assert b"".join(got) == data
    finally:
        writer.close()
        reader.close()


def test_a_store_that_cannot_listen_says_so_and_only_sleeps() -> None:
    """A wrong address for the listening connection only: wait_for_change sleeps and says False."""
    store: Any = PostgresArtifactStore("postgresql://nobody@127.0.0.1:1/none")
    try:
        assert store.wait_for_change("x", 0.05) is False
    finally:
        store.close()
