"""The worker's local store writes a claimed attempt's lease steps inside the local commits they
follow (ql_plugins/cluster_fenced/worker_local.py): one commit each, all or nothing (no PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: A child that opens the worker store in DATA, records a claim, then creates the local run and (with
#: END) ends it — dying at the crash point its environment names.
CHILD = r"""
import sys
from pathlib import Path
from ql_core.ports.journal import EventSpec, Transition
from ql_core.profiles import PROFILES
from ql_core.testing.journal import new_run
from ql_plugins.cluster_fenced.results import LeaseFence
from ql_plugins.cluster_fenced.settings import ClusterSettings
from ql_plugins.cluster_fenced.worker_store import WorkerJournal

store = WorkerJournal(Path(sys.argv[1]), control_url="postgresql://unused/db", settings=ClusterSettings(worker_id="w"),
                      profile=PROFILES["cluster-worker"])
r = new_run(created_at_ms=1_000)
print(r.run_id, r.attempt_id, flush=True)
store.leases.insert_claimed([(LeaseFence("w", 1, "s", r.attempt_id, 1, "tok"), r.run_id)])
store.create(r)
if sys.argv[2] == "end":
    store.transition(r.attempt_id, lambda snap: (None, Transition(
        attempt={"status": "failed", "exit_code": 3, "started_at_ms": 1_000, "finished_at_ms": 2_000},
        run={"status": "failed", "exit_code": 3, "finished_at_ms": 2_000},
        events=(EventSpec("attempt.failed"), EventSpec("run.failed")), terminal=True,
        crash_point="completion.before_commit")))
