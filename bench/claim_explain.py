"""Where a ``ql_claim`` call spends its time on the server: the plan of every statement it runs.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/claim_explain.py [--claim 3]

``bench/worker_profile.py --no-profile`` says how long each control function takes per call (one
worker: ``ql_claim`` ~0.67 ms, the round's ``ql_spawn_complete_many`` ~0.73 ms), all of it time
the worker's control loop waits for. This says where inside ``ql_claim`` that time goes: on a
scratch database (``pg_scratch``) with queued runs and a registered worker, a few warm-up claims
(so the function's plans are cached, as a worker's are), then claims of ``--claim`` runs in a
session with ``auto_explain`` loaded (``log_nested_statements``, ``log_analyze``): the plans come
back as notices and are printed, each with its duration — the function's own guards, the queue
read, the insert/update statement node by node, and the foreign-key checks the inserts fire.
``auto_explain``'s timing slows every statement: read the shares, not the sum.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claim", type=int, default=3, help="runs per claim (as a worker with that many free slots)")
    parser.add_argument("--rounds", type=int, default=2, help="measured claims (the plans of the last are printed)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import psycopg
    from bench_cluster import _submit
    from pg_scratch import scratch_database

    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB

    def ids(n: int) -> list[str]:
        return [new_id() for _ in range(n)]

    n = args.claim
    with scratch_database() as (_url, dsn):
        _submit(dsn, n * (args.rounds + 20) + 10)
        with ControlDB.connect(dsn) as db:
            worker = db.register("bench-explain", new_id(), slots=64, ql_version="bench", ttl_ms=600_000).worker
            for _ in range(20):  # the function's statements planned and cached, as in a running worker
                db.claim(worker, max_n=n, free_slots=n, executor="local", attempt_ids=ids(n), log_ids=ids(n))
        with psycopg.connect(dsn, autocommit=True) as conn:
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                            "SET auto_explain.log_level = notice", "SET client_min_messages = notice"):
                conn.execute(setting)
            plans: list[str] = []
            conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
            for _ in range(args.rounds):
                plans.clear()
                t0 = time.perf_counter()
                rows = conn.execute("SELECT * FROM ql_claim(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                                    (worker.worker_id, worker.generation, worker.session, n, n, "local", ids(n),
                                     ids(n), 30_000)).fetchall()
                print(f"# ql_claim of {n}: {len(rows)} rows, {(time.perf_counter() - t0) * 1000:.2f} ms here "
                      f"(auto_explain on)")
            for plan in plans:
                print("----")
                print(plan)


if __name__ == "__main__":
    main()
