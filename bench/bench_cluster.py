"""Cluster throughput: claims/s and completions/s with 1, 2 and 4 workers, as ratios to the floor.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/bench_cluster.py

Everything runs against one fresh database (created and dropped here), in one run:

- **floor**: bare ``UPDATE … RETURNING`` + COMMIT (autocommit, one row per call, prepared), by 1, 2
  and 4 client processes at once — the cheapest possible "take a row and commit" on this database;
- **claim() only**: 1, 2, 4 processes claiming queued runs in batches of 8 (``FOR UPDATE SKIP
  LOCKED`` among them), nothing else;
- **protocol**: 1, 2, 4 processes that are workers as far as the control plane can tell — they
  register, ``claim`` (batches of 8), ``start``, ``running`` and ``complete`` each attempt of queued
  no-op runs through the fenced functions — but spawn nothing: the control plane's own cost;
- **end to end**: 1, 2, 4 real ``ql worker`` processes (4 slots each) running the no-op task
  ``true`` through the launcher, receipts, the local journal and the outbox.

Rates come from the database's own timestamps (attempt creation = claim, run update = completion),
from the first claim to the last one / the last completion. Ratios are rate / floor rate with the
same number of processes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pg_scratch import scratch_database

COUNTS = (1, 2, 4)



# -- floor ---------------------------------------------------------------------------------------
def _floor_client(dsn: str, first: int, n: int, start_at: float, out: mp.Queue) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        while time.time() < start_at:
            time.sleep(0.0005)
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute("UPDATE bench_floor SET n = n + 1 WHERE id = %s RETURNING n", (first + i,),
                         prepare=True).fetchone()
        out.put((n, time.perf_counter() - t0))


def floor_rate(dsn: str, clients: int, n: int) -> float:
    """Rows updated-and-committed per second, all clients together."""
    out: mp.Queue = mp.Queue()
    start_at = time.time() + 0.5
    procs = [mp.Process(target=_floor_client, args=(dsn, c * n, n, start_at, out)) for c in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return sum(r[0] for r in results) / max(r[1] for r in results)


# -- the protocol alone --------------------------------------------------------------------------
def _protocol_client(dsn: str, name: str, start_at: float, out: mp.Queue) -> None:
    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB, completion_digest

    db = ControlDB.connect(dsn)
    worker = db.register(name, str(uuid.uuid4()), slots=64, ql_version="bench").worker
    while time.time() < start_at:
        time.sleep(0.0005)
    done = 0
    while True:
        ids = [new_id() for _ in range(8)]
        claimed = db.claim(worker, max_n=8, free_slots=8, executor="local", attempt_ids=ids,
                           log_ids=[new_id() for _ in range(8)]).attempts
        if not claimed:
            break
        for c in claimed:
            fence = c.fence(worker)
            db.start(fence)
            db.running(fence, started_at_ms=c.db_now_ms)
            finished = int(time.time() * 1000)
            db.complete(fence, exit_code=0, started_at_ms=None, finished_at_ms=finished, signalled=False,
                        completion_digest=completion_digest(c.attempt_id, exit_code=0, started_at_ms=None,
                                                            finished_at_ms=finished, signalled=False))
            done += 1
    db.close()
    out.put(done)


def _claim_client(dsn: str, name: str, start_at: float, out: mp.Queue) -> None:
    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB

    db = ControlDB.connect(dsn)
    worker = db.register(name, str(uuid.uuid4()), slots=64, ql_version="bench").worker
    while time.time() < start_at:
        time.sleep(0.0005)
    done = 0
    while True:
        ids = [new_id() for _ in range(8)]
        claimed = db.claim(worker, max_n=8, free_slots=8, executor="local", attempt_ids=ids,
                           log_ids=[new_id() for _ in range(8)], lease_ttl_ms=3_600_000).attempts
        if not claimed:
            break
        done += len(claimed)
    db.close()
    out.put(done)


def claims_only(dsn: str, clients: int, n: int) -> float:
    """claim() alone (batches of 8, SKIP LOCKED among the clients): attempts claimed per second."""
    runs = _submit(dsn, n)
    out: mp.Queue = mp.Queue()
    start_at = time.time() + 0.5
    procs = [mp.Process(target=_claim_client, args=(dsn, f"bench-c{clients}-{c}", start_at, out))
             for c in range(clients)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    assert total == n, (total, n)
    claims, _done = _rates(dsn, runs)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:  # out of the way: a claimed run is cancelled at once
        conn.execute("SELECT ql_request_cancel(id, 'user') FROM ql_run WHERE id = ANY(%s)", (runs,))
    return claims


def _submit(dsn: str, n: int, key_file: Path | None = None) -> list[str]:
    """Queue ``n`` runs of ``true``, sealed with ``key_file`` (what real workers open) or with a
    throwaway key when nothing will run them."""
    from ql_core.ids import new_id
    from ql_plugins.cluster_fenced import ControlDB
    from ql_plugins.cluster_fenced.sealing import SpecKey, SpecKeyRing, encode_spec, key_id_of, load_key_file

    if key_file is not None:
        ring = SpecKeyRing(load_key_file(key_file))
    else:
        key = os.urandom(32)
        ring = SpecKeyRing(SpecKey(key_id_of(key), key))
    plain = encode_spec(["true"], False, None, None)
    ids = []
    with ControlDB.connect(dsn) as db:
        for _ in range(n):
            run_id = new_id()
            db.submit(run_id, sealed=ring.seal(run_id, plain, 1))
            ids.append(run_id)
    return ids


def _rates(dsn: str, run_ids: list[str]) -> tuple[float, float]:
    """(claims/s, completions/s) of these runs from the database's timestamps."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        first, last_claim = conn.execute("SELECT min(a.created_at_ms), max(a.created_at_ms) FROM ql_run_attempt a "
                                         "WHERE a.run_id = ANY(%s)", (run_ids,)).fetchone()
        last_done, done = conn.execute("SELECT max(updated_at_ms), count(*) FROM ql_run WHERE id = ANY(%s) "
                                       "AND status = 'succeeded'", (run_ids,)).fetchone()
        claims = conn.execute("SELECT count(*) FROM ql_run_attempt WHERE run_id = ANY(%s)", (run_ids,)).fetchone()[0]
    done_rate = done / max(0.001, (last_done - first) / 1000) if last_done is not None else 0.0
    return claims / max(0.001, (last_claim - first) / 1000), done_rate