store.close()
"""


def _store(d: Path):  # noqa: ANN202 - test helper
    from ql_core.profiles import PROFILES
    from ql_plugins.cluster_fenced.settings import ClusterSettings
    from ql_plugins.cluster_fenced.worker_store import WorkerJournal

    return WorkerJournal(d, control_url="postgresql://unused/db", settings=ClusterSettings(worker_id="w"),
                         profile=PROFILES["cluster-worker"])


def _child(d: Path, step: str, crash: str | None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    if crash:
        env["QL_CRASH_POINT"] = crash
    done = subprocess.run([sys.executable, "-c", CHILD, str(d), step], env=env, capture_output=True, text=True,
                          timeout=120)
    run_id, attempt_id = done.stdout.split()[:2]
    return done.returncode, run_id, attempt_id


def test_create_and_terminal_commits_carry_the_lease_steps(tmp_path: Path) -> None:
    from ql_core.ports.journal import EventSpec, Transition
    from ql_core.testing.journal import new_run
    from ql_plugins.cluster_fenced.results import LeaseFence

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    store = _store(d)
    woken: list[str] = []
    store.on_outbox = woken.append
    commits: list[str] = []
    try:
        r = new_run(created_at_ms=1_000)
        store.leases.insert_claimed([(LeaseFence("w", 1, "s", r.attempt_id, 1, "tok"), r.run_id)])
        for conns in (store.local.connections, store.leases._db):  # noqa: SLF001 - the test counts commits
            conns.trace(lambda _conn, sql: commits.append(sql) if sql == "COMMIT" else None)
        store.create(r)
        assert store.leases.get(r.attempt_id).state == "launching"
        assert len(commits) == 1  # the local create and `launching`: one commit
        store.transition(r.attempt_id, lambda snap: (None, Transition(
            attempt={"status": "failed", "exit_code": 3, "started_at_ms": 1_000, "finished_at_ms": 2_000},
            run={"status": "failed", "exit_code": 3, "finished_at_ms": 2_000},
            events=(EventSpec("attempt.failed"), EventSpec("run.failed")), terminal=True)))
        row = store.leases.get(r.attempt_id)
        assert (row.state, row.kind, row.exit_code) == ("outbox", "complete", 3)
        assert row.digest and row.finished_at_ms == 2_000
        assert len(commits) == 2  # the terminal transition and its outbox row: one commit
        assert woken == [r.attempt_id]  # and the sender was woken, once, after it
        store.rebuild_outbox()  # nothing left to rebuild: the payload is fixed once
        assert woken == [r.attempt_id] and store.leases.get(r.attempt_id).digest == row.digest
    finally:
        store.close()


@pytest.mark.parametrize(("step", "crash", "lease_state", "local_status"), [
    ("create", "create.before_commit", "claimed", None),        # neither: released on restart
    ("create", None, "launching", "starting"),                  # both
    ("end", "worker.outbox.before_insert", "launching", "starting"),  # neither: the receipt replays it
    ("end", "completion.before_commit", "launching", "starting"),
    ("end", None, "outbox", "failed"),                          # both
])
def test_a_kill_leaves_both_rows_or_neither(tmp_path: Path, step: str, crash: str | None, lease_state: str,
                                            local_status: str | None) -> None:
    from ql_core.crashpoints import CRASH_EXIT_CODE

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    code, run_id, attempt_id = _child(d, step, crash)
    assert code == (CRASH_EXIT_CODE if crash else 0)
    store = _store(d)
    try:
        assert store.leases.get(attempt_id).state == lease_state
        attempt = store.local.attempt(attempt_id)
        assert (attempt.status if attempt else None) == local_status
        if lease_state == "outbox":
            assert store.leases.get(attempt_id).kind == "complete"
    finally:
        store.close()


@pytest.mark.parametrize("ending", ["exit 3", "exit 0 after a stop", "cancelled, TERM sent", "cancelled, no TERM yet",
                                    "another attempt's TERM", "lost"])
def test_the_terminal_commits_payload_is_the_one_its_rows_give(tmp_path: Path, ending: str) -> None:
    """The outbox payload written in the terminal commit is built from what the transition read and
    applied (no read of its own): it equals :func:`build_payload` of the rows read after the commit
    — the attempt as it ended and the run's cancel dispatch (whether ql signalled this attempt)."""
    from ql_core.ports.journal import EventSpec, Transition
    from ql_core.records import NewDispatch
    from ql_core.testing.journal import new_run
    from ql_plugins.cluster_fenced.outbox import SELF_FENCED, Payload, build_payload, signalled_by
    from ql_plugins.cluster_fenced.results import LeaseFence

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    store = _store(d)
    try:
        r = new_run(created_at_ms=1_000)
        store.leases.insert_claimed([(LeaseFence("w", 1, "s", r.attempt_id, 1, "tok"), r.run_id)])
        store.create(r)
        cancelled = ending.startswith(("cancelled", "another"))
        if cancelled:  # a cancel intent delivered: the dispatch record, then (maybe) its TERM
            store.transition(r.attempt_id, lambda snap: (None, Transition(
                dispatch=NewDispatch(attempt_id=r.attempt_id if ending != "another attempt's TERM" else "other",
                                     reason="cancel", due_at_ms=0))))
            if ending != "cancelled, no TERM yet":
                claim = store.local.claim_dispatch(r.run_id, "w", 5_000)
                assert claim is not None
                assert store.local.finish_dispatch(claim, {"state": "term_sent", "term_sent_at_ms": 1_500})
        if ending == "exit 0 after a stop":  # the worker stopped it itself, later than it ended
            store.leases.mark_stopped(r.attempt_id, SELF_FENCED, stopped_at_ms=2_500, not_before_ms=None)
        before = store.leases.get(r.attempt_id)
        status, code = {"exit 3": ("failed", 3), "exit 0 after a stop": ("succeeded", 0),
                        "lost": ("lost", None)}.get(ending, ("cancelled", 143))
        attempt = {"status": status, "exit_code": code, "started_at_ms": 1_000, "finished_at_ms": 2_000,
                   "reason": "cancelled" if cancelled else ("orphaned" if code is None else None)}
        store.transition(r.attempt_id, lambda snap: (None, Transition(
            attempt=attempt, run={"status": status, "exit_code": code, "finished_at_ms": 2_000},
            events=(EventSpec(f"attempt.{status}"), EventSpec(f"run.{status}")), terminal=True)))
        ended = store.local.attempt(r.attempt_id)
        assert (ended.status, ended.exit_code) == (status, code)
        expected = build_payload(ended, signalled_by(store.local.dispatch(r.run_id), r.attempt_id), before,
                                 store.clock)
        assert expected.signalled is (ending in ("cancelled, TERM sent",))
        row = store.leases.get(r.attempt_id)
        assert row.state == "outbox"
        written = Payload(row.kind, exit_code=row.exit_code, started_at_ms=row.started_at_ms,
                          finished_at_ms=row.finished_at_ms, signalled=bool(row.signalled), reason=row.reason,
                          digest=row.digest)
        assert written == expected
    finally:
        store.close()
