"""Revision 0012's set-based batched calls answer and write exactly what the single calls do.

One scenario — every answer a batch can give: ok, fenced for a forged token, NOT_STARTED, an unknown
attempt, a replay, an attempt named twice in one batch, a cancel intent delivered at start or at
running, a moot cancel, a signalled cancel, a completion without ql_running (deadline from the
reported start), an expired lease (fenced, with its audit event), an exact replay and a late
completion with another payload — runs twice on fresh runs of the same database: once through the
set-based functions, once through the single functions pipelined (the client's fallback, which is
0011's loop call for call). The answers, the rows of every run, attempt and lease and the events
must be the same, up to ids and clock readings (which are compared by where they are set).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ql_core.ids import new_id
from tests.cluster.support import Cluster, completion

pytestmark = pytest.mark.postgres


def _scenario(cluster: Cluster, worker_id: str) -> tuple[list[Any], list[str]]:
    """The calls, in batches; returns (every answer, the runs)."""
    db = cluster.db
    plain = cluster.submit(6)
    timed = cluster.submit(2, timeout_ms=60_000)
    runs = plain + timed
    w = cluster.worker(worker_id)
    claimed = cluster.claim(w, 8)
    by_run = {c.run_id: c for c in claimed}
    c = [by_run[r] for r in runs]  # in submit order: c[0..5] plain, c[6], c[7] with a timeout
    f = [x.fence(w) for x in c]
    forged = dataclasses.replace(f[2], lease_token="x" * 43)
    unknown = dataclasses.replace(f[0], attempt_id=new_id())
    answers: list[Any] = []
    # Cancel intent before start: delivered by start.
    db.request_cancel(runs[4], "user")
    answers.append(db.start_many([f[0], f[1], forged, f[3], f[4], f[5], f[6], f[7], f[0], unknown]))
    # f[2] is still claimed: running answers NOT_STARTED; then its real start.
    answers.append(db.running_many([(f[2], 0), (unknown, 0)]))
    answers.append(db.start_many([f[2]]))
    t0 = cluster.now()
    # f[6] (with a timeout) is never reported running: its completion sets the deadline.
    answers.append(db.running_many([(f[0], t0), (f[1], t0), (f[2], t0), (f[3], t0), (f[4], t0), (f[5], t0),
                                    (f[7], t0), (f[0], t0 + 5), (forged, t0)]))
    # Cancel intents while running: f[3]'s delivered by a replayed running, f[5]'s by the next one.
    db.request_cancel(runs[3], "user")
    db.request_cancel(runs[5], "user")
    answers.append(db.running_many([(f[3], t0), (f[5], t0)]))
    cluster.expire(c[1].attempt_id)
    now = cluster.now()
    done = [
        (f[0], completion(f[0].attempt_id, 0, finished=now)),
        (f[1], completion(f[1].attempt_id, 0, finished=now)),          # lease expired: fenced (audit event)
        (f[2], completion(f[2].attempt_id, 7, finished=now)),
        (f[3], completion(f[3].attempt_id, 143, finished=now, signalled=True)),  # cancelled
        (f[4], completion(f[4].attempt_id, 0, finished=now)),          # intent delivered at start: cancelled
        (f[5], completion(f[5].attempt_id, 0, finished=t0)),           # finished before the cancel: moot
        (f[6], completion(f[6].attempt_id, 0, finished=now, started=t0)),
        (f[7], completion(f[7].attempt_id, 1, finished=now)),
        (f[0], completion(f[0].attempt_id, 0, finished=now)),          # named twice: a replay
        (forged, completion(f[2].attempt_id, 0, finished=now)),        # fenced: wrong token
        (unknown, completion(unknown.attempt_id, 0, finished=now)),    # unknown attempt
    ]
    answers.append(db.complete_many(done))
    # An exact replay and a late completion with another payload, in one batch.
    answers.append(db.complete_many([done[0], (f[7], completion(f[7].attempt_id, 2, finished=now))]))
    return answers, runs


#: Clock readings and sequence numbers: compared by whether they are set.
_COUNTERS = ("_ms", "lease_generation", "worker_generation")


def _shape(value: Any, ids: dict[str, str]) -> Any:
    """Ids by their first appearance, times and generations by whether they are set, the rest as is."""
    if isinstance(value, dict):
        return {k: ("set" if v is not None else None) if k.endswith(_COUNTERS) and k != "timeout_ms"
                else _shape(v, ids) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shape(v, ids) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _shape({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, ids)
    if isinstance(value, str) and len(value) == 36 and value.count("-") == 4:
        return ids.setdefault(value, f"id{len(ids)}")
    if isinstance(value, str) and value.startswith(("fenced:", "late:")):  # an audit's dedupe key
        kind, attempt_id, _digest = value.split(":")
        return f"{kind}:{_shape(attempt_id, ids)}"
    if isinstance(value, str) and len(value) == 64 and all(ch in "0123456789abcdef" for ch in value):
        return "digest"
    return value


def _rows(cluster: Cluster, runs: list[str]) -> list[Any]:
    out = []
    for run_id in runs:
        attempts = cluster.attempts(run_id)
        out.append((cluster.run(run_id), attempts, [cluster.lease(a["id"]) for a in attempts],
                    [{k: v for k, v in e.items() if k != "id"} for e in cluster.events(run_id)]))
    return out


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two shapes differ (a readable failure instead of two long reprs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def test_set_based_batches_answer_and_write_what_the_single_calls_do(cluster: Cluster) -> None:
    cluster.db._batch_functions = True
    set_answers, set_runs = _scenario(cluster, "w1")
    assert cluster.db._batch_functions, "the set-based functions were not used"
    cluster.db._batch_functions = False  # the single functions, pipelined
    one_answers, one_runs = _scenario(cluster, "w1")  # a new session of the same worker id
    set_ids: dict[str, str] = {}
    one_ids: dict[str, str] = {}
    assert _shape(set_answers, set_ids) == _shape(one_answers, one_ids)
    assert _differences(_shape(_rows(cluster, set_runs), set_ids), _shape(_rows(cluster, one_runs), one_ids)) == []
    # The scenario reached what it is about.
    statuses = [cluster.run(r)["status"] for r in set_runs]
    assert statuses == ["succeeded", "running", "failed", "cancelled", "cancelled", "succeeded", "succeeded",
                        "failed"]
    moot = cluster.event_types(set_runs[5])
    assert "run.cancel_moot" in moot and moot.count("run.succeeded") == 1
    assert cluster.run(set_runs[6])["deadline_at_ms"] is not None
    assert "attempt.completion_fenced" in cluster.event_types(set_runs[1])
    assert "attempt.late_callback_ignored" in cluster.event_types(set_runs[7])


def test_the_batched_calls_read_by_key_even_without_statistics(cluster: Cluster) -> None:
    # Every plan inside claim / start_many / running_many / complete_many, from auto_explain (nested
    # statements, sent to this client): on tables the planner has no statistics for (autovacuum off,
    # never analyzed), none scans a whole table or a status index — a batch reads its rows by key.
    for table in ("ql_run", "ql_run_attempt", "ql_attempt_lease", "ql_run_event", "ql_run_spec", "ql_worker"):
        cluster.sql.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    from ql_plugins.cluster_fenced.control_db import QueuedSubmit
    from tests.cluster.support import seal

    for _ in range(12):  # 3,000 queued runs: a whole-table or status-index scan costs more than a key lookup
        cluster.db.submit_many([QueuedSubmit(r, seal(r)) for r in (new_id() for _ in range(250))])
    w = cluster.worker()
    conn = cluster.db._connection()
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "client_min_messages = log"):
        conn.execute(f"SET {setting}")
    for _ in range(7):  # past the plan cache's first five custom plans: the generic plans too
        fences = [c.fence(w) for c in cluster.claim(w, 8)]
        cluster.db.start_many(fences)
        cluster.db.running_many([(f, 0) for f in fences])
        now = cluster.now()
        assert {r.answer.value for r in cluster.db.complete_many([(f, completion(f.attempt_id, 0, finished=now))
                                                                  for f in fences])} == {"applied"}
    conn.execute("RESET client_min_messages")
    assert any("ql_complete_many" in p or "WITH calls" in p for p in plans), "auto_explain showed no plan"
    scans = [p for p in plans if "status = 'queued'" not in p  # the queue: an ordered scan, LIMIT n (0011)
             and any(bad in p for bad in ("Seq Scan on ql_", "Bitmap Heap Scan on ql_", "Hash Join", "Merge Join",
                                          "using ix_ql_run_status", "using ix_ql_attempt_live",
                                          "using ix_ql_attempt_active", "using ix_ql_attempt_deadline",
                                          "using ix_ql_lease_live_expiry"))]
    assert scans == []


def _deadline_scenario(cluster: Cluster, worker_id: str) -> tuple[list[Any], list[str]]:
    """Completions without a cancel intent around their deadline (revision 0015 computes their
    outcome in ql_complete_many's statement): past it, at it, before it, and past the deadline a
    completion without ql_running sets from its reported start; exit codes 0 and not 0."""
    db = cluster.db
    runs = cluster.submit(5, timeout_ms=1_000)
    w = cluster.worker(worker_id)
    by_run = {c.run_id: c for c in cluster.claim(w, 5)}
    f = [by_run[r].fence(w) for r in runs]
    answers: list[Any] = [db.start_many(f)]
    t0 = cluster.now()
    answers.append(db.running_many([(x, t0) for x in f[:4]]))  # f[4] is never reported running
    deadline = [cluster.run(r)["deadline_at_ms"] for r in runs[:4]]
    done = [
        (f[0], completion(f[0].attempt_id, 0, finished=deadline[0] + 1)),  # past it: timed_out
        (f[1], completion(f[1].attempt_id, 3, finished=deadline[1])),      # at it: timed_out, whatever the exit code
        (f[2], completion(f[2].attempt_id, 0, finished=deadline[2] - 1)),  # before it: succeeded
        (f[3], completion(f[3].attempt_id, 9, finished=deadline[3] - 1)),  # before it: failed
        (f[4], completion(f[4].attempt_id, 0, finished=t0 + 1_500, started=t0)),  # past started + timeout
    ]
    answers.append(db.complete_many(done))
    return answers, runs


def test_set_based_completion_outcomes_at_the_deadline_are_the_single_calls(cluster: Cluster) -> None:
    cluster.db._batch_functions = True
    set_answers, set_runs = _deadline_scenario(cluster, "w1")
    assert cluster.db._batch_functions, "the set-based functions were not used"
    cluster.db._batch_functions = False
    one_answers, one_runs = _deadline_scenario(cluster, "w1")
    set_ids: dict[str, str] = {}
    one_ids: dict[str, str] = {}
    assert _shape(set_answers, set_ids) == _shape(one_answers, one_ids)
    assert _differences(_shape(_rows(cluster, set_runs), set_ids), _shape(_rows(cluster, one_runs), one_ids)) == []
    assert [(cluster.run(r)["status"], cluster.run(r)["reason"]) for r in set_runs] == [
        ("timed_out", "timeout"), ("timed_out", "timeout"), ("succeeded", None), ("failed", None),
        ("timed_out", "timeout")]