def protocol(dsn: str, clients: int, n: int) -> tuple[float, float]:
    runs = _submit(dsn, n)
    out: mp.Queue = mp.Queue()
    start_at = time.time() + 0.5
    procs = [mp.Process(target=_protocol_client, args=(dsn, f"bench-p{clients}-{c}", start_at, out))
             for c in range(clients)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    assert total == n, (total, n)
    return _rates(dsn, runs)


# -- end to end: real `ql worker` processes ----------------------------------------------------------
def end_to_end(dsn: str, workers: int, n: int, tmp: Path) -> tuple[float, float]:
    import psycopg

    from ql_plugins.cluster_fenced.sealing import new_key_file

    key_file = tmp / f"spec-{workers}.key"  # the workers open the specs with the submitter's key
    new_key_file(key_file)
    runs = _submit(dsn, n, key_file)
    procs = []
    for w in range(workers):
        d = tmp / f"w{workers}-{w}"
        d.mkdir(mode=0o700)
        config = tmp / f"w{workers}-{w}.toml"
        config.write_text(f'profile = "cluster-worker"\ndata_dir = "{d}"\ndatabase_url = "{dsn}"\n'
                          f'[limits]\nclaim_interval_s = 0.05\n'
                          f'[plugin.cluster-fenced]\nworker_id = "bench-e{workers}-{w}"\nslots = 4\n'
                          f'spec_key_file = "{key_file}"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        env["QL_CONFIG"] = str(config)
        procs.append(subprocess.Popen([sys.executable, "-m", "ql_core.cli.main", "worker"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 600
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM ql_run WHERE id = ANY(%s) AND status NOT IN "
                           "('succeeded', 'failed', 'lost', 'cancelled', 'timed_out')", (runs,)).fetchone()[0]:
            if time.monotonic() > deadline:
                raise TimeoutError("runs did not finish")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a ql worker exited; run one by hand with this config to see why")
            time.sleep(0.05)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)
    return _rates(dsn, runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--floor-n", type=int, default=4000, help="floor updates per client")
    parser.add_argument("--protocol-n", type=int, default=2000, help="runs per protocol measurement")
    parser.add_argument("--e2e-n", type=int, default=400, help="runs per end-to-end measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import psycopg

    with scratch_database() as (url, dsn):
        tmp = Path(tempfile.mkdtemp(prefix="ql-bench-cluster-"))
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE bench_floor (id integer PRIMARY KEY, n integer NOT NULL)")
                conn.execute("INSERT INTO bench_floor SELECT g, 0 FROM generate_series(0, %s) g",
                             (args.floor_n * max(COUNTS),))
            rows = []
            for k in COUNTS:
                floor = floor_rate(dsn, k, args.floor_n)
                c_claims = claims_only(dsn, k, args.protocol_n)
                p_claims, p_done = protocol(dsn, k, args.protocol_n)
                e_claims, e_done = end_to_end(dsn, k, args.e2e_n, tmp)
                rows.append({"workers": k, "floor_per_s": floor, "claim_only_per_s": c_claims,
                             "protocol_claims_per_s": p_claims, "protocol_completions_per_s": p_done,
                             "e2e_claims_per_s": e_claims, "e2e_completions_per_s": e_done})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(rows))
        return
    def cell(value: float, floor: float) -> str:
        return f"{value:>7.0f} ({value / floor:.3f}x)"

    print(f"{'workers':>7} {'floor/s':>8} | {'claim() only':>16} | {'protocol claims/s':>17} {'completions/s':>16}"
          f" | {'ql worker claims/s':>18} {'completions/s':>16}")
    for r in rows:
        f = r["floor_per_s"]
        print(f"{r['workers']:>7} {f:>8.0f} | {cell(r['claim_only_per_s'], f):>16} | "
              f"{cell(r['protocol_claims_per_s'], f):>17} {cell(r['protocol_completions_per_s'], f):>16} | "
              f"{cell(r['e2e_claims_per_s'], f):>18} {cell(r['e2e_completions_per_s'], f):>16}")
    print("floor: bare UPDATE ... RETURNING + COMMIT (one row per transaction) by as many client processes.\n"
          "claim() only: batches of 8 under SKIP LOCKED, nothing else. protocol: claim + start + running + complete\n"
          "per attempt through the fenced functions, nothing spawned. ql worker: real `ql worker` processes\n"
          "(4 slots) running `true` (launcher, receipt, local journal, outbox). Ratios: rate / floor.")


if __name__ == "__main__":
    main()
