"""Every statement of a round, a settle and a read is served by an index (docs/recovery.md "Cost of a round").

The statements are not listed by hand: they are collected by tracing the store while a real round
(idle, with live attempts, then purging), ``ql list``'s reads and a settle run on a data dir with
history; each is then checked with ``EXPLAIN QUERY PLAN``: no ``SCAN`` of a table, no temporary
B-tree — except the few listed in :data:`ALLOWED`, each with the exact plan step it may have and why
that step reads only work, never history. A second test counts SQLite VM instructions of an idle
round on a small and on a 30× larger history: O(work) means the same count.
"""

from __future__ import annotations

import re
import sqlite3
import time
from typing import Any

from tests.recovery.recovery_support import insert_attempts

from ql_core.reconciler import Reconciler
from ql_plugins.edge_sqlite.history_fill import fill_history

#: Plan steps that read no history, by the statement they appear in (matched by a fragment of it).
ALLOWED: dict[str, tuple[str, str]] = {
    # (The newest / oldest runs of any state are a merge of ix_ql_run_order's per-state ranges, which
    # SQLite reads in order and stops after LIMIT rows: SEARCH steps and no sort, nothing to allow.)
    # Logs created before a cutoff (0015): the sized ones come in index order; the unsized ones created
    # before it (the running logs and the sizing queue: work in flight, never history) are sorted.
    "AND a.status IN ('succeeded', 'failed', 'cancelled', 'timed_out', 'lost') ORDER BY 7, 1 LIMIT":
        ("USE TEMP B-TREE FOR ORDER BY", "sorts the unsized logs (running, or queued for sizing) only"),
    # The page of active attempts (0018): the live runs' ranges of ix_ql_run_order, their attempts
    # sorted by id — live rows only.
    "WHERE r.status_order IN (6, 7) AND a.runtime_owner =":
        ("USE TEMP B-TREE FOR ORDER BY", "sorts the active attempts of the live runs only"),
    # The deadline and dispatch steps sort their due rows: only live attempts / pending dispatches.
    "FROM ql_run_attempt a JOIN ql_run r ON r.id = a.run_id":
        ("USE TEMP B-TREE FOR ORDER BY", "sorts due deadlines of live attempts (status IN live)"),
    "FROM ql_cancel_dispatch d JOIN ql_run_attempt a":
        ("USE TEMP B-TREE FOR ORDER BY", "sorts due dispatches (state pending/term_sent)"),
    # A constant row (a scalar subquery of ql_tally), not a table.
    "FROM ql_tally": ("SCAN CONSTANT ROW", "reads one ql_tally row by key"),
}

_SKIP = ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA", "SAVEPOINT", "RELEASE", "--")


def _history_rt(rt_factory: Any, runs: int, **limits: Any) -> Any:
    rt = rt_factory("standalone", **({"page_size": 8, "pages_per_round": 2, "publish_grace_ms": 0} | limits))
    fill_history(rt.journal, runs, owner=rt.node_id, start_ms=int(time.time() * 1000) - runs - 10_000)
    return rt


def _traced(rt: Any, action: Any) -> set[str]:
    seen: set[str] = set()
    rt.journal.trace(lambda _conn, statement: seen.add(statement.strip()))
    try:
        action()
    finally:
        rt.journal.trace(None)
    return {s for s in seen if not s.upper().startswith(_SKIP)}


def _plan(conn: sqlite3.Connection, statement: str) -> list[str]:
    numbered = [int(n) for n in re.findall(r"\?(\d+)", statement)]  # ?N parameters count once each
    params = max(numbered) if numbered else statement.count("?")
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement, [None] * params)]


def _violations(statements: set[str], conn: sqlite3.Connection) -> list[str]:
    bad = []
    for statement in sorted(statements):
        for step in _plan(conn, statement):
            if not (step.startswith("SCAN") or "TEMP B-TREE" in step):
                continue
            allowed = [plan for fragment, (plan, _why) in ALLOWED.items() if fragment in statement]
            if step not in allowed:
                bad.append(f"{step}  <-  {statement}")
    return bad


def test_every_round_settle_and_list_statement_is_index_served(rt_factory, sleeper_handle: dict) -> None:
    rt = _history_rt(rt_factory, 3000, history_max_runs=2990)
    live = insert_attempts(rt, 3, handle=sleeper_handle)
    rec = Reconciler(rt.node)

    def everything() -> None:
        purging = rec.round()  # live attempts, the journal, logs, and 10+ runs over history_max_runs
        assert purging.counts["history_purged"] >= 10
        assert purging.counts["still_running"] == 3
        rec.round()  # idle apart from the live attempts
        for status in (None, "succeeded", "running"):
            for view in rt.list_runs(status=status, limit=50):
                if not view.terminal:
                    rt.settle(view)
        for run_id in (live.run_ids[0], rt.list_runs(status="succeeded", limit=1)[0].run_id):
            rt.status(run_id)  # `ql status`
            rt.events(run_id)  # `ql events`
        rt.journal.record_log_sizes({})

    statements = _traced(rt, everything)
    assert len(statements) > 15, statements  # the trace saw the round (not a vacuous pass)
    conn = sqlite3.connect(rt.journal.path)
    try:
        assert _violations(statements, conn) == []
    finally:
        conn.close()


def test_the_edge_statements_module_is_index_served_as_a_whole(rt_factory) -> None:
    """Every prebuilt statement (also the ones the traced paths above did not need today)."""
    from ql_plugins.edge_sqlite import statements as sql

    rt = rt_factory("standalone")
    statements = {getattr(sql, name) for name in sql.__all__ if isinstance(getattr(sql, name), str)
                  and getattr(sql, name).lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE"))}
    conn = sqlite3.connect(rt.journal.path)
    try:
        assert _violations(statements, conn) == []
    finally:
        conn.close()


def _round_vm_steps(rt: Any, rounds: int = 3) -> int:
    """SQLite VM instructions of ``rounds`` idle rounds (the progress handler counts every 100)."""
    rec = Reconciler(rt.node)
    rec.round()  # warm: connections opened, statements prepared
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    conn = rt.journal._db.connection()  # the round runs in this thread, on this thread's connection
    conn.set_progress_handler(tick, 100)
    try:
        for _ in range(rounds):
            report = rec.round()
            assert report.counts["history_purged"] == 0
    finally:
        conn.set_progress_handler(None, 0)
    return ticks[0] * 100


def test_an_idle_round_costs_the_same_on_a_small_and_a_30x_larger_history(rt_factory, data_dir,
                                                                           tmp_path_factory) -> None:
    from tests.recovery.recovery_support import open_runtime

    small = _history_rt(rt_factory, 500)
    big_dir = tmp_path_factory.mktemp("big")
    big = open_runtime(big_dir, "standalone", page_size=8, pages_per_round=2, publish_grace_ms=0)
    try:
        fill_history(big.journal, 15_000, owner=big.node_id, start_ms=int(time.time() * 1000) - 30_000)
        small_steps, big_steps = _round_vm_steps(small), _round_vm_steps(big)
    finally:
        big.close()
    assert small_steps > 0
    # O(history) would be ~30x; index reads grow with log(n) only (one more B-tree level at most).
    assert big_steps <= 1.5 * small_steps, (small_steps, big_steps)
