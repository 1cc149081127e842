"""Helpers of the control-plane tests: a Cluster handle, row snapshots, the invariant checker."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ql_core.ids import new_id
from ql_plugins.cluster_fenced import (
    ClaimedAttempt,
    ControlDB,
    LeaseAnswer,
    LeaseFence,
    WorkerFence,
    completion_digest,
)
from ql_plugins.cluster_fenced.control_db import Completion
from ql_plugins.cluster_fenced.sealing import SpecKey, SpecKeyRing, encode_spec, key_id_of

#: The tests' spec key (fixed: any 32 bytes; production keys come from `ql db new-spec-key`).
TEST_KEY = SpecKey(key_id_of(b"ql-test-spec-key-0123456789abcde"), b"ql-test-spec-key-0123456789abcde")
TEST_RING = SpecKeyRing(TEST_KEY)

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
TERMINAL_EVENTS = tuple(f"run.{s}" for s in TERMINAL)
LIVE = ("claimed", "starting", "running")


def conninfo_of(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def admin_conninfo(url: str) -> str:
    return conninfo_of(url.rsplit("/", 1)[0] + "/postgres")


def seal(run_id: str, spec: dict[str, Any] | None = None, max_attempts: int = 1) -> Any:
    """``spec`` (default: run ``true``) sealed with the tests' key, one copy per allowed attempt."""
    spec = spec or {"command": ["true"], "shell": False, "cwd": None, "env": {}}
    plain = encode_spec(spec.get("command", []), spec.get("shell", False), spec.get("cwd"), spec.get("env"))
    return TEST_RING.seal(run_id, plain, max_attempts)


def completion(attempt_id: str, exit_code: int = 0, *, finished: int, started: int | None = None,
               signalled: bool = False) -> Completion:
    """A completion of ``attempt_id`` with its digest, as a worker's outbox sends it (batched calls)."""
    return Completion(exit_code, started, finished, signalled,
                      completion_digest(attempt_id, exit_code=exit_code, started_at_ms=started, finished_at_ms=finished,
                                        signalled=signalled))


def opened(claimed: ClaimedAttempt) -> dict[str, Any]:
    """The spec a claim handed out, opened with the tests' key."""
    return TEST_RING.open(claimed.run_id, claimed.sealed_spec)


