"""Retention (ADR-0007 §5, DESIGN.md §4): journal rows and quarantined receipts, bounded, on their clocks.

- a terminal journal row whose receipt is gone is purged only after ``terminal_journal_retention_s``;
- a quarantined receipt is deleted only after ``quarantine_retention_s`` (counted from the quarantine);
- both are bounded per round; rows of active or blocked attempts are never purged;
- a log file is never deleted because its receipt was consumed.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.recovery.recovery_support import (
    attempt_row,
    dead_handle,
    event_types,
    insert_attempts,
    journal_row,
    ql_json,
    statuses,
    unverifiable_handle,
    wait_until,
)

from ql_core.reconciler import Reconciler

LIMITS = dict(page_size=2, pages_per_round=2, publish_grace_ms=0, terminal_journal_retention_s=1.0,
              quarantine_retention_s=1.5)


def _rows(rt, ids) -> list[str]:  # type: ignore[no-untyped-def]
    return [i for i in ids if journal_row(rt, i) is not None]


def test_terminal_rows_without_receipt_purged_only_after_the_window(rt_factory, sleeper_handle: dict) -> None:
    rt = rt_factory(**LIMITS)
    ended = insert_attempts(rt, 10, handle=dead_handle())
    blocked = insert_attempts(rt, 2, handle=unverifiable_handle())
    active = insert_attempts(rt, 2, handle=sleeper_handle)
    Reconciler(rt.node).full_pass()
    assert set(statuses(rt, ended.run_ids).values()) == {"lost"}
    ended_at = max(attempt_row(rt, a).finished_at_ms for a in ended.attempt_ids)
    assert all(rt.node.journal.journal_entry(a).terminal_seen_at_ms is not None for a in ended.attempt_ids)

    # Inside the window (the same rows, seen by a runtime whose window is an hour): nothing is purged.
    patient = rt_factory(**(LIMITS | {"terminal_journal_retention_s": 3600.0}))
    report, _ = Reconciler(patient.node).full_pass()
    assert report.counts["journal_purged"] == 0
    assert len(_rows(rt, ended.attempt_ids)) == 10

    wait_until(lambda: time.time() * 1000 - ended_at > 1100, timeout=5, message="the retention window")
    rec = Reconciler(rt.node)
    first = rec.round()
    assert 0 < first.counts["journal_purged"] <= 4  # bounded by pages × page size
    rec.full_pass()
    assert _rows(rt, ended.attempt_ids) == []
    # Blocked and active attempts keep their rows: their receipts may still come.
    assert _rows(rt, blocked.attempt_ids) == blocked.attempt_ids
    assert _rows(rt, active.attempt_ids) == active.attempt_ids


def test_leftover_receipt_of_an_ended_attempt_is_replayed_not_purged(rt_factory) -> None:
    from tests.recovery.recovery_support import publish_receipt

    rt = rt_factory(**LIMITS)
    ended = insert_attempts(rt, 1, handle=dead_handle())
    Reconciler(rt.node).full_pass()
    attempt_id, run_id = ended.attempt_ids[0], ended.run_ids[0]
    assert rt.status(run_id).status == "lost"
    # A true receipt turns up late (after `lost` was committed): recorded, never changes the outcome.
    publish_receipt(rt, ended, attempt_id, exit_code=0)
    time.sleep(1.1)
    report, _ = Reconciler(rt.node).full_pass()
    assert report.counts["already_terminal"] == 1 and report.counts["journal_purged"] == 0
    assert not rt.receipts.exists(attempt_id)
    assert rt.status(run_id).status == "lost"
    assert event_types(rt, run_id).count("attempt.late_callback_ignored") == 1
    # Its row goes by retention, after the receipt was seen missing.
    Reconciler(rt.node).full_pass()
    assert journal_row(rt, attempt_id) is None


def _quarantine_bad_receipts(rt, inserted) -> None:  # type: ignore[no-untyped-def]
    from tests.recovery.recovery_support import publish_receipt

    for attempt_id in inserted.attempt_ids:
        good = inserted.tokens[attempt_id]
        inserted.tokens[attempt_id] = "x" * 43  # a wrong token: a deterministic rejection
        publish_receipt(rt, inserted, attempt_id, exit_code=0)
        inserted.tokens[attempt_id] = good


def test_quarantined_receipts_deleted_only_after_their_window(rt_factory, sleeper_handle: dict) -> None:
    from tests.recovery.recovery_support import publish_receipt

    rt = rt_factory(**LIMITS)
    inserted = insert_attempts(rt, 6, handle=sleeper_handle)
    _quarantine_bad_receipts(rt, inserted)
    report, _ = Reconciler(rt.node).full_pass()
    assert report.counts["quarantined"] == 6
    quarantined_at = max(journal_row(rt, a).updated_at_ms for a in inserted.attempt_ids)
    assert all(journal_row(rt, a).state == "quarantined" for a in inserted.attempt_ids)
    assert all(rt.receipts.quarantined_exists(a) for a in inserted.attempt_ids)
    assert set(statuses(rt, inserted.run_ids).values()) == {"running"}  # a bad receipt proves nothing

    # Two of them finish for real: their valid receipts win; their quarantined copies stay on the clock.
    for attempt_id in inserted.attempt_ids[:2]:
        publish_receipt(rt, inserted, attempt_id, exit_code=0)
    patient = rt_factory(**(LIMITS | {"quarantine_retention_s": 3600.0}))
    report, _ = Reconciler(patient.node).full_pass()
    assert report.counts["applied"] == 2
    assert [rt.status(r).status for r in inserted.run_ids[:2]] == ["succeeded", "succeeded"]
    # Inside the window nothing is purged, whether the attempt ended or not.
    assert report.counts["quarantine_purged"] == 0
    assert all(rt.receipts.quarantined_exists(a) for a in inserted.attempt_ids)
    assert all(journal_row(rt, a).state == "quarantined" for a in inserted.attempt_ids)

    wait_until(lambda: time.time() * 1000 - quarantined_at > 1600, timeout=5, message="the quarantine window")
    rec = Reconciler(rt.node)
    first = rec.round()
    assert 0 < first.counts["quarantine_purged"] <= 4  # bounded per round
    rec.full_pass()
    assert not any(rt.receipts.quarantined_exists(a) for a in inserted.attempt_ids)
    # Ended attempts: the row went with the copy. Active ones: back to pending, still indexed.
    assert _rows(rt, inserted.attempt_ids[:2]) == []
    assert all(journal_row(rt, a).state == "pending" for a in inserted.attempt_ids[2:])
    # And a valid receipt still completes such an attempt afterwards.
    publish_receipt(rt, inserted, inserted.attempt_ids[2], exit_code=4)
    Reconciler(rt.node).full_pass()
    assert (rt.status(inserted.run_ids[2]).status, rt.status(inserted.run_ids[2]).exit_code) == ("failed", 4)


def test_logs_survive_receipt_consumption_and_retention(data_dir: Path, ql_env: dict[str, str], tmp_path: Path,
                                                        rt_factory) -> None:
    from tests.recovery.recovery_support import write_config

    config = write_config(tmp_path / "ql.toml", terminal_journal_retention_s=0.0, quarantine_retention_s=0.0)
    live = ql_json(["run", "--", "sh", "-c", "echo live-path"], ql_env, config=config)[-1]
    (detached,) = ql_json(["run", "--detach", "--", "sh", "-c", "echo recovered-path"], ql_env, config=config)
    rt = rt_factory(terminal_journal_retention_s=0.0, quarantine_retention_s=0.0)
    wait_until(lambda: rt.receipts.exists(detached["attempt_id"]), timeout=10, message="the receipt")
    for _ in range(3):
        ql_json(["reconcile"], ql_env, config=config)
    assert rt.status(live["run_id"]).status == "succeeded"
    assert rt.status(detached["run_id"]).status == "succeeded"
    assert not rt.receipts.exists(detached["attempt_id"])  # consumed and deleted after its commit
    # Every receipt consumed, every retention window (0 s) over: both logs are still there.
    assert rt.log_path(live["run_id"]).read_bytes() == b"live-path\n"
    assert rt.log_path(detached["run_id"]).read_bytes() == b"recovered-path\n"
    from tests.recovery.recovery_support import count_rows

    assert count_rows(rt, "ql_log_artifact", "deleted_at_ms IS NOT NULL") == 0
    assert count_rows(rt, "ql_receipt_journal") == 0


def test_another_node_never_ages_or_purges_our_journal_rows(tmp_path: Path) -> None:
    """Two nodes, one shared run database: a node's journal pass only ever judges its own rows.

    (Node B's receipts live in B's data dir; A cannot see them, so A must not call them missing.)
    """
    from tests.recovery.recovery_support import open_runtime, publish_receipt

    dir_a, dir_b = tmp_path / "node-a", tmp_path / "node-b"
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    rt_b = open_runtime(dir_b, database_url=url, **LIMITS)
    rt_a = open_runtime(dir_a, database_url=url, **(LIMITS | {"terminal_journal_retention_s": 0.0,
                                                              "quarantine_retention_s": 0.0}))
    try:
        assert rt_a.node_id != rt_b.node_id
        ended = insert_attempts(rt_b, 3, handle=dead_handle())
        Reconciler(rt_b.node).full_pass()
        assert set(statuses(rt_b, ended.run_ids).values()) == {"lost"}
        # B left a late receipt behind (B crashed before cleaning it).
        publish_receipt(rt_b, ended, ended.attempt_ids[0], exit_code=0)
        report, _ = Reconciler(rt_a.node).full_pass()
        assert report.journal_touched == 0 and report.counts["journal_purged"] == 0
        assert _rows(rt_b, ended.attempt_ids) == ended.attempt_ids
        # B's own pass replays its receipt and keeps its rows on B's clock.
        again, _ = Reconciler(rt_b.node).full_pass()
        assert again.counts["already_terminal"] == 1
        assert not rt_b.receipts.exists(ended.attempt_ids[0])
    finally:
        rt_a.close()
        rt_b.close()


# -- history retention at the host's own task rate (docs/recovery.md "History retention") -------------


def _run_count(rt) -> int:  # type: ignore[no-untyped-def]
    from tests.recovery.recovery_support import count_rows

    return count_rows(rt, "ql_run")


def test_history_max_runs_holds_under_a_continuous_load_of_tasks(rt_factory) -> None:
    """500 `true` tasks as fast as this host goes, a supervisor running beside them; then one round:
    exactly ``history_max_runs`` runs are left (the newest), and the tally agrees with a COUNT."""
    from tests.recovery.recovery_support import count_rows

    rt = rt_factory("standalone", history_max_runs=50, scan_interval_s=0.2, publish_grace_ms=0,
                    retention_budget_ms=60_000)
    supervisor = rt.supervisor()
    supervisor.start()
    runs = []
    try:
        for i in range(500):  # every 10th prints (a `true` leaves no log file: docs/logs.md)
            runs.append(rt.run(["sh", "-c", "echo x"] if i % 10 == 9 else ["true"]).run_id)
    finally:
        assert supervisor.stop(drain_s=60)
    assert supervisor.failures == 0
    report = Reconciler(rt.node).round()
    assert "retention_more" not in report.counts
    left = [r for r in runs if rt.journal.view(r) is not None]
    # Beyond the newest 50, only runs whose receipt may still exist are kept (the journal row goes
    # first, docs/recovery.md): on a loaded machine a launcher that saw no acknowledgement in time
    # publishes its receipt, and that run's row waits for terminal_journal_retention_s.
    held = [r for r in left if r not in runs[-50:]]
    assert all(journal_row(rt, rt.journal.view(r).attempts[-1].attempt_id) is not None for r in held), held
    assert left == sorted(held, key=runs.index) + runs[-50:]
    kept = 50 + len(held)  # a held run keeps its attempt, log row and events with it
    assert _run_count(rt) == kept
    assert count_rows(rt, "ql_run_attempt") == count_rows(rt, "ql_log_artifact") == kept
    newest = runs[-50:]
    assert count_rows(rt, "ql_run_event", f"run_id IN ({','.join('?' * len(newest))})", newest) == 50 * 4
    assert count_rows(rt, "ql_run_event", f"run_id NOT IN ({','.join('?' * len(left))})", left) == 0
    assert dbview_tally(rt, "runs") == kept
    logs = list((Path(rt.config.data_dir) / "logs").rglob("*.log"))
    # The 5 newest runs that printed keep their files (and a held run that printed, its own); every
    # forgotten run's file went with it (files first, then rows); the empty logs of `true` were
    # removed at their ends.
    assert len(logs) == 5 + sum(1 for r in held if runs.index(r) % 10 == 9)


def dbview_tally(rt, name: str) -> int:  # type: ignore[no-untyped-def]
    from tests import dbview

    return int(dbview.rows(rt, "SELECT value FROM ql_tally WHERE name = ?", (name,))[0]["value"])


def test_a_purge_backlog_drains_in_budgeted_pages(rt_factory) -> None:
    """A backlog bigger than one page: a round purges page after page (one transaction each) until its
    budget is spent, says ``retention_more`` when it stopped with work left, and rounds drain it all."""
    from ql_plugins.edge_sqlite.history_fill import fill_history

    start = int(time.time() * 1000) - 10_000
    # A generous budget: one round purges the whole backlog, page by page (not a count cap).
    rt = rt_factory("standalone", page_size=4, pages_per_round=1, history_max_runs=10, retention_budget_ms=60_000)
    fill_history(rt.journal, 100, owner=rt.node_id, start_ms=start)
    deletes: list[str] = []
    rt.journal.trace(lambda _c, s: deletes.append(s) if s.startswith("DELETE FROM ql_run WHERE") else None)
    whole = Reconciler(rt.node).round()
    rt.journal.trace(None)
    assert whole.counts["history_purged"] == 90 and "retention_more" not in whole.counts
    assert len(set(deletes)) == 90  # every run by its key, in pages of 4 (one transaction per page)
    assert _run_count(rt) == 10 == dbview_tally(rt, "runs")

    # The smallest budget (10 ms) and a backlog no host purges in 10 ms: at least one page, then it
    # stops and says so; the rounds that follow drain the rest.
    tight = rt_factory("standalone", page_size=4, pages_per_round=1, history_max_runs=10, retention_budget_ms=10)
    fill_history(tight.journal, 3000, owner=tight.node_id, start_ms=start + 1000)
    rec = Reconciler(tight.node)
    first = rec.round()
    assert 4 <= first.counts["history_purged"] < 3000
    assert first.counts["retention_more"] == 1
    for _ in range(10_000):
        if "retention_more" not in rec.round().counts:
            break
    assert _run_count(tight) == 10 == dbview_tally(tight, "runs")


def test_upgrade_of_a_data_dir_made_before_0007_keeps_every_run(tmp_path: Path) -> None:
    """A run database at revision 0006 (today's schema before this change) with history, logs and
    a live run: first use upgrades it in place; every run is kept and the tallies are exact."""
    import sqlite3

    from ql_core.db.engine import create_db_engine
    from ql_core.db.migrate import SCHEMA_HEAD, current_revision
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = data / "ql.db"
    engine = create_db_engine(f"sqlite:///{db}")
    from alembic import command

    from ql_core.db.migrate import alembic_config

    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0006_artifacts")
    assert current_revision(engine) == "0006_artifacts"
    engine.dispose()
    conn = sqlite3.connect(db)
    now = int(time.time() * 1000)
    for i in range(20):
        status = "running" if i == 19 else "succeeded"
        conn.execute("INSERT INTO ql_run (id, status, version, event_seq, created_at_ms, updated_at_ms, "
                     "max_attempts) VALUES (?, ?, 1, 1, ?, ?, 1)", (f"run-{i:02d}", status, now + i, now + i))
        conn.execute("INSERT INTO ql_run_attempt (id, run_id, attempt_no, executor, runtime_owner, status, "
                     "log_artifact_id, callback_token_hash, callback_sequence, created_at_ms, version) "
                     "VALUES (?, ?, 1, 'local', 'node-x', ?, ?, 'h', 0, ?, 1)",
                     (f"att-{i:02d}", f"run-{i:02d}", status, f"log-{i:02d}", now + i))
        conn.execute("INSERT INTO ql_log_artifact (id, run_id, attempt_id, relative_path, max_bytes, size_bytes, "
                     "truncated, created_at_ms) VALUES (?, ?, ?, 'x', 1000, ?, 0, ?)",
                     (f"log-{i:02d}", f"run-{i:02d}", f"att-{i:02d}", None if i == 19 else 100 + i, now + i))
    conn.commit()
    conn.close()

    from ql_plugins.edge_sqlite.store import SqliteJournal

    store = SqliteJournal(f"sqlite:///{db}")  # first use: migrates to head
    try:
        engine = create_db_engine(f"sqlite:///{db}")
        assert current_revision(engine) == SCHEMA_HEAD
        engine.dispose()
        assert len(store.list_views(status=None, limit=100)) == 20
        assert [v.run_id for v in store.list_views(status="running", limit=10)] == ["run-19"]
        assert store.ended_log_bytes("node-x") == sum(100 + i for i in range(19))
        tallies = dict(sqlite3.connect(db).execute("SELECT name, value FROM ql_tally").fetchall())
        assert tallies == {"runs": 20, "log_bytes:node-x": sum(100 + i for i in range(19))}
        assert [f.id for f in store.page_live_logs("node-x", "", 10)] == ["log-19"]
    finally:
        store.close()
