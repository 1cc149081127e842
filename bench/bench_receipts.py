"""Receipt store throughput: publish + read + remove cycles per second, with and without fsync.

Run: ``python bench/bench_receipts.py [--n N] [--dir DIR]``.

The numbers are compared with a baseline measured in the same run on the same
file system: a plain ``open/write/close`` + ``open/read/close`` + ``unlink`` of
the same bytes (and the same plus an fsync of the file, to show what
durability alone costs). The default directory is a fresh temp dir under
/var/tmp, which is normally on the disk that holds the data dir — /tmp is often
a tmpfs where fsync is free and the comparison would flatter the store.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ql_core.ids import new_id
from ql_core.receipts import FileReceiptStore, ReadStatus, Receipt, serialize_receipt

PLAIN = "plain open/write/close/read/unlink"
PLAIN_FSYNC = "plain + fsync(file)"


def make_receipts(n: int) -> list[Receipt]:
    now = int(time.time() * 1000)
    return [
        Receipt(1, new_id(), new_id(), 1, os.urandom(32).hex(), now, now + 5, 0) for _ in range(n)
    ]


def warm_up_shards(store: FileReceiptStore) -> None:
    """Create all 256 shard directories first, so the measured cycles are steady state."""
    for shard in range(256):
        attempt_id = new_id()[:-2] + f"{shard:02x}"  # the last two hex digits are random bits
        receipt = Receipt(1, new_id(), attempt_id, 1, "w" * 43, 0, 0, 0)
        store.publish(receipt, fsync=False)
        store.remove(attempt_id, fsync=False)


def store_cycles(store: FileReceiptStore, receipts: list[Receipt], *, fsync: bool) -> None:
    for receipt in receipts:
        store.publish(receipt, fsync=fsync)
        if store.read(receipt.attempt_id).status is not ReadStatus.VALID:
            raise AssertionError("benchmark read back an invalid receipt")
        store.remove(receipt.attempt_id, fsync=fsync)


def plain_cycles(directory: Path, receipts: list[Receipt], *, fsync: bool) -> None:
    """The floor: the same bytes with no exclusivity, no link, no validation, no dir fds."""
    for receipt in receipts:
        path = directory / f"{receipt.attempt_id}.json"
        with open(path, "wb") as handle:
            handle.write(serialize_receipt(receipt))
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        with open(path, "rb") as handle:
            handle.read()
        os.unlink(path)


def measure(run: Callable[[], None], n: int) -> float:
    """Cycles per second of one timed run."""
    start = time.perf_counter()
    run()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="cycles per mode (default 1000)")
    parser.add_argument(
        "--dir", default="/var/tmp", help="parent of the temp dir (default /var/tmp)"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ql-bench-receipts-", dir=args.dir))
    try:
        store = FileReceiptStore(work / "receipts")
        plain_dir = work / "plain"
        plain_dir.mkdir(mode=0o700)
        warm_up_shards(store)
        batches = [make_receipts(args.n) for _ in range(4)]  # generated outside the timing
        rates = {
            PLAIN: measure(lambda: plain_cycles(plain_dir, batches[0], fsync=False), args.n),
            PLAIN_FSYNC: measure(lambda: plain_cycles(plain_dir, batches[1], fsync=True), args.n),
            "store publish/read/remove, fsync=False": measure(
                lambda: store_cycles(store, batches[2], fsync=False), args.n
            ),
            "store publish/read/remove, fsync=True": measure(
                lambda: store_cycles(store, batches[3], fsync=True), args.n
            ),
        }
    finally:
        shutil.rmtree(work)
    report(rates, args.n, work)


def report(rates: dict[str, float], n: int, work: Path) -> None:
    print(f"receipt store benchmark: n={n} cycles per mode, dir={work.parent}")
    header = ("mode", "cycles/s", "us/cycle", "vs plain", "vs plain+fsync")
    print(f"{header[0]:<42} {header[1]:>10} {header[2]:>10} {header[3]:>9} {header[4]:>15}")
    for name, rate in rates.items():
        slower = rates[PLAIN] / rate
        slower_durable = rates[PLAIN_FSYNC] / rate
        us = 1e6 / rate
        print(f"{name:<42} {rate:>10.0f} {us:>10.1f} {slower:>8.2f}x {slower_durable:>14.2f}x")
    print("(ratios = how many times slower than the baseline; lower is better.")
    print(" fsync=True: 3 fsyncs per cycle (temp file, shard dir after link, after remove))")


if __name__ == "__main__":
    main()