class Cluster:
    """One test database: a ControlDB client plus a superuser connection for set-up and checks."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.db = ControlDB.connect(dsn)
        self.sql = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)

    def close(self) -> None:
        self.db.close()
        self.sql.close()

    def client(self) -> ControlDB:
        """Another client on its own connection (one per thread)."""
        return ControlDB.connect(self.dsn)

    # -- set-up ----------------------------------------------------------------------------------
    def submit(self, n: int = 1, *, timeout_ms: int | None = None, max_attempts: int = 1,
               spec: dict[str, Any] | None = None) -> list[str]:
        ids = []
        for _ in range(n):
            run_id = new_id()
            self.db.submit(run_id, sealed=seal(run_id, spec, max_attempts), timeout_ms=timeout_ms,
                           max_attempts=max_attempts)
            ids.append(run_id)
        return ids

    def worker(self, worker_id: str = "w1", *, slots: int = 8, db: ControlDB | None = None) -> WorkerFence:
        return (db or self.db).register(worker_id, str(uuid.uuid4()), slots=slots, ql_version="0.test").worker

    def claim(self, worker: WorkerFence, n: int = 1, *, db: ControlDB | None = None,
              lease_ttl_ms: int = 30_000) -> list[ClaimedAttempt]:
        ids = [new_id() for _ in range(n)]
        result = (db or self.db).claim(worker, max_n=n, free_slots=n, executor="local", attempt_ids=ids,
                                       log_ids=[new_id() for _ in range(n)], lease_ttl_ms=lease_ttl_ms)
        assert result.answer is LeaseAnswer.OK
        return list(result.attempts)

    def running_attempt(self, worker: WorkerFence, *, started_at_ms: int = 0) -> tuple[ClaimedAttempt, LeaseFence]:
        """Claim one run and take it through start and running."""
        (claimed,) = self.claim(worker)
        fence = claimed.fence(worker)
        assert self.db.start(fence).answer is LeaseAnswer.OK
        assert self.db.running(fence, started_at_ms=started_at_ms).answer is LeaseAnswer.OK
        return claimed, fence

    def complete(self, fence: LeaseFence, exit_code: int = 0, *, finished_at_ms: int | None = None,
                 started_at_ms: int | None = None, signalled: bool = False, db: ControlDB | None = None):
        finished = self.now() if finished_at_ms is None else finished_at_ms
        digest = completion_digest(fence.attempt_id, exit_code=exit_code, started_at_ms=started_at_ms,
                                   finished_at_ms=finished, signalled=signalled)
        return (db or self.db).complete(fence, exit_code=exit_code, started_at_ms=started_at_ms,
                                        finished_at_ms=finished, signalled=signalled, completion_digest=digest)

    def expire(self, attempt_id: str) -> None:
        """Time travel for the lease alone: it expired a millisecond ago (database clock)."""
        self.sql.execute("UPDATE ql_attempt_lease SET expires_at_ms = ql__clock_ms() - 1 WHERE attempt_id = %s",
                         (attempt_id,))

    def now(self) -> int:
        return self.sql.execute("SELECT ql__clock_ms() AS t").fetchone()["t"]

    # -- inspection ------------------------------------------------------------------------------
    def run(self, run_id: str) -> dict[str, Any]:
        return self.sql.execute("SELECT * FROM ql_run WHERE id = %s", (run_id,)).fetchone()

    def attempt(self, attempt_id: str) -> dict[str, Any]:
        return self.sql.execute("SELECT * FROM ql_run_attempt WHERE id = %s", (attempt_id,)).fetchone()

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return self.sql.execute("SELECT * FROM ql_run_attempt WHERE run_id = %s ORDER BY attempt_no",
                                (run_id,)).fetchall()

    def lease(self, attempt_id: str) -> dict[str, Any] | None:
        return self.sql.execute("SELECT * FROM ql_attempt_lease WHERE attempt_id = %s", (attempt_id,)).fetchone()

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.sql.execute("SELECT * FROM ql_run_event WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall()

    def event_types(self, run_id: str) -> list[str]:
        return [e["type"] for e in self.events(run_id)]

    def state(self, run_id: str) -> tuple[Any, ...]:
        """Everything a fenced call must leave unchanged: the run (but its event counter, which an
        audit event advances), its attempts and their leases."""
        run = {k: v for k, v in self.run(run_id).items() if k != "event_seq"}
        attempts = self.attempts(run_id)
        leases = [self.lease(a["id"]) for a in attempts]
        return run, attempts, leases


def check_invariants(dsn: str) -> None:
    """What must hold in every test's database, whatever the test did."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        def none(sql: str, what: str) -> None:
            rows = conn.execute(sql).fetchall()
            assert rows == [], f"invariant broken: {what}: {rows[:5]}"

        terminal = ", ".join(f"'{s}'" for s in TERMINAL)
        terminal_events = ", ".join(f"'{e}'" for e in TERMINAL_EVENTS)
        live = ", ".join(f"'{s}'" for s in LIVE)
        none(f"SELECT run_id FROM ql_run_event WHERE type IN ({terminal_events}) GROUP BY run_id HAVING count(*) > 1",
             "more than one run.<terminal> event for a run")
        none(f"SELECT r.id FROM ql_run r WHERE r.status IN ({terminal}) AND (SELECT count(*) FROM ql_run_event e"
             f" WHERE e.run_id = r.id AND e.type = 'run.' || r.status) <> 1",
             "a terminal run without exactly one run.<its status> event")
        none(f"SELECT r.id FROM ql_run r WHERE r.status NOT IN ({terminal}) AND EXISTS (SELECT 1 FROM ql_run_event e"
             f" WHERE e.run_id = r.id AND e.type IN ({terminal_events}))",
             "an active run with a terminal event")
        # No false success: a succeeded run has exit code 0 from a succeeded attempt that its lease
        # holder completed; no attempt succeeded/failed by any other path.
        none("SELECT r.id FROM ql_run r WHERE r.status = 'succeeded' AND (r.exit_code IS DISTINCT FROM 0"
             " OR NOT EXISTS (SELECT 1 FROM ql_run_attempt a WHERE a.run_id = r.id AND a.status = 'succeeded'"
             " AND a.exit_code = 0))", "a false success")
        none("SELECT a.id FROM ql_run_attempt a JOIN ql_attempt_lease l ON l.attempt_id = a.id"
             " WHERE a.status IN ('succeeded', 'failed') AND l.end_reason IS DISTINCT FROM 'completed'",
             "an attempt ended with an exit code but not by its lease holder's completion")
        # No completion accepted from an old generation: a lease completed after its worker id was
        # registered again by another process (only the latest registration time is kept).
        none("SELECT l.attempt_id FROM ql_attempt_lease l JOIN ql_worker w ON w.id = l.worker_id"
             " WHERE l.end_reason = 'completed' AND w.generation > l.worker_generation"
             " AND w.registered_at_ms < l.ended_at_ms", "a completion accepted from an old worker generation")
        none("SELECT a.id FROM ql_run_attempt a JOIN ql_attempt_lease l ON l.attempt_id = a.id"
             " WHERE l.end_reason = 'completed' AND a.status IN ('starting', 'running')",
             "a completed lease whose attempt is still active")
        none(f"SELECT l.attempt_id FROM ql_attempt_lease l JOIN ql_run r ON r.id = l.run_id"
             f" WHERE l.status IN ({live}) AND (r.status <> 'running' OR r.current_attempt_id <> l.attempt_id)",
             "a live lease that is not its running run's current attempt")
        none(f"SELECT run_id FROM ql_attempt_lease WHERE status IN ({live}) GROUP BY run_id HAVING count(*) > 1",
             "two live leases for one run")
        none("SELECT run_id FROM ql_run_attempt WHERE status IN ('starting', 'running') GROUP BY run_id"
             " HAVING count(*) > 1", "two active attempts for one run")
        none("SELECT r.id FROM ql_run r LEFT JOIN (SELECT run_id, count(*) AS n, max(seq) AS m FROM ql_run_event"
             " GROUP BY run_id) e ON e.run_id = r.id WHERE coalesce(e.n, 0) <> r.event_seq"
             " OR coalesce(e.m, 0) <> r.event_seq", "event numbers not exactly 1..event_seq")
        none(f"SELECT s.run_id FROM ql_run_spec s JOIN ql_run r ON r.id = s.run_id WHERE r.status IN ({terminal})",
             "a spec kept after its run ended")
        none("SELECT l.attempt_id FROM ql_attempt_lease l WHERE length(l.token_digest) <> 64",
             "a lease token stored in the clear")
