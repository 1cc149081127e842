"""Claim: bounded by free slots and 64 (MAX_CLAIM; 8 before revision 0015), oldest first, SKIP LOCKED under real contention."""

from __future__ import annotations

import hashlib
import multiprocessing
import threading
import uuid

import pytest

from ql_core.ids import new_id
from ql_plugins.cluster_fenced import MAX_CLAIM, ControlDB, LeaseAnswer
from tests.cluster.support import TEST_KEY, Cluster, opened

pytestmark = pytest.mark.postgres


def _claim(db: ControlDB, worker, max_n: int, free_slots: int, ids: int = 10):
    return db.claim(worker, max_n=max_n, free_slots=free_slots, executor="local",
                    attempt_ids=[new_id() for _ in range(ids)], log_ids=[new_id() for _ in range(ids)])


def test_claim_is_bounded_by_max_n_free_slots_and_max_claim(cluster: Cluster) -> None:
    assert MAX_CLAIM == 64
    cluster.submit(100)
    w = cluster.worker(slots=64)
    assert len(_claim(cluster.db, w, max_n=3, free_slots=10).attempts) == 3
    assert len(_claim(cluster.db, w, max_n=10, free_slots=2).attempts) == 2
    assert len(_claim(cluster.db, w, max_n=90, free_slots=90, ids=80).attempts) == MAX_CLAIM
    assert len(_claim(cluster.db, w, max_n=5, free_slots=5, ids=1).attempts) == 1  # ids supplied bound it too
    assert _claim(cluster.db, w, max_n=5, free_slots=0).attempts == ()
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run WHERE status = 'queued'").fetchone()["n"] == 30


def test_claim_takes_the_oldest_first_and_records_attempt_lease_and_event(cluster: Cluster) -> None:
    runs = cluster.submit(3, timeout_ms=5000, spec={"command": ["echo", "x"], "shell": False, "cwd": "/tmp",
                                                   "env": {"A": "1"}})
    w = cluster.worker()
    claimed = cluster.claim(w, 2)
    # Oldest first: by the database's created_at_ms, then id (UUIDv7s made in one millisecond are in
    # random order among themselves).
    queue = sorted(runs, key=lambda r: (cluster.run(r)["created_at_ms"], r))
    assert [c.run_id for c in claimed] == queue[:2]
    first = claimed[0]
    assert first.attempt_no == 1 and first.timeout_ms == 5000
    assert first.sealed_spec.ordinal == 1 and first.sealed_spec.key_id == TEST_KEY.key_id
    assert opened(first) == {"command": ["echo", "x"], "shell": False, "cwd": "/tmp", "env": {"A": "1"}}
    assert len(first.lease_token) == 64 and set(first.lease_token) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert claimed[0].lease_token != claimed[1].lease_token
    assert claimed[1].lease_generation > claimed[0].lease_generation
    digest = hashlib.sha256(first.lease_token.encode()).hexdigest()
    lease = cluster.lease(first.attempt_id)
    assert (lease["status"], lease["token_digest"], lease["worker_id"], lease["worker_generation"]) == (
        "claimed", digest, "w1", w.generation)
    assert lease["expires_at_ms"] == lease["claimed_at_ms"] + 30_000 == first.lease_expires_at_ms
    attempt = cluster.attempt(first.attempt_id)
    assert (attempt["status"], attempt["callback_token_hash"], attempt["runtime_owner"], attempt["executor"]) == (
        "starting", digest, "w1", "local")
    run = cluster.run(first.run_id)
    assert (run["status"], run["current_attempt_id"]) == ("running", first.attempt_id)
    assert cluster.event_types(first.run_id) == ["run.created", "attempt.claimed"]
    # The token is nowhere in the database, and not in the result's repr.
    dump = str(cluster.sql.execute("SELECT * FROM ql_attempt_lease").fetchall()) + str(
        cluster.sql.execute("SELECT * FROM ql_run_attempt").fetchall())
    assert first.lease_token not in dump
    assert first.lease_token not in repr(first) and "echo" not in repr(first)


def test_claim_rejects_malformed_ids_without_claiming(cluster: Cluster) -> None:
    from ql_plugins.cluster_fenced import ControlDBError

    cluster.submit(1)
    w = cluster.worker()
    with pytest.raises(ControlDBError) as err:
        cluster.db.claim(w, max_n=1, free_slots=1, executor="local", attempt_ids=["not-an-id"], log_ids=[new_id()])
    assert "not-an-id" not in str(err.value) and err.value.sqlstate == "22023"
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run WHERE status = 'queued'").fetchone()["n"] == 1
    # Every id the claim may use is checked (0015 checks them in one statement): a bad one in the
    # middle refuses the whole claim; one past what the claim can take is never looked at (as before).
    ids, logs = [new_id() for _ in range(5)], [new_id() for _ in range(5)]
    with pytest.raises(ControlDBError) as err:
        cluster.db.claim(w, max_n=5, free_slots=5, executor="local", attempt_ids=ids,
                         log_ids=logs[:2] + ["not-an-id"] + logs[3:])
    assert err.value.sqlstate == "22023"
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run WHERE status = 'queued'").fetchone()["n"] == 1
    claimed = cluster.db.claim(w, max_n=1, free_slots=1, executor="local", attempt_ids=ids[:1] + ["not-an-id"],
                               log_ids=logs[:2]).attempts
    assert [c.attempt_id for c in claimed] == ids[:1]


def test_parallel_claimers_in_threads_claim_every_run_exactly_once(cluster: Cluster) -> None:
    total, claimers = 120, 6
    cluster.submit(total)
    got: list[list[str]] = [[] for _ in range(claimers)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(claimers)

    def claimer(i: int) -> None:
        try:
            db = cluster.client()
            try:
                w = cluster.worker(f"t{i}", db=db)
                barrier.wait()
                empty = 0
                while empty < 3:
                    result = _claim(db, w, max_n=8, free_slots=8)
                    assert result.answer is LeaseAnswer.OK
                    got[i].extend(c.run_id for c in result.attempts)
                    empty = empty + 1 if not result.attempts else 0
            finally:
                db.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    claimed = [r for g in got for r in g]
    assert len(claimed) == total and len(set(claimed)) == total
    assert sum(1 for g in got if g) >= 2  # the work really was shared
    n = cluster.sql.execute("SELECT count(*) AS n, count(DISTINCT run_id) AS d FROM ql_run_attempt").fetchone()
    assert n == {"n": total, "d": total}


def _process_claimer(dsn: str, worker_id: str, out: "multiprocessing.Queue[list[str] | str]") -> None:
    try:
        with ControlDB.connect(dsn) as db:
            w = db.register(worker_id, str(uuid.uuid4()), slots=8, ql_version="0.test").worker
            mine: list[str] = []
            empty = 0
            while empty < 3:
                result = _claim(db, w, max_n=8, free_slots=8)
                mine.extend(c.run_id for c in result.attempts)
                empty = empty + 1 if not result.attempts else 0
            out.put(mine)
    except BaseException as exc:  # noqa: BLE001
        out.put(f"{type(exc).__name__}: {exc}")


def test_parallel_claimers_in_processes_claim_every_run_exactly_once(cluster: Cluster) -> None:
    total, procs = 80, 4
    cluster.submit(total)
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    ps = [ctx.Process(target=_process_claimer, args=(cluster.dsn, f"p{i}", out)) for i in range(procs)]
    for p in ps:
        p.start()
    results = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(30)
    assert all(isinstance(r, list) for r in results), results
    claimed = [r for res in results for r in res]
    assert len(claimed) == total and len(set(claimed)) == total
