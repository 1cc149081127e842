"""Log shipping: throughput of the real shipper into the PostgreSQL artifact store, as a ratio to a
bare INSERT of the same chunks, and the worker's memory while it ships a 256 MiB log.

    QL_TEST_POSTGRES_DSN=postgresql+psycopg://postgres@127.0.0.1:5432/postgres python bench/bench_log_shipping.py

Everything runs against one fresh database (created and dropped here), in one run, on one file of
``--mib`` MiB of random bytes (incompressible: no flattering TOAST compression):

- **floor**: the same file cut into the same 1 MiB chunks, each with its SHA-256 computed in Python,
  inserted one chunk per transaction (autocommit, prepared) into a table of the artifact chunk's
  shape — the cheapest way to get those bytes committed on this database;
- **shipper**: a real ``ql worker`` runs ``cat FILE`` (the log is written at disk speed) and ships it
  through ``ql_artifact_append`` (the database recomputes each chunk's SHA-256, checks the proof and
  the offset) — rate = bytes / (last chunk committed − artifact opened), database clock;
- **finalize**: from the last chunk to the finalized artifact (the local whole-file SHA-256 and the
  store's re-read of every stored byte to verify it);
- **worker memory**: VmRSS of the ``ql worker`` process before the task and its peak while shipping
  (sampled every 20 ms), and Rss/Pss from ``/proc/<pid>/smaps_rollup`` at the peak sample.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pg_scratch import scratch_database

CHUNK = 1024 * 1024



def _status_kib(pid: int, key: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _rollup(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] in ("Rss:", "Pss:"):
                    out[parts[0][:-1]] = int(parts[1])
    except OSError:
        pass
    return out


def floor_insert(dsn: str, path: Path) -> float:
    """MiB/s of one-chunk-per-transaction INSERTs of the file's 1 MiB chunks (SHA-256 computed too)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_chunk (attempt_id text NOT NULL, byte_offset bigint NOT NULL, "
                     "length integer NOT NULL, sha256 text NOT NULL, data bytea NOT NULL, "
                     "PRIMARY KEY (attempt_id, byte_offset))")
        key = str(uuid.uuid4())
        size = path.stat().st_size
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            at = 0
            while piece := f.read(CHUNK):
                conn.execute("INSERT INTO bench_chunk VALUES (%s, %s, %s, %s, %s)",
                             (key, at, len(piece), hashlib.sha256(piece).hexdigest(), piece), prepare=True)
                at += len(piece)
        elapsed = time.perf_counter() - t0
        conn.execute("DROP TABLE bench_chunk")
    return size / CHUNK / elapsed


def ship(url: str, dsn: str, path: Path, tmp: Path) -> dict[str, float]:
    import psycopg

    size = path.stat().st_size
    data_dir = tmp / "worker"
    data_dir.mkdir(mode=0o700)
    from ql_plugins.cluster_fenced.sealing import SpecKeyRing, encode_spec, load_key_file, new_key_file

    key_file = tmp / "spec.key"  # task specs travel sealed: the worker opens them with this key
    new_key_file(key_file)
    ring = SpecKeyRing(load_key_file(key_file))
    config = tmp / "worker.toml"
    config.write_text(f'profile = "cluster-worker"\ndata_dir = "{data_dir}"\ndatabase_url = "{url}"\n'
                      f'[limits]\nclaim_interval_s = 0.05\nlog_max_bytes = {size + CHUNK}\n'
                      f'[plugin.cluster-fenced]\nworker_id = "bench-ship"\nslots = 1\n'
                      f'spec_key_file = "{key_file}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_CONFIG"] = str(config)
    env["HOME"] = str(tmp)
    log = open(tmp / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "ql_core.cli.main", "worker"], env=env, stdout=log,
                              stderr=log)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while not conn.execute("SELECT count(*) FROM ql_worker WHERE id = 'bench-ship'").fetchone()[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the worker did not register")
                time.sleep(0.05)
            time.sleep(1.0)  # settle: imports done, threads started
            base = _status_kib(worker.pid)
            from ql_core.ids import new_id
            from ql_plugins.cluster_fenced import ControlDB

            run_id = new_id()
            with ControlDB.connect(dsn) as db:
                db.submit(run_id, sealed=ring.seal(run_id, encode_spec(["cat", str(path)], False, None, None), 1))
            peak, peak_rollup = base, _rollup(worker.pid)
            shipped_at = None
            deadline = time.monotonic() + 900
            while True:
                rss = _status_kib(worker.pid)
                if rss > peak:
                    peak, peak_rollup = rss, _rollup(worker.pid)
                row = conn.execute("SELECT a.committed_bytes, a.status, a.created_at_ms, a.finalized_at_ms, "
                                   "ql__clock_ms() FROM ql_artifact a JOIN ql_run_attempt t ON t.id = a.attempt_id "
                                   "WHERE t.run_id = %s", (run_id,)).fetchone()
                if row is not None:
                    committed, status, created, finalized, now = row
                    if committed >= size and shipped_at is None:
                        shipped_at = now
                    if status == "final":
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError("the log was not finalized")
                time.sleep(0.02)
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
    assert shipped_at is not None
    ship_s = max(0.001, (shipped_at - created) / 1000)
    return {"mib": size / CHUNK, "ship_mib_per_s": size / CHUNK / ship_s, "ship_s": ship_s,
            "finalize_s": max(0.0, (finalized - shipped_at) / 1000),
            "rss_base_mib": base / 1024, "rss_peak_mib": peak / 1024,
            "rss_growth_mib": (peak - base) / 1024,
            "rollup_rss_mib": peak_rollup.get("Rss", 0) / 1024, "rollup_pss_mib": peak_rollup.get("Pss", 0) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="log size in MiB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with scratch_database() as (url, dsn):
        tmp = Path(tempfile.mkdtemp(prefix="ql-bench-ship-"))
        try:
            path = tmp / "log.bin"
            with open(path, "wb") as f:
                for _ in range(args.mib):
                    f.write(os.urandom(CHUNK))
            floor = floor_insert(dsn, path)
            result = ship(url, dsn, path, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    result["floor_mib_per_s"] = floor
    result["ratio"] = result["ship_mib_per_s"] / floor
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'log MiB':>7} {'floor MiB/s':>11} | {'shipper MiB/s':>20} | {'finalize s':>10} | "
          f"{'worker RSS base':>15} {'peak':>6} {'growth':>7} | {'rollup Rss/Pss at peak':>22}")
    print(f"{result['mib']:>7.0f} {floor:>11.1f} | {result['ship_mib_per_s']:>8.1f} ({result['ratio']:.3f}x) "
          f"| {result['finalize_s']:>10.2f} | {result['rss_base_mib']:>13.1f}Mi {result['rss_peak_mib']:>5.1f}Mi "
          f"{result['rss_growth_mib']:>6.1f}Mi | {result['rollup_rss_mib']:>9.1f}Mi/{result['rollup_pss_mib']:.1f}Mi")
    print("floor: 1 MiB chunks of the same file, SHA-256 computed, one INSERT per transaction (prepared).\n"
          "shipper: a real `ql worker` shipping `cat FILE`'s log through ql_artifact_append (database-side\n"
          "SHA-256, proof and offset checks), artifact opened -> last chunk committed (database clock).\n"
          "finalize: last chunk -> finalized (local whole-file SHA + the store's re-read of every stored byte).\n"
          "RSS: the worker process, sampled every 20 ms. Ratio: shipper rate / floor rate.")


if __name__ == "__main__":
    main()
