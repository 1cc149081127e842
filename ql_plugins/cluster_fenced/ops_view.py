"""What an operator of a cluster looks at: workers, queue, shipping — read from the control database.

Used by ``ql workers``, ``ql web`` and the scrape-time gauges of ``--metrics-listen`` (through
:meth:`~.pg_store.PostgresJournal.ops_snapshot`). One read-only snapshot per call; every statement is
bounded (``LIMIT``) and served by an index where one exists:

- the queue: ``ix_ql_run_queued`` (partial, ``status = 'queued'``) — depth counted up to
  :data:`QUEUE_COUNT_CAP`, the oldest by its ``created_at_ms`` order;
- workers: at most :data:`WORKER_LIMIT` rows of ``ql_worker`` (primary key order), their held
  attempts from the live leases (``ix_ql_lease_live_expiry``, partial on ``ended_at_ms IS NULL``);
- shipping: open artifacts of runs that already ended, at most :data:`SHIP_SCAN_LIMIT` looked at.

Times use the database clock (the same clock leases and heartbeats are written with). Nothing here
names a command, an environment or a token: ids, generations, counts and ages only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["snapshot", "worker_state", "QUEUE_COUNT_CAP", "WORKER_LIMIT", "SHIP_SCAN_LIMIT", "WORKER_STATES"]

QUEUE_COUNT_CAP = 100_000
WORKER_LIMIT = 1000
SHIP_SCAN_LIMIT = 10_000
#: ``alive``: session lease live; ``draining``: session lease live and the worker recorded that its
#: drain started (SIGTERM: it claims nothing more and finishes or hands back its attempts within
#: ``drain_timeout_s`` of ``[plugin.cluster-fenced]``; revision 0008); ``expired``: session lease
#: passed without a deregistration (the process died or lost the database — also while draining);
#: ``stopped``: deregistered after its drain; ``fenced``: attempts are still leased to an older
#: generation of this worker id (a restarted process took the id over; the sweeper ends those leases
#: when they expire).
WORKER_STATES = ("alive", "draining", "expired", "stopped", "fenced")

_NOW = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
_QUEUE = (f"SELECT {_NOW}, (SELECT count(*) FROM (SELECT 1 FROM ql_run WHERE status = 'queued' LIMIT %s) q), "
          "(SELECT created_at_ms FROM ql_run WHERE status = 'queued' ORDER BY created_at_ms, id LIMIT 1)")
_WORKERS = ("SELECT id, generation, status, slots, lease_expires_at_ms, heartbeat_at_ms, registered_at_ms "
            "FROM ql_worker ORDER BY id LIMIT %s")
_HELD = ("SELECT worker_id, worker_generation, count(*) FROM ql_attempt_lease "
         "WHERE ended_at_ms IS NULL AND status IN ('claimed', 'starting', 'running') "
         "GROUP BY worker_id, worker_generation "
         "ORDER BY worker_id LIMIT %s")
_SHIPPING = ("SELECT count(*), min(r.finished_at_ms) FROM (SELECT run_id FROM ql_artifact WHERE status = 'open' "
             "LIMIT %s) a JOIN ql_run r ON r.id = a.run_id WHERE r.finished_at_ms IS NOT NULL")


def worker_state(status: str, lease_expires_at_ms: int, now_ms: int, *, held_by_old_generation: int) -> str:
    """One worker's state from its row (see :data:`WORKER_STATES`)."""
    if held_by_old_generation:
        return "fenced"
    if status == "stopped":
        return "stopped"
    if lease_expires_at_ms <= now_ms:
        return "expired"
    return "draining" if status == "draining" else "alive"


def snapshot(connections: Any, *, worker_limit: int = WORKER_LIMIT) -> dict[str, Any]:
    """Queue, workers and shipping facts in one read-only transaction."""
    with connections.read("ops snapshot") as conn:
        now, depth, oldest = conn.execute(_QUEUE, (QUEUE_COUNT_CAP,)).fetchone()
        rows = conn.execute(_WORKERS, (worker_limit,)).fetchall()
        held_rows = conn.execute(_HELD, (worker_limit * 4,)).fetchall()
        unshipped, oldest_end = conn.execute(_SHIPPING, (SHIP_SCAN_LIMIT,)).fetchone()
    now = int(now)
    held: dict[tuple[str, int], int] = {(w, int(g)): int(n) for w, g, n in held_rows}
    workers = []
    counts = {state: 0 for state in WORKER_STATES}
    max_hb = 0.0
    for worker_id, generation, status, slots, expires, heartbeat, registered in rows:
        generation = int(generation)
        current = held.get((worker_id, generation), 0)
        old = sum(n for (w, g), n in held.items() if w == worker_id and g < generation)
        state = worker_state(status, int(expires), now, held_by_old_generation=old)
        counts[state] += 1
        hb_age = max(0.0, (now - int(heartbeat)) / 1000)
        if status != "stopped":
            max_hb = max(max_hb, hb_age)
        workers.append({"worker_id": worker_id, "generation": generation, "state": state, "slots": int(slots),
                        "held": current, "held_by_older_generations": old, "heartbeat_age_s": round(hb_age, 3),
                        "lease_expires_in_s": round((int(expires) - now) / 1000, 3),
                        "registered_at_ms": int(registered)})
    return {
        "db_now_ms": now,
        "queue_depth": int(depth),
        "oldest_queued_age_s": round(max(0.0, (now - int(oldest)) / 1000), 3) if oldest is not None else 0.0,
        "workers": counts,
        "worker_rows": workers,
        "max_heartbeat_age_s": round(max_hb, 3),
        "unshipped_ended_logs": int(unshipped or 0),
        "shipping_lag_s": round(max(0.0, (now - int(oldest_end)) / 1000), 3) if oldest_end is not None else 0.0,
    }
