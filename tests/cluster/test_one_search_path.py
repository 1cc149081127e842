"""Revision 0014: every ql function that pins a search_path pins the same one, so the plans a
backend caches for them (and for the foreign-key checks their writes fire) stay valid from one
call to the next whichever function runs; ``ql db grant-worker`` keeps it that way."""

from __future__ import annotations

import pytest

from ql_plugins.cluster_fenced import completion_digest
from ql_plugins.cluster_fenced.control_db import Completion
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres

PINNED = "search_path=pg_catalog, public, pg_temp"


def _paths(cluster: Cluster) -> dict[str, set[str]]:
    rows = cluster.sql.execute(
        r"SELECT p.oid::regprocedure::text AS fn, c AS setting FROM pg_proc p, unnest(p.proconfig) AS c "
        r"WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'ql\_%' "
        r"AND c LIKE 'search\_path=%'").fetchall()
    out: dict[str, set[str]] = {}
    for row in rows:
        out.setdefault(row["setting"], set()).add(row["fn"])
    return out


def test_every_pinned_function_has_the_one_path_of_the_migrations(cluster: Cluster) -> None:
    paths = _paths(cluster)
    assert set(paths) == {PINNED}, paths
    # 0005's worker functions were pinned to "public, pg_temp" before: they are among them now.
    names = {fn.split("(")[0] for fn in paths[PINNED]}
    assert {"ql_start", "ql_running", "ql_complete", "ql_claim", "ql_complete_many", "ql_heartbeat",
            "ql_submit", "ql_artifact_open"} <= names


def test_single_and_batched_calls_in_turn_on_one_connection(cluster: Cluster) -> None:
    """0005's single calls and the batched ones of 0011+, alternating on one connection (what a
    worker's control loop does): the same answers as ever — the re-pinned functions still resolve
    every name, under the one path."""
    worker = cluster.worker("w-one-path")
    runs = cluster.submit(6)
    for i in range(3):
        claimed = cluster.claim(worker, 2)
        fences = [c.fence(worker) for c in claimed]
        if i % 2 == 0:
            for c, fence in zip(claimed, fences):
                assert cluster.db.start(fence).answer.value == "ok"
                assert cluster.db.running(fence, started_at_ms=c.db_now_ms).answer.value == "ok"
                assert cluster.complete(fence).answer.value == "applied"
        else:
            assert [r.answer.value for r in cluster.db.start_many(fences)] == ["ok", "ok"]
            assert [r.answer.value for r in cluster.db.running_many([(f, c.db_now_ms)
                                                                      for f, c in zip(fences, claimed)])] == ["ok", "ok"]
            now = cluster.now()
            done = [(f, Completion(0, None, now, False, completion_digest(f.attempt_id, exit_code=0, started_at_ms=None,
                                                                          finished_at_ms=now, signalled=False)))
                    for f in fences]
            assert [r.answer.value for r in cluster.db.complete_many(done)] == ["applied", "applied"]
    rows = cluster.sql.execute("SELECT status, count(*) AS n FROM ql_run WHERE id = ANY(%s) GROUP BY status",
                               (runs,)).fetchall()
    assert {r["status"]: r["n"] for r in rows} == {"succeeded": 6}
