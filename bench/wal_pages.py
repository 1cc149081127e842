"""Which pages each commit of a task writes: the WAL frames per commit, by B-tree (issue 25 item 1).

    python bench/wal_pages.py [--tasks 3] [--mode awaited|detached] [--dir /var/tmp] [--quiet]

Runs an embedded host in this interpreter on a fresh data dir, warms it up with a few tasks, then
for each measured task reads the frames the task appended to ``ql.db-wal`` (the WAL is never
checkpointed meanwhile: a few tasks stay far below ``wal_autocheckpoint``) and names the B-tree
(table or index) of each frame's page with the ``dbstat`` virtual table. Prints, per commit, the
frame count and the B-trees written — the figure to cut when bytes written per task are too many —
and at the end the mean frames per task of each B-tree and of each of a task's commits (``--quiet``:
only that summary; page splits are rare events, so run some tens of tasks to see their share).
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

_WAL_HEADER = 32
_FRAME_HEADER = 24


def frames(wal: Path, start: int, page_size: int) -> list[tuple[int, int]]:
    """(page number, commit size or 0) of every frame at or after byte ``start`` of ``wal``."""
    data = wal.read_bytes()
    out = []
    pos = max(start, _WAL_HEADER)
    while pos + _FRAME_HEADER + page_size <= len(data):
        pgno, commit = struct.unpack(">II", data[pos:pos + 8])
        out.append((pgno, commit))
        pos += _FRAME_HEADER + page_size
    return out


def page_owners(db: Path) -> dict[int, str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {int(p): str(n) for n, p in conn.execute("SELECT name, pageno FROM dbstat")}
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--mode", choices=("awaited", "detached"), default="awaited")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--quiet", action="store_true", help="only the summary per B-tree")
    args = parser.parse_args()

    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ql-wal-pages-") as tmp:
        data = Path(tmp) / "data"
        rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=Path(tmp)))
        db, wal = data / "ql.db", data / "ql.db-wal"
        page_size = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute("PRAGMA page_size").fetchone()[0]

        def task() -> None:
            if args.mode == "awaited":
                rt.wait(rt.submit(["true"], awaited=True))
            else:
                rt.wait(rt.submit(["true"]))

        for _ in range(5):
            task()
        print(f"page size {page_size}, mode {args.mode}")
        totals = []
        by_tree: collections.Counter[str] = collections.Counter()
        #: Frames of each commit of a task, by its place in the task (1st, 2nd, ...).
        by_commit: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
        say = (lambda *a: None) if args.quiet else print
        for n in range(args.tasks):
            start = wal.stat().st_size
            task()
            owners = page_owners(db)
            commit_pages: list[int] = []
            say(f"task {n + 1}:")
            count = place = 0
            for pgno, commit in frames(wal, start, page_size):
                commit_pages.append(pgno)
                count += 1
                if commit:
                    names = collections.Counter(owners.get(p, f"?{p}") for p in commit_pages)
                    by_tree.update(names)
                    place += 1
                    by_commit[place].append(len(commit_pages))
                    say(f"  commit: {len(commit_pages):>3} frames  "
                          + ", ".join(f"{k}" + (f"x{v}" if v > 1 else "") for k, v in sorted(names.items())))
                    commit_pages = []
            totals.append(count)
            say(f"  {count} frames = {count * (page_size + _FRAME_HEADER) / 1024:.1f} KiB of WAL")
        rt.close()
        print(f"frames per task by B-tree, mean of {args.tasks} tasks ('?N': a page freed since):")
        for name, frames_of in by_tree.most_common():
            print(f"  {frames_of / args.tasks:6.2f}  {name}")
        # Per commit, what the device sees: every commit rewrites the 4 KiB block the one before ended
        # in, so a commit of L bytes costs about L / 4096 + 1 blocks (docs/design.md, "Bytes on the device").
        for place, counts in sorted(by_commit.items()):
            print(f"commit {place} of a task: mean {sum(counts) / len(counts):.2f} frames "
                  f"({sum(counts) * (page_size + _FRAME_HEADER) / len(counts) / 1024:.1f} KiB), {len(counts)} tasks")
        print(f"mean {sum(totals) / len(totals):.1f} frames per task", file=sys.stderr)


if __name__ == "__main__":
    main()
