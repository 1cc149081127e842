"""Revision 0017: a completion that carries its attempt's spawn (``ql_spawn_complete_many``) writes
exactly what the attempt's ``running`` report followed by its completion wrote, in one round.

One scenario — a plain run, one with a timeout, a cancel intent to deliver (a signalled cancel), an
attempt already reported running (no spawn carried), an expired lease (fenced, with its audit
event), an attempt named twice and a forged token — runs twice on fresh runs of the same database:
once as the worker's round made it before 0017 (``ql_running_many`` then ``ql_complete_many`` in
one statement), once with the spawns carried by the completions. The completions' answers, the rows
of every run, attempt and lease and the events must be the same, up to ids and clock readings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ql_plugins.cluster_fenced.round_call import report_round
from tests.cluster.support import Cluster, completion
from tests.cluster.test_set_based_batches import _differences, _rows, _shape

pytestmark = pytest.mark.postgres


def _scenario(cluster: Cluster, worker_id: str, *, carried: bool) -> tuple[list[Any], list[str]]:
    db = cluster.db
    runs = cluster.submit(3) + cluster.submit(1, timeout_ms=60_000) + cluster.submit(3)
    w = cluster.worker(worker_id)
    by_run = {c.run_id: c for c in cluster.claim(w, 7)}
    c = [by_run[r] for r in runs]
    f = [x.fence(w) for x in c]
    db.start_many(f)
    t0 = cluster.now()
    db.running_many([(f[2], t0)])        # reported running already: no spawn carried
    db.request_cancel(runs[1], "user")   # an intent the running report delivers
    cluster.expire(c[4].attempt_id)      # fenced, with its audit event
    forged = dataclasses.replace(f[6], lease_token="x" * 43)
    now = cluster.now()
    done = [(f[0], completion(f[0].attempt_id, 0, finished=now)),
            (f[1], completion(f[1].attempt_id, 143, finished=now, signalled=True)),
            (f[2], completion(f[2].attempt_id, 0, finished=now)),
            (f[3], completion(f[3].attempt_id, 4, finished=now)),
            (f[4], completion(f[4].attempt_id, 0, finished=now)),
            (f[5], completion(f[5].attempt_id, 0, finished=now)),
            (f[5], completion(f[5].attempt_id, 0, finished=now)),
            (forged, completion(f[6].attempt_id, 0, finished=now))]
    spawns = [t0, t0, None, t0, t0, t0, t0, t0]
    if carried:
        answers = report_round(db, completions=done, spawns=spawns)
        assert answers.runnings == []
    else:  # the round before 0017: each spawned attempt's running report, once, then the completions
        answers = report_round(db, runnings=[(f[i], t0) for i in (0, 1, 3, 4, 5)] + [(forged, t0)],
                               completions=done)
    return answers.completions, runs


def test_a_completion_with_its_spawn_writes_what_running_then_complete_wrote(cluster: Cluster) -> None:
    carried_answers, carried_runs = _scenario(cluster, "w1", carried=True)
    before_answers, before_runs = _scenario(cluster, "w1", carried=False)
    carried_ids: dict[str, str] = {}
    before_ids: dict[str, str] = {}
    assert _shape(carried_answers, carried_ids) == _shape(before_answers, before_ids)
    assert _differences(_shape(_rows(cluster, carried_runs), carried_ids),
                        _shape(_rows(cluster, before_runs), before_ids)) == []
    # The scenario reached what it is about.
    assert [cluster.run(r)["status"] for r in carried_runs] == [
        "succeeded", "cancelled", "succeeded", "failed", "running", "succeeded", "running"]
    for r in (carried_runs[0], carried_runs[3], carried_runs[5]):
        types = cluster.event_types(r)
        status = cluster.run(r)["status"]
        assert types[-3:] == ["attempt.spawned", f"attempt.{status}", f"run.{status}"]
    assert cluster.run(carried_runs[3])["deadline_at_ms"] is not None
    assert "attempt.completion_fenced" in cluster.event_types(carried_runs[4])
    assert "attempt.spawned" not in cluster.event_types(carried_runs[6])


def test_a_worker_without_the_function_reports_running_again(harness) -> None:  # type: ignore[no-untyped-def]
    """A real worker: every short task ends with its spawn event and its true result, with the spawn
    carried by the completion; with ``ql_spawn_complete_many`` gone (a control database before 0017),
    the round fails, nothing is lost, and the worker sends the running reports again."""
    rt = harness.control
    subs = rt.submit_many([{"command": ["sh", "-c", f"exit {i % 2}"]} for i in range(8)])
    harness.start_worker("a", slots=4)

    def check(runs: list[Any]) -> None:
        rows = [harness.wait_status(s.run_id) for s in runs]
        assert [r["exit_code"] for r in rows] == [i % 2 for i in range(len(runs))]
        for s in runs:
            types = [e["type"] for e in harness.sql.execute(
                "SELECT type FROM ql_run_event WHERE run_id = %s ORDER BY seq", (s.run_id,)).fetchall()]
            assert types.count("attempt.spawned") == 1
            end = "run.succeeded" if types[-1] == "run.succeeded" else "run.failed"
            assert types.index("attempt.spawned") < types.index(end)

    check(subs)
    harness.sql.execute("DROP FUNCTION ql_spawn_complete_many(text[], bigint[], text[], text[], bigint[], text[],"
                        " integer[], bigint[], bigint[], boolean[], text[], bigint[])")
    more = rt.submit_many([{"command": ["sh", "-c", f"exit {i % 2}"]} for i in range(6)])
    check(more)
