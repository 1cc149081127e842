"""PostgreSQL failover under a running cluster: a primary and its streaming replica on this machine
(tests/cluster/pg_pair.py), real ``ql control`` and ``ql worker`` processes and a submitter all
given ONE multi-host URL (``host1,host2 … target_session_attrs=read-write``), a burst being
submitted while workers run tasks — then the primary's host is lost (SIGKILL, every process of it)
and the replica is promoted. Nobody is told: libpq finds the new primary on the next connect.

- ``sync``: the replica is a synchronous standby (``synchronous_commit = remote_apply``). Nothing is
  lost: every submit that was answered has its run, and every run ends exactly once with the exit
  code its task really had.
- ``async``: the replica is cut off from the primary's WAL (``primary_conninfo = ''``) a moment
  before the failover, so the primary's last commits (submits, claims, starts, renewals,
  completions) never reach it — the new primary has rolled them back. What was rolled back is
  fenced: a worker holding an attempt the new primary never granted learns ``fenced`` on its next
  call and stops it; a run the new primary still shows running ends with its true result or
  ``lost`` (its lease expires), never twice, never with an exit code no task had.

Each run's expected exit code is in its name (``f<i>t<try>-x<code>``), so even a run whose submit answer
was lost (the submitter saw an error, the run exists) is checked.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from tests.cluster.pg_pair import PgPair, pg_pair
from tests.cluster.support import check_invariants
from tests.cluster.worker_support import FAST_LIMITS, Harness, check_workers, wait_for
from tests.postgres_server import Unavailable

pytestmark = pytest.mark.postgres

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
#: Leases long enough to ride out a failover (kill + promote + reconnect take seconds on a loaded
#: machine); everything else as fast as the other worker tests.
LIMITS = {**FAST_LIMITS, "run_lease_s": 20.0, "fence_margin_s": 2.0, "session_lease_s": 30.0,
          "heartbeat_interval_s": 1.0, "control_call_timeout_s": 2.0}
EXIT_CODES = (0, 0, 1, 0, 3)
SETTLE_S = 180.0


@pytest.fixture
def pair() -> Iterator[PgPair]:
    """A fresh primary + streaming replica, the ql control schema installed on the primary."""
    try:
        with pg_pair() as p:
            from ql_core.db.engine import create_db_engine
            from ql_core.db.migrate import upgrade

            engine = create_db_engine(p.primary.conninfo.replace("postgresql://", "postgresql+psycopg://"))
            try:
                upgrade(engine)
            finally:
                engine.dispose()
            yield p
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {exc}")
        pytest.skip(str(exc))


def expected_code(name: str) -> int:
    return int(name.rsplit("-x", 1)[1])


@dataclass
class Submitter:
    """A burst through the control node's embedding API, one run every ``pace_s``, in a thread of
    its own (its own Runtime: the run store's connections are per thread): at least ``n`` runs, and
    on until :meth:`finish` (at most ``MAX_FACTOR * n``). A submit that raised is tried again under a
    new name: the failed one may or may not exist."""

    MAX_FACTOR = 20

    h: Harness
    n: int
    pace_s: float
    ok: dict[str, tuple[str, float]] = field(default_factory=dict)  # run id -> (name, answered at)
    errors: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    finishing: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="failover-submitter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ql_core.config import load_config
        from ql_core.runtime import Runtime

        rt = Runtime.open(load_config(config_path=self.h.control_config(), environ={}, cwd=self.h.root))
        try:
            for i in range(self.n * self.MAX_FACTOR):
                if i >= self.n and self.finishing.is_set():
                    break
                code = EXIT_CODES[i % len(EXIT_CODES)]
                script = f"sleep 0.{2 + i % 8}; exit {code}" if i % 4 else f"sleep 2; exit {code}"
                for attempt in range(400):
                    name = f"f{i}t{attempt}-x{code}"
                    try:
                        run_id = rt.submit(["sh", "-c", script], name=name).run_id
                    except Exception as exc:  # noqa: BLE001 - the failover window: the next try
                        with self.lock:
                            self.errors.append(type(exc).__name__)
                        time.sleep(0.25)
                        continue
                    with self.lock:
                        self.ok[run_id] = (name, time.monotonic())
                    break
                else:
                    raise AssertionError(f"submit {i} failed 400 times: {self.errors[-3:]}")
                time.sleep(self.pace_s)
        finally:
            rt.close()
            self.done.set()

    def answered(self) -> dict[str, tuple[str, float]]:
        with self.lock:
            return dict(self.ok)

    def answered_after(self, since: float) -> int:
        return sum(1 for _name, at in self.answered().values() if at > since)

    def join(self) -> None:
        assert self._thread is not None
        self.finishing.set()
        self._thread.join(SETTLE_S)
        assert self.done.is_set(), "the submitter did not finish"


def rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One query on a fresh connection to whichever host is the primary now (a poll never holds a
    connection across the failover)."""
    with closing(psycopg.connect(url, autocommit=True, connect_timeout=5)) as conn:
        return conn.execute(sql, params).fetchall()


def maybe_rows(url: str, sql: str) -> list[tuple[Any, ...]] | None:
    try:
        return rows(url, sql)
    except psycopg.OperationalError:
        return None  # between the kill and the promote no host takes writes


def count(url: str, sql: str) -> int:
    got = maybe_rows(url, sql)
    return -1 if got is None else int(got[0][0])


def local_attempts(h: Harness) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every attempt any worker holds or held: attempt id -> (worker, its local lease row)."""
    return {r["attempt_id"]: (name, r) for name in h.worker_dirs for r in h.lease_rows(name)}


def run_failover(pair: PgPair, root: Path, *, synchronous: bool, n: int, workers: int, slots: int,
                 pace_s: float, outage_s: float) -> dict[str, Any]:
    if synchronous:
        pair.make_synchronous()
    url = pair.url
    h = Harness(url, root, limits=dict(LIMITS))
    submitter = Submitter(h, n, pace_s)
    stats: dict[str, Any] = {}
    try:
        h.start_control()
        procs = [h.start_worker(f"w{i}", slots=slots) for i in range(workers)]
        wait_for(lambda: count(url, "SELECT count(*) FROM ql_worker") == workers, what="every worker registered",
                 timeout=SETTLE_S, every=0.2, diagnose=h.logs)
        submitter.start()
        # Fail over while tasks run and the burst is still being submitted.
        wait_for(lambda: len(submitter.answered()) >= n // 3
                 and count(url, "SELECT count(*) FROM ql_run_attempt WHERE status = 'running'") >= 2,
                 what="a third of the burst submitted and tasks running", timeout=SETTLE_S, every=0.1,
                 diagnose=h.logs)
        durable: set[str] = set()
        if not synchronous:
            # Everything answered up to here has reached the replica; what comes after the cut is lost.
            durable = set(submitter.answered())
            lsn = pair.primary.value("SELECT pg_current_wal_lsn()")
            wait_for(lambda: pair.primary.value("SELECT replay_lsn >= %s::pg_lsn FROM pg_stat_replication",
                                                (str(lsn),)), what="the replica to replay what was answered",
                     timeout=SETTLE_S, every=0.05)
            started = time.monotonic()
            pair.cut_replication()
            cut_at = time.monotonic()
            stats["cut_s"] = round(cut_at - started, 2)
            attempts_at_cut = count(url, "SELECT count(*) FROM ql_run_attempt")
            # Commits the replica will never see: submits, and claims of tasks that then run.
            wait_for(lambda: submitter.answered_after(cut_at) >= 3
                     and count(url, "SELECT count(*) FROM ql_run_attempt") >= attempts_at_cut + 2,
                     what="submits and claims after the cut", timeout=SETTLE_S, every=0.05, diagnose=h.logs)
        else:
            durable = set(submitter.answered())
        failed_over_at = time.monotonic()
        # Not the time of the kill: an answer the old primary sent just before it died can be
        # recorded by its worker a little later (a loaded machine) — but never after the promotion.
        old_primary_until_ms = pair.fail_over(outage_s)
        promoted_at = time.monotonic()
        stats["failover_s"] = round(promoted_at - failed_over_at, 2)
        # The burst goes on against the new primary, then ends.
        wait_for(lambda: submitter.answered_after(promoted_at) >= 3 or submitter.done.is_set(),
                 what="submits after the failover", timeout=SETTLE_S, every=0.05, diagnose=h.logs)
        submitter.join()
        answered = submitter.answered()
        if synchronous:
            durable = set(answered)
        wait_for(lambda: count(url, f"SELECT count(*) FROM ql_run WHERE status NOT IN {TERMINAL!r}") == 0,
                 what="every run on the new primary to end", timeout=SETTLE_S, every=0.2, diagnose=h.logs)
        # The workers stop what the new primary never granted (or no longer grants) and settle it.
        wait_for(lambda: all(r["state"] == "answered" for _w, r in local_attempts(h).values()),
                 what="every worker-local attempt answered",
                 timeout=SETTLE_S, every=0.2,
                 diagnose=lambda: h.logs() + "\n" + repr([(a, r["state"], r["stop_reason"], r["answer"])
                                                          for a, (_w, r) in local_attempts(h).items()
                                                          if r["state"] != "answered"]))
        assert all(p.alive() for p in procs), f"a worker died in the failover\n{h.logs()}"

        # -- every run ends exactly once, with its true result (or lost, where the database lost it) --
        runs = {r[0]: r[1:] for r in rows(url, "SELECT id, name, status, exit_code FROM ql_run")}
        missing = set(answered) - set(runs)
        assert not (missing & durable), f"answered submits lost although they had reached the replica: " \
                                        f"{sorted(missing & durable)[:5]}"
        outcomes: dict[str, int] = {}
        for run_id, (name, status, exit_code) in runs.items():
            code = expected_code(name)
            true = "succeeded" if code == 0 else "failed"
            outcomes[status] = outcomes.get(status, 0) + 1
            allowed = (true,) if synchronous else (true, "lost")
            assert status in allowed, (run_id, name, status, exit_code)
            if status == true:
                assert exit_code == code, (run_id, name, status, exit_code)
        per_run = rows(url, "SELECT run_id, count(*) FROM ql_run_attempt WHERE status IN ('succeeded', 'failed') "
                            "GROUP BY run_id HAVING count(*) > 1")
        assert per_run == [], f"a run completed by two attempts: {per_run[:5]}"

        # -- what the new primary never granted was fenced, never reported -------------------------------
        granted = {r[0] for r in rows(url, "SELECT id FROM ql_run_attempt")}
        rolled_back = {a: v for a, v in local_attempts(h).items() if a not in granted}
        # Each was answered `fenced` by the new primary, or answered by the old one before it died
        # (a claim and its completion both in the lost window: the rollback took the answer back too).
        fenced = {a for a, (_w, row) in rolled_back.items() if row["answer"] == "fenced"}
        for attempt_id, (worker, row) in rolled_back.items():
            assert attempt_id in fenced or row["answered_at_ms"] <= old_primary_until_ms, \
                (worker, attempt_id, row["answer"], row["stop_reason"], row["answered_at_ms"], old_primary_until_ms)
        if synchronous:
            assert not missing and not rolled_back and outcomes.get("lost", 0) == 0, \
                (missing, sorted(rolled_back), outcomes)
        else:
            assert missing, "no answered submit was lost: the cut did not lose the primary's last commits"
        stats.update(runs=len(runs), answered=len(answered), submit_errors=len(submitter.errors),
                     lost_submits=len(missing), rolled_back_attempts=len(rolled_back), rolled_back_fenced=len(fenced),
                     outcomes=outcomes)
        # The CLI on the control node reads through the same multi-host URL.
        some = next(iter(runs))
        status = h.ql("status", some)
        assert status.returncode == 0, status.stderr
        h.stop_all()
        check_workers(h)
        check_invariants(url)
        return stats
    finally:
        h.stop_all()
        if h._sql is not None:
            h._sql.close()
        print(f"failover {'sync' if synchronous else 'async'}: {stats}")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failover(pair: PgPair, tmp_path: Path, mode: str) -> None:
    run_failover(pair, tmp_path, synchronous=mode == "sync", n=36, workers=2, slots=3, pace_s=0.1, outage_s=3.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failover_large_burst(pair: PgPair, tmp_path: Path, mode: str) -> None:
    run_failover(pair, tmp_path, synchronous=mode == "sync", n=300, workers=4, slots=4, pace_s=0.01, outage_s=6.0)

