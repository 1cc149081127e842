"""Revision 0013: a lease's start and running are HOT updates (no index entry written), its partial
indexes hold the same rows as before (``ck_ql_lease_ended``), and the sweeper still reads them."""

from __future__ import annotations

import psycopg
import pytest

from tests.cluster.support import Cluster, completion

pytestmark = pytest.mark.postgres

#: What ql_start / ql_running (single and batched) write on a lease.
START_AND_RUNNING_COLUMNS = {"status", "started_at_ms", "running_at_ms", "version", "intent_delivered_at_ms"}
#: t_infomask2 bit of a heap-only tuple: a version written by a HOT update (access/htup_details.h).
HEAP_ONLY_TUPLE = 0x8000


def test_no_lease_index_reads_a_column_that_start_or_running_writes(cluster: Cluster) -> None:
    """Keys, expressions and predicates alike: a predicate's column blocks a HOT update too."""
    rows = cluster.sql.execute(
        "SELECT i.indexrelid::regclass::text AS name, a.attname FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum > 0 "
        " AND (a.attnum = ANY (i.indkey::int2[]) "
        "      OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M') "
        "      OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M')) "
        "WHERE i.indrelid = 'ql_attempt_lease'::regclass").fetchall()
    assert {r["name"] for r in rows} == {"ql_attempt_lease_pkey", "ux_ql_lease_generation", "ix_ql_lease_live_expiry",
                                         "ix_ql_lease_ended"}
    assert {r["attname"] for r in rows} & START_AND_RUNNING_COLUMNS == set()


def test_start_and_running_are_hot_updates_single_and_batched(cluster: Cluster) -> None:
    try:
        cluster.sql.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    except psycopg.Error as exc:  # contrib not installed on this server
        pytest.skip(f"pageinspect: {exc}")
    w = cluster.worker()
    cluster.submit(3)
    batch = [c.fence(w) for c in cluster.claim(w, 2)]
    assert {a.answer.value for a in cluster.db.start_many(batch)} == {"ok"}
    assert {a.answer.value for a in cluster.db.running_many([(f, 0) for f in batch])} == {"ok"}
    now = cluster.now()
    assert {a.answer.value for a in cluster.db.complete_many([(f, completion(f.attempt_id, finished=now))
                                                              for f in batch])} == {"applied"}
    _claimed, single = cluster.running_attempt(w)
    assert cluster.complete(single).answer.value == "applied"
    # Three leases, each inserted, started, running, ended: the started and running versions are
    # heap-only (2 per lease); the ended one is not (ended_at_ms is indexed). Three leases take a
    # fraction of one page, far below the free space that makes PostgreSQL prune it.
    flags = cluster.sql.execute(
        "SELECT p.t_infomask2 FROM generate_series(0, pg_relation_size('ql_attempt_lease') / 8192 - 1) AS b, "
        "LATERAL heap_page_items(get_raw_page('ql_attempt_lease', b::integer)) AS p "
        "WHERE p.t_infomask2 IS NOT NULL").fetchall()
    assert len(flags) == 3 * 4
    assert sum(1 for f in flags if f["t_infomask2"] & HEAP_ONLY_TUPLE) == 3 * 2
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_attempt_lease WHERE status = 'ended' "
                               "AND ended_at_ms IS NOT NULL").fetchone()["n"] == 3


def test_a_lease_is_ended_exactly_when_it_has_an_end_time(cluster: Cluster) -> None:
    """The partial indexes file leases by ended_at_ms, the functions read status: the two agree."""
    w = cluster.worker()
    cluster.submit(1)
    (claimed,) = cluster.claim(w)
    for bad in ("status = 'ended'", "ended_at_ms = 1"):
        with pytest.raises(psycopg.errors.CheckViolation, match="ck_ql_lease_ended"):
            cluster.sql.execute(f"UPDATE ql_attempt_lease SET {bad} WHERE attempt_id = %s", (claimed.attempt_id,))
    assert cluster.lease(claimed.attempt_id)["status"] == "claimed"


def test_the_sweeper_scans_its_leases_through_the_partial_indexes(cluster: Cluster) -> None:
    """The expired-lease and retention scans can be served by ix_ql_lease_live_expiry and
    ix_ql_lease_ended: with sequential scans priced out (on a table this small the planner may
    rightly prefer one), the plans use them — a query whose conditions do not imply a partial
    index's predicate could not, whatever the settings."""
    cluster.sql.execute("ALTER TABLE ql_attempt_lease SET (autovacuum_enabled = false)")
    w = cluster.worker(slots=64)
    cluster.submit(40)
    for _ in range(4):
        fences = [c.fence(w) for c in cluster.claim(w, 8)]
        cluster.db.start_many(fences)
        cluster.db.running_many([(f, 0) for f in fences])
        now = cluster.now()
        cluster.db.complete_many([(f, completion(f.attempt_id, finished=now)) for f in fences])
    live = cluster.claim(w, 8)
    cluster.expire(live[0].attempt_id)
    conn = cluster.sql
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "client_min_messages = log", "enable_seqscan = off"):
        conn.execute(f"SET {setting}")
    swept = conn.execute("SELECT * FROM ql_sweep(16, 0)").fetchone()
    conn.execute("RESET client_min_messages")
    assert swept["requeued"] == 1 and swept["leases_deleted"] == 16
    lease_scans = [p for p in plans if "FROM ql_attempt_lease l" in p and "ended_at_ms" in p]
    assert len(lease_scans) == 2, plans
    assert all("Seq Scan on ql_attempt_lease" not in p for p in lease_scans), lease_scans
    assert any("ix_ql_lease_live_expiry" in p for p in lease_scans), lease_scans
    assert any("ix_ql_lease_ended" in p for p in lease_scans), lease_scans
