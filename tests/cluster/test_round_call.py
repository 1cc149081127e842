"""A worker round's starts, ``running`` reports and completions in ONE statement (``round_call``):
each call answers as alone (fenced on its own), an attempt's ``running`` is applied before its
completion in the same statement, a final error rolls the whole round back, a replay answers as a
replay, and a real worker's tasks end with the same events through it."""

from __future__ import annotations

import dataclasses

import pytest

from ql_plugins.cluster_fenced import CompletionAnswer, LeaseAnswer, completion_digest
from ql_plugins.cluster_fenced.control_db import ControlDBError
from ql_plugins.cluster_fenced.round_call import COMPLETE, EMPTY, RUNNING, START, report_round, round_sql
from tests.cluster.support import Cluster, completion

pytestmark = pytest.mark.postgres


def test_the_branches_run_in_the_order_of_the_protocol() -> None:
    sql = round_sql((COMPLETE, START, EMPTY, RUNNING))
    at = [sql.index(f) for f in ("ql_start_many", "ql_running_many", "ql_complete_many", "ql_artifact_empty_many")]
    assert at == sorted(at) and sql.count(" UNION ALL ") == 3


def test_one_statement_starts_reports_and_completes_each_call_fenced_on_its_own(cluster: Cluster) -> None:
    runs = cluster.submit(5)
    w = cluster.worker()
    claimed = cluster.claim(w, 5)
    fences = [c.fence(w) for c in claimed]
    run_of = {c.attempt_id: c.run_id for c in claimed}
    # Round 1: three attempts start; the fourth's fence is forged (fenced alone, the others go on).
    forged = dataclasses.replace(fences[3], lease_token="x" * 43)
    first = report_round(cluster.db, starts=[*fences[:3], forged])
    assert [r.answer for r in first.starts] == [LeaseAnswer.OK] * 3 + [LeaseAnswer.FENCED]
    assert first.runnings == [] and first.completions == [] and first.db_now_ms is not None
    # Round 2: the fifth starts; attempt 0 is reported running and attempt 1 running AND complete
    # in the same statement (a task that spawned and ended between two rounds); attempt 2 completes
    # from 'starting' (no report at all).
    done = completion(fences[1].attempt_id, finished=cluster.now())
    second = report_round(cluster.db, starts=[fences[4]], runnings=[(fences[0], 0), (fences[1], 0)],
                          completions=[(fences[1], done),
                                       (fences[2], completion(fences[2].attempt_id, 3, finished=cluster.now()))])
    assert [r.answer for r in second.starts] == [LeaseAnswer.OK]
    assert [r.answer for r in second.runnings] == [LeaseAnswer.OK, LeaseAnswer.OK]
    assert [(r.answer, r.status) for r in second.completions] == [(CompletionAnswer.APPLIED, "succeeded"),
                                                                  (CompletionAnswer.APPLIED, "failed")]
    assert cluster.lease(fences[0].attempt_id)["status"] == "running"
    assert cluster.lease(fences[4].attempt_id)["status"] == "starting"
    both = cluster.event_types(run_of[fences[1].attempt_id])
    assert "attempt.spawned" in both and both.index("attempt.spawned") < len(both) - 1  # before the end
    assert cluster.run(run_of[fences[1].attempt_id])["status"] == "succeeded"
    assert cluster.run(run_of[fences[3].attempt_id])["status"] != "succeeded"
    # The same round again (its COMMIT's answer lost): every call answers as a replay.
    again = report_round(cluster.db, starts=[fences[4]], runnings=[(fences[0], 0)],
                         completions=[(fences[1], done)])
    assert [r.answer for r in again.starts] == [LeaseAnswer.OK]
    assert [r.answer for r in again.runnings] == [LeaseAnswer.OK]
    assert [r.answer for r in again.completions] == [CompletionAnswer.ALREADY_COMPLETED]
    assert len(runs) == 5


def test_a_final_error_rolls_the_whole_round_back(cluster: Cluster) -> None:
    cluster.submit(2)
    w = cluster.worker()
    fences = [c.fence(w) for c in cluster.claim(w, 2)]
    assert [r.answer for r in report_round(cluster.db, starts=[fences[0]]).starts] == [LeaseAnswer.OK]
    bad = dataclasses.replace(completion(fences[0].attempt_id, finished=cluster.now()),
                              completion_digest="not-a-digest")
    with pytest.raises(ControlDBError) as err:
        report_round(cluster.db, starts=[fences[1]], runnings=[(fences[0], 0)], completions=[(fences[0], bad)])
    assert "not-a-digest" not in str(err.value)  # never a parameter in an error
    # Nothing of the round committed: the start and the running report were rolled back with it.
    assert cluster.lease(fences[1].attempt_id)["status"] == "claimed"
    assert cluster.lease(fences[0].attempt_id)["status"] == "starting"


def test_a_worker_runs_its_tasks_through_rounds_and_falls_back_without_the_function(harness) -> None:  # type: ignore[no-untyped-def]
    """A real worker: every run ends with its true result and its spawn event, through rounds; with
    ``ql_artifact_empty_many`` gone (an older control database), the round's statement fails, nothing
    is lost, and the worker makes the same calls separately from then on."""
    rt = harness.control
    subs = rt.submit_many([{"command": ["sh", "-c", f"exit {i % 2}"]} for i in range(8)])
    harness.start_worker("a", slots=4)
    rows = [harness.wait_status(s.run_id) for s in subs]
    assert [(r["status"], r["exit_code"]) for r in rows] == [("succeeded" if i % 2 == 0 else "failed", i % 2)
                                                             for i in range(8)]
    for s in subs:
        types = [e["type"] for e in harness.sql.execute(
            "SELECT type FROM ql_run_event WHERE run_id = %s ORDER BY seq", (s.run_id,)).fetchall()]
        assert "attempt.spawned" in types
    harness.sql.execute("DROP FUNCTION ql_artifact_empty_many(text[], bigint[], text[], text[], bigint[], text[],"
                        " bigint)")
    more = rt.submit_many([{"command": ["true"]} for _ in range(6)])
    assert {harness.wait_status(s.run_id)["status"] for s in more} == {"succeeded"}


def test_a_long_task_is_reported_running_without_waiting_for_its_end(harness, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A spawn no longer wakes the control loop (its running report waits for a round with other
    calls, RUNNING_REPORT_WITHIN_S at most): a task that runs on is still reported running within
    that bound — not at its completion, and not never."""
    from tests.cluster.worker_support import trigger_command, wait_for

    harness.start_worker("a", slots=2)
    # The task ends only when the test lets it (or after 300 s, past both waits below): "before its
    # end" is then a fact, not a race with a fixed-length task against a loaded machine's latency.
    trigger = tmp_path / "end-now"
    run_id = harness.submit(trigger_command(trigger, max_s=300))
    attempt = harness.wait_attempt(run_id, ("starting", "running"))
    # The lease goes 'running' (and the run gets its attempt.spawned event) with the report, while
    # the task still runs — the bound is 50 ms; the wait's is failure detection only (load).
    wait_for(lambda: harness.lease(attempt["id"])["status"] == "running",
             what="the running report of a task that runs on", diagnose=harness.logs)
    assert "attempt.spawned" in harness.event_types(run_id)
    assert harness.status(run_id) == "running"
    assert not trigger.exists()
    trigger.touch()
    assert harness.wait_status(run_id)["status"] == "succeeded"
