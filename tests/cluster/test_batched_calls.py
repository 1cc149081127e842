"""Batched control calls (one transaction, one round trip): each call in a batch is still fenced on
its own, a batch answers exactly what the calls one by one would, and a bulk submit queues all."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from ql_core.ids import new_id
from ql_plugins.cluster_fenced import CompletionAnswer, LeaseAnswer, completion_digest
from ql_plugins.cluster_fenced.control_db import MAX_BATCH, ControlDBError, QueuedSubmit
from ql_plugins.cluster_fenced.results import SubmitAnswer
from tests.cluster.support import Cluster, completion, seal

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("batched_functions", [True, False], ids=["batched-functions", "pipelined"])
def test_a_batch_answers_each_call_as_alone_and_a_fenced_one_changes_nothing(cluster: Cluster,
                                                                             batched_functions: bool) -> None:
    # Revision 0011's ql_*_many functions (one statement) and the pipelined single calls (a control
    # database or a worker role without them) answer alike.
    cluster.db._batch_functions = batched_functions
    runs = cluster.submit(4)
    w = cluster.worker()
    claimed = cluster.claim(w, 4)
    fences = [c.fence(w) for c in claimed]
    # One fence forged (a wrong token): fenced on its own, the other three start.
    fences[2] = dataclasses.replace(fences[2], lease_token="x" * 43)
    started = cluster.db.start_many(fences)
    assert [r.answer for r in started] == [LeaseAnswer.OK, LeaseAnswer.OK, LeaseAnswer.FENCED, LeaseAnswer.OK]
    good = [f for i, f in enumerate(fences) if i != 2]
    running = cluster.db.running_many([(f, 0) for f in good])
    assert all(r.answer is LeaseAnswer.OK for r in running)
    renewed = cluster.db.renew_many(good, ttl_ms=30_000)
    assert all(r.answer is LeaseAnswer.OK and r.lease_expires_at_ms is not None for r in renewed)
    forged_run = next(c.run_id for c in claimed if c.attempt_id == fences[2].attempt_id)
    before = cluster.state(forged_run)
    calls = [(f, completion(f.attempt_id, i, finished=cluster.now())) for i, f in enumerate(good)] + [
        (fences[2], completion(fences[2].attempt_id, finished=cluster.now()))]
    done = cluster.db.complete_many(calls)
    assert [r.answer for r in done] == [CompletionAnswer.APPLIED] * 3 + [CompletionAnswer.FENCED]
    assert [r.status for r in done[:3]] == ["succeeded", "failed", "failed"]
    assert cluster.state(forged_run) == before  # the fenced call inside the batch wrote nothing
    # The same batch again (its COMMIT's answer lost): every call is a replay.
    again = cluster.db.complete_many(calls[:3])
    assert [r.answer for r in again] == [CompletionAnswer.ALREADY_COMPLETED] * 3
    assert {cluster.run(r)["status"] for r in runs if r != forged_run} == {"succeeded", "failed"}


def test_a_batch_is_one_transaction_a_final_error_rolls_it_all_back(cluster: Cluster) -> None:
    cluster.submit(2)
    w = cluster.worker()
    claimed = cluster.claim(w, 2)
    fences = [c.fence(w) for c in claimed]
    assert all(r.answer is LeaseAnswer.OK for r in cluster.db.start_many(fences))
    good = completion(fences[0].attempt_id, finished=cluster.now())
    bad = dataclasses.replace(completion(fences[1].attempt_id, finished=cluster.now()),
                              completion_digest="not-a-digest")
    with pytest.raises(ControlDBError, match="completion_digest"):
        cluster.db.complete_many([(fences[0], good), (fences[1], bad)])
    # The good call of the failed batch did not commit: its lease still runs.
    assert cluster.lease(fences[0].attempt_id)["status"] == "starting"
    assert cluster.db.complete_many([(fences[0], good)])[0].answer is CompletionAnswer.APPLIED
    with pytest.raises(ValueError):
        cluster.db.start_many([fences[1]] * (MAX_BATCH + 1))


def test_submit_many_queues_every_run_once_and_a_replay_answers_exists(cluster: Cluster) -> None:
    ids = [new_id() for _ in range(20)]
    batch = [QueuedSubmit(run_id, seal(run_id), name=f"n{i}", timeout_ms=5_000) for i, run_id in enumerate(ids)]
    assert {r.answer for r in cluster.db.submit_many(batch)} == {SubmitAnswer.CREATED}
    assert {r.answer for r in cluster.db.submit_many(batch[:5])} == {SubmitAnswer.EXISTS}
    rows = cluster.sql.execute("SELECT status, count(*) AS n FROM ql_run WHERE id = ANY(%s) GROUP BY status",
                               (ids,)).fetchall()
    assert [(r["status"], r["n"]) for r in rows] == [("queued", 20)]
    w = cluster.worker(str(uuid.uuid4())[:8])
    assert len(cluster.claim(w, 8)) == 8  # workers take them like any queued run


def test_runtime_submit_many_queues_a_burst_that_a_worker_drains_through_batched_calls(harness) -> None:  # type: ignore[no-untyped-def]
    from ql_core.errors import UsageError
    from tests.cluster.worker_support import wait_for

    rt = harness.control
    with pytest.raises(TypeError, match=r"tasks\[1\]"):  # checked before anything is written
        rt.submit_many([{"command": ["true"]}, {"command": "true"}])
    with pytest.raises(UsageError, match=r"tasks\[0\]: max_attempts"):
        rt.submit_many([{"command": ["true"], "max_attempts": 0}])
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_run").fetchone()["n"] == 0
    tasks = [{"command": ["sh", "-c", f"exit {i % 3}"], "name": f"burst-{i}"} for i in range(16)]
    subs = rt.submit_many(tasks)
    assert len({s.run_id for s in subs}) == 16 and all(s.attempt_id is None for s in subs)
    harness.start_worker("a", slots=4)
    rows = [harness.wait_status(s.run_id) for s in subs]
    assert [(r["name"], r["status"], r["exit_code"]) for r in rows] == [
        (f"burst-{i}", "succeeded" if i % 3 == 0 else "failed", i % 3) for i in range(16)]
    wait_for(lambda: {r["state"] for r in harness.lease_rows("a")} == {"answered"},
             what="every outbox row to get its final answer", diagnose=harness.logs)


@pytest.mark.parametrize("missing", ["dropped", "not granted"])
def test_without_the_batched_functions_the_same_calls_are_pipelined(cluster: Cluster, missing: str) -> None:
    """A control database before revision 0011 (42883), or a worker role granted before it (42501):
    the client makes the same calls pipelined, with the same answers, and stops trying the batch."""
    from ql_plugins.cluster_fenced import ControlDB

    cluster.submit(3)
    w = cluster.worker()
    fences = [c.fence(w) for c in cluster.claim(w, 3)]
    if missing == "dropped":
        cluster.sql.execute("DROP FUNCTION ql_start_many(text[], bigint[], text[], text[], bigint[], text[])")
        db = cluster.db
    else:
        role = f"ql_w_{uuid.uuid4().hex[:8]}"
        cluster.sql.execute(f'CREATE ROLE "{role}" LOGIN')
        for fn in ("ql_start(text, bigint, text, text, bigint, text)",
                   "ql_running(text, bigint, text, text, bigint, text, bigint)"):
            cluster.sql.execute(f'GRANT EXECUTE ON FUNCTION {fn} TO "{role}"')
        dsn = cluster.sql.info.dsn
        db = ControlDB.connect(dsn.replace("user=postgres", f"user={role}") if "user=" in dsn else f"{dsn} user={role}")
    try:
        assert [r.answer for r in db.start_many(fences)] == [LeaseAnswer.OK] * 3
        assert db._batch_functions is False
        assert [r.answer for r in db.running_many([(f, 0) for f in fences])] == [LeaseAnswer.OK] * 3
        assert {cluster.lease(f.attempt_id)["status"] for f in fences} == {"running"}
    finally:
        if db is not cluster.db:
            db.close()
            cluster.sql.execute(f'DROP OWNED BY "{role}"')
            cluster.sql.execute(f'DROP ROLE "{role}"')
