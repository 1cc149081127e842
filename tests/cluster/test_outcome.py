"""The outcome table against the database: the pure function and a real completion per case."""

from __future__ import annotations

import pytest

from ql_plugins.cluster_fenced import CompletionAnswer, LeaseAnswer
from tests.cluster.outcome_cases import OUTCOME_CASES
from tests.cluster.support import Cluster

pytestmark = pytest.mark.postgres

CASE_IDS = [c["id"] for c in OUTCOME_CASES]


def test_case_table_is_well_formed() -> None:
    assert len(set(CASE_IDS)) == len(CASE_IDS)
    for case in OUTCOME_CASES:
        assert case["status"] in ("succeeded", "failed", "cancelled", "timed_out")
        assert not (case["moot"] and case["cancel_reason"] is None)
        assert not (case["moot"] and case["status"] not in ("succeeded", "failed"))


def test_map_outcome_matches_every_case(cluster: Cluster) -> None:
    for case in OUTCOME_CASES:
        got = cluster.db.map_outcome(**{k: case[k] for k in ("cancel_reason", "cancel_requested_at_ms",
                                                              "deadline_at_ms", "signalled", "exit_code",
                                                              "finished_at_ms")})
        assert (got.status, got.reason, got.moot) == (case["status"], case["reason"], case["moot"]), case["id"]


@pytest.mark.parametrize("case", OUTCOME_CASES, ids=CASE_IDS)
def test_completion_applies_every_case(cluster: Cluster, case: dict) -> None:
    """Through ql_complete: intents set on the run, times placed 10 minutes in the past."""
    w = cluster.worker()
    (run_id,) = cluster.submit()
    claimed, fence = cluster.running_attempt(w)
    base = cluster.now() - 600_000

    def at(t: int | None) -> int | None:
        return None if t is None else base + t

    cluster.sql.execute("UPDATE ql_run_attempt SET created_at_ms = %s, started_at_ms = %s WHERE id = %s",
                        (base, base, claimed.attempt_id))
    cluster.sql.execute("UPDATE ql_run SET created_at_ms = %s, cancel_reason = %s, cancel_requested_at_ms = %s,"
                        " deadline_at_ms = %s"
                        " WHERE id = %s", (base, case["cancel_reason"], at(case["cancel_requested_at_ms"]),
                                           at(case["deadline_at_ms"]), run_id))
    # The worker learns the intent (and may then signal for it) only through its lease.
    renewed = cluster.db.renew(fence)
    assert renewed.answer is LeaseAnswer.OK
    assert renewed.intents.cancel_reason == case["cancel_reason"]
    result = cluster.complete(fence, case["exit_code"], finished_at_ms=at(case["finished_at_ms"]),
                              signalled=case["signalled"])
    assert result.answer is CompletionAnswer.APPLIED
    assert (result.status, result.reason) == (case["status"], case["reason"])
    run = cluster.run(run_id)
    assert (run["status"], run["reason"], run["exit_code"]) == (case["status"], case["reason"], case["exit_code"])
    assert run["finished_at_ms"] == at(case["finished_at_ms"])
    types = cluster.event_types(run_id)
    tail = [f"attempt.{case['status']}", f"run.{case['status']}"]
    if case["moot"]:
        tail = ["run.cancel_moot"] + tail
        moot = [e for e in cluster.events(run_id) if e["type"] == "run.cancel_moot"]
        assert [e["reason"] for e in moot] == [case["cancel_reason"]]
    else:
        assert "run.cancel_moot" not in types
    assert types[-len(tail):] == tail
    terminal = cluster.events(run_id)[-1]
    assert (terminal["status"], terminal["exit_code"], terminal["reason"]) == (
        case["status"], case["exit_code"], case["reason"])


def test_signalled_counts_only_after_the_intent_was_delivered(cluster: Cluster) -> None:
    """A worker cannot have signalled for an intent it never received: the claim is ignored."""
    w = cluster.worker()
    (run_id,) = cluster.submit()
    claimed, fence = cluster.running_attempt(w)
    assert cluster.db.request_cancel(run_id, "user").answer.value == "requested"
    # No renew: the intent was never handed to the lease holder. It finished "before" the request
    # by its own clock and says it signalled: the natural outcome stands and the intent is moot.
    base = cluster.run(run_id)["cancel_requested_at_ms"]
    result = cluster.complete(fence, 0, finished_at_ms=base - 1, signalled=True)
    assert (result.answer, result.status) == (CompletionAnswer.APPLIED, "succeeded")
    assert "run.cancel_moot" in cluster.event_types(run_id)
