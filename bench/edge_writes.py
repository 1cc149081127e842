"""Where an awaited task's written bytes go, by file: a repeatable model of ``bench_edge.py``'s figure.

    python bench/edge_writes.py [--tasks 50 250] [--mode awaited|detached] [--dir /var/tmp]

Runs the same embedded host as ``bench_edge.py`` twice under ``strace -f -yy`` (every write and sync
of the whole process tree, with the file each went to) and replays the calls against a model of
the page cache: a write counts the 4 KiB pages it turns from clean to dirty, an ``fsync`` or
``fdatasync`` of a file cleans that file's pages. Prints per task, (B - A) / (K2 - K1) as the bench
does: the pages dirtied, the bytes the calls wrote, the calls and the syncs, for each file.

Why a model beside the bench: ``/proc/PID/io``'s ``write_bytes`` is counted by the kernel per
page-cache folio as it is dirtied, and on kernels whose page cache holds large folios for ext4
files (6.16+) a folio can be bigger than 4 KiB and its size depends on the machine's memory at
the time; on a loaded machine the bench's figure for the same code moved between 28 and 36 KB per
task from run to run. The model depends only on the calls made: use it to compare two versions.
What a disk receives (the file system's journal and write-back included) is the bench's
``device`` column (``bench_edge.py --bytes-only``, a fresh ext4 file system on a loop device).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PY = sys.executable
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_edge import HOST  # noqa: E402  (the very host the bench measures)

_CALL = re.compile(r"^(\d+)\s+(\w+)\((\d+)<([^>]*)>(.*)\)\s+=\s+(-?\d+)")
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|(?<=\.)\d+(?=\.tmp$)")


def traced(mode: str, n: int, work: Path) -> dict[str, collections.Counter[str]]:
    """Per file (the data dir's part of its path, ids masked): dirtied, written, calls, syncs."""
    run = Path(tempfile.mkdtemp(dir=work, prefix="ew-"))
    out = run / "trace"
    subprocess.run(["strace", "-f", "-qq", "-yy", "-s", "0", "-o", str(out), "-e",
                    "trace=write,pwrite64,writev,pwritev,fsync,fdatasync", PY, "-c", HOST, mode, str(n),
                    str(run / "data")], check=True, stdout=subprocess.DEVNULL)
    dirty: dict[str, set[int]] = collections.defaultdict(set)
    offsets: dict[str, int] = collections.defaultdict(int)
    figures: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in out.read_text().splitlines():
        m = _CALL.match(line)
        if not m or not m.group(4).startswith(str(run)):
            continue  # pipes, sockets, files outside the data dir
        _pid, call, _fd, path, rest, ret = m.groups()
        key = _ID.sub("ID", path[len(str(run)):])
        if call in ("fsync", "fdatasync"):
            figures[key]["syncs"] += 1
            dirty[path].clear()
            continue
        size = int(ret)
        if size <= 0:
            continue
        # pwrite64 names its offset; a plain write is modelled as an append at the file's last offset.
        offset = int(rest.rsplit(",", 1)[1]) if call == "pwrite64" else offsets[path]
        offsets[path] = offset + size
        figures[key]["calls"] += 1
        figures[key]["written"] += size
        for page in range(offset // 4096, (offset + size - 1) // 4096 + 1):
            if page not in dirty[path]:
                dirty[path].add(page)
                figures[key]["dirtied"] += 4096
    shutil.rmtree(run, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs=2, default=(50, 250), metavar=("K1", "K2"))
    parser.add_argument("--mode", choices=("awaited", "detached"), default="awaited")
    parser.add_argument("--dir", default="/var/tmp")
    args = parser.parse_args()
    if not shutil.which("strace"):
        sys.exit("needs strace")
    k1, k2 = args.tasks
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ql-edge-writes-") as tmp:
        a, b = traced(args.mode, k1, Path(tmp)), traced(args.mode, k2, Path(tmp))
    n = k2 - k1
    per = {k: {f: (b[k][f] - a.get(k, collections.Counter())[f]) / n for f in ("dirtied", "written", "calls", "syncs")}
           for k in b}
    print(f"per {args.mode} task ({k1} vs {k2} tasks)   {'4K dirtied':>11} {'written':>9} {'calls':>7} {'syncs':>7}")
    for key, f in sorted(per.items(), key=lambda kv: -kv[1]["dirtied"]):
        if any(f.values()):
            print(f"{key:<36} {f['dirtied'] / 1024:>8.1f} KB {f['written'] / 1024:>6.1f} KB {f['calls']:>7.2f} "
                  f"{f['syncs']:>7.3f}")
    total = sum(f["dirtied"] for f in per.values())
    print(f"{'total':<36} {total / 1024:>8.1f} KB {sum(f['written'] for f in per.values()) / 1024:>6.1f} KB "
          f"{sum(f['calls'] for f in per.values()):>7.2f} {sum(f['syncs'] for f in per.values()):>7.3f}")


if __name__ == "__main__":
    main()
