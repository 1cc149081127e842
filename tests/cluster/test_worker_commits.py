"""A worker's local commits per task (issue 24): the claim's commit skips its fsync (each attempt's
fsync'd create commit carries it), and the log shipper leaves an ended attempt's empty log to the
completion that records it — with no wait, since the outbox row is in the terminal commit — even when
that completion was answered between the shipper's reads (no PostgreSQL: the real worker store, the
real ship table, one file)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ql_core.ports.journal import EventSpec, Transition


def _store(d: Path):
    from ql_core.profiles import PROFILES
    from ql_plugins.cluster_fenced.settings import ClusterSettings
    from ql_plugins.cluster_fenced.worker_store import WorkerJournal

    return WorkerJournal(d, control_url="postgresql://unused/db", settings=ClusterSettings(worker_id="w"),
                         profile=PROFILES["cluster-worker"])


def _end(store, attempt_id: str) -> None:
    store.transition(attempt_id, lambda snap: (None, Transition(
        attempt={"status": "succeeded", "exit_code": 0, "started_at_ms": 1_000, "finished_at_ms": 2_000},
        run={"status": "succeeded", "exit_code": 0, "finished_at_ms": 2_000},
        events=(EventSpec("attempt.succeeded"), EventSpec("run.succeeded")), terminal=True)))


def test_the_claim_commit_is_unsynced_and_leaves_its_connection_synchronous_full(tmp_path: Path) -> None:
    from ql_core.testing.journal import new_run
    from ql_plugins.cluster_fenced.results import LeaseFence
    from ql_plugins.cluster_fenced.ship_table import ShipTable, open_ship_table

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    store = _store(d)
    open_ship_table(d, 5000).close()  # the shipper's table (created by it, as the worker does first)
    try:
        conn = store.leases._db.connection()
        seen: list[str] = []
        store.leases._db.trace(lambda _c, sql: seen.append(sql))
        r = new_run(created_at_ms=1_000)
        fence = LeaseFence("w", 1, "s", r.attempt_id, 1, "tok")
        store.leases.insert_claimed([(fence, r.run_id)], also=lambda c: ShipTable.track_in(
            c, [(r.attempt_id, r.run_id, r.log_artifact_id, 1, "tok")]))
        # The claim committed under synchronous=NORMAL, and the connection is FULL again for every
        # later commit of this thread (a released attempt's outbox row must be durable).
        assert seen.index("PRAGMA synchronous=NORMAL") < seen.index("COMMIT") < seen.index("PRAGMA synchronous=FULL")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert store.leases.get(r.attempt_id).state == "claimed"
    finally:
        store.close()


def test_an_ended_quiet_attempt_is_left_to_its_completion_even_once_answered(tmp_path: Path) -> None:
    from ql_core.testing.journal import new_run
    from ql_plugins.cluster_fenced.log_shipper import LogShipper
    from ql_plugins.cluster_fenced.results import LeaseFence
    from ql_plugins.cluster_fenced.settings import cluster_profile
    from ql_plugins.cluster_fenced.ship_table import ShipTable, open_ship_table

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    store = _store(d)
    table = open_ship_table(d, 5000)

    def no_store():
        raise AssertionError("the artifact store was called")

    node = SimpleNamespace(journal=store, config=SimpleNamespace(data_dir=d))
    shipper = LogShipper(node, table, no_store, worker_id="w", fence=lambda: None,  # type: ignore[arg-type]
                         profile=cluster_profile(store.profile, {}))
    try:
        runs = [new_run(created_at_ms=1_000) for _ in range(3)]
        store.leases.insert_claimed(
            [(LeaseFence("w", 1, "s", r.attempt_id, 1, "tok"), r.run_id) for r in runs],
            also=lambda c: ShipTable.track_in(c, [(r.attempt_id, r.run_id, r.log_artifact_id, 1, "tok") for r in runs]))
        for r in runs:
            store.create(r)
            _end(store, r.attempt_id)
            # The outbox row is in the terminal commit: at once, no window to wait out.
            assert store.leases.get(r.attempt_id).state == "outbox"
        rows = {row.attempt_id: row for row in table.by_state("shipping")}  # the round's read
        a, b, c = (rows[r.attempt_id] for r in runs)
        attempt = store.attempt(a.attempt_id)
        # In the outbox, empty (no file at all here): the completion carries it.
        assert shipper._nothing_to_open(a, attempt)
        # Answered after the round's read, with the empty log recorded in the answers' commit: its
        # ship row is final — not opened again.
        store.leases.mark_answered_many([(a.attempt_id, "applied"), (b.attempt_id, "applied")],
                                        also=lambda conn: ShipTable.finalized_in(conn, [a.attempt_id]))
        assert shipper._nothing_to_open(a, store.attempt(a.attempt_id))
        # Answered without it (an older control database, a refusal): the shipper's again, at once.
        assert not shipper._nothing_to_open(b, store.attempt(b.attempt_id))
        # Still in the outbox: the completion's.
        assert shipper._nothing_to_open(c, store.attempt(c.attempt_id))
        assert shipper.empty_final_logs([c.attempt_id]) == {c.attempt_id: c}
        # An ended attempt's size is the recorded one (no file is opened): bytes -> the shipper's.
        store.record_log_sizes({c.log_id: 5})
        assert not shipper._nothing_to_open(c, store.attempt(c.attempt_id))
        assert shipper.empty_final_logs([c.attempt_id]) == {}
        opened: list[str] = []
        shipper._local_size = lambda log_id: opened.append(log_id) or 0  # type: ignore[method-assign]
        store.record_log_sizes({c.log_id: 0})
        assert shipper.empty_final_logs([c.attempt_id]) == {c.attempt_id: c} and opened == []
    finally:
        table.close()
        store.close()
