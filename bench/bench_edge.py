"""The edge budget (ADR-0007 §6 gate 10, issue 25): disk written, syncs, CPU, RSS and wake-ups per
task, each beside its floor measured in the same run.

    python bench/bench_edge.py [--quick] [--dir /var/tmp] [--window 20] [--cpu-only | --bytes-only [--pace 6]]

Figures (every one is a median or a difference measured in this run, on the same file system):

bytes written / syncs per task
    ``device``: the bytes a block device received (sectors written of a loop device holding a
    fresh ext4 file system made for this run, read after ``syncfs``: ``bench/device_fs.py``) —
    data blocks, the ext4 journal, the checkpoint's database writes: the wear on an SD card. Needs
    root; without it the column is empty. ``write_bytes``: of ``/proc/PID/io`` of a small *reaper*
    process (a child subreaper: every descendant — the host, its launchers, detached launchers — is
    reparented to it and reaped by it, so its counters hold them all): page-cache folios as they are
    dirtied (the checkpoint's included), not the file system's journal nor write-back's rounding to
    blocks; with the former fresh-data-dir windows it moved 22.6-36.1 KB per task for the same code
    (large ext4 folios), in the warmed windows below it repeats. Syncs: the ``fsync``/``fdatasync`` calls of the whole tree
    (``strace -f -c``). Each variant runs twice in a fresh data dir, with W + K1 and W + K2 tasks;
    the figure is (B - A) / (K2 - K1), so start-up, warm-up, schema creation and close cancel out.
    The floor and the awaited task, which the byte goals compare, are the median of ``--pairs``
    (default 3) such pairs: one pair's floor moved from 10.3 to 13.7 KB between two runs.
    W (warm-up) puts the WAL in its steady state before the measured tasks: past its first
    checkpoint, so its file is rewritten in place rather than grown. A growing WAL costs an ext4
    journal commit at every fdatasync (its size and blocks change): ~116 KB per awaited task on the
    device for the first ~270 tasks of a new data dir against ~33 KB later — a one-off per data dir
    that would otherwise be most of the figure. K2 - K1 spans several checkpoints (one every
    ``WAL_CHECKPOINT_BYTES`` of WAL, ~270 awaited tasks), so their writes and syncs are counted
    at their share. Six runs, alternating main's code and the next commit's (the same ql code): the
    floor 10.3 KB five times and 8.0 once, an awaited task 33.5, 33.5, 34.9, 34.3, 33.9, 34.5 KB
    (write_bytes 28.9-29.0, the floor's 9.0). ``ql run``'s window is short (30 processes, no
    checkpoint in it: its syncs are exact): its bytes moved 15.5-136.5 KB, indicative only.
    Variants: ``floor`` (one sqlite3 ``INSERT`` + ``COMMIT`` of a 300-byte row per task, WAL,
    ``synchronous=FULL``: what ql commits with; warmed past its own first checkpoint), ``awaited``
    (``rt.wait(rt.submit(["true"], awaited=True))``), ``not awaited`` (``submit`` without
    ``awaited``, then ``wait``), ``ql run`` (warmed by embedded tasks, then ``ql run -- true``
    processes and one ``ql list``, which settles them; a short window: no checkpoint falls in it),
    ``tsp -f true`` and ``nq true`` + ``nq -w`` when installed (no WAL: not warmed). Before the
    first measured run, an untimed floor run takes a new file system's first-use writes.
    ``--pace S``: the floor and the awaited task only, 5 and 25 tasks S seconds apart after the
    warm-up. Back to back, one ext4 journal commit (a checkpoint's sync of ``ql.db``, or the
    journal's 5-second timer) carries the metadata of many tasks; seconds apart, each task's goes
    alone — its log file's inode and ``logs/<xx>/`` block, the WAL's inode times, the ``-shm``
    file's pages — which is what an SD card sees when tasks are seconds apart (``--pace 6``).
    Exploratory, not yet understood: at ``--pace 6`` the floor measured 39.0 KB per commit on a
    long-used file system without strace and 81.2 KB here, where the awaited task also measured
    81.2: a cost driven by time, not by tasks, dominates both at that pace.
first use
    CPU (user + sys, ``wait4`` rusage of the child, its reaped children included) of ``ql run --
    true`` on a new data dir against a later one on another, in turn with the floor below (11 of
    each, medians).
read commands
    CPU of ``ql status/list/events/logs`` against a floor: the same interpreter running a script
    that opens the same SQLite file read-only, runs the same SELECT (or reads the log file) and
    prints JSON, each command alternating with its floor (15 of each, medians). ``ql run -- true``
    is compared with the ``ql status`` floor, measured in turn with it.
embedded CPU per task
    In one interpreter: ``getrusage`` (self + children) over N ``Popen(["true"]).wait()`` and over
    N awaited ``rt.run(["true"])`` and the runtime's close (which reaps the standby factory), each
    pair on a runtime of its own; the medians of ``--pairs`` pairs (CPU and the ratio per pair).
RSS
    Pss (``/proc/PID/smaps_rollup``) of the host after the awaited loop, of one launcher of a
    running task, and of an idle ``ql supervise``.
idle wake-ups
    Context switches (voluntary + involuntary, all threads) per minute of the idle supervisor and
    of the launcher over ``--window`` seconds.

Prints a table with the acceptance bullets of issue 25 as PASS/FAIL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_fs import DeviceFs, device_fs_available  # noqa: E402

PY = sys.executable
QL = [PY, "-m", "ql_core.cli.main"]

#: The reaper: becomes a child subreaper, runs argv, reaps every descendant, prints its own io.
REAPER = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.05)
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print(json.dumps({k: int(v) for k, v in io.items()}))
"""

#: Embedded host: HOST MODE N DATA_DIR [AFTER PACE] (then PACE seconds' sleep after each task past the
#: AFTER-th: --pace).
HOST = r"""
import sys, time
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime
mode, n, data = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
after, pace = (int(sys.argv[4]), float(sys.argv[5])) if len(sys.argv) > 5 else (n, 0.0)
rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=data.parent))
for i in range(n):
    if mode == "awaited":
        rt.wait(rt.submit(["true"], awaited=True))
    else:
        rt.wait(rt.submit(["true"]))
    if i >= after:
        time.sleep(pace)
rt.close()
"""

#: The sqlite3 floor: FLOOR N DB [AFTER PACE] (as HOST's).
FLOOR = r"""
import sqlite3, sys, time
n = int(sys.argv[1])
after, pace = (int(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 4 else (n, 0.0)
db = sqlite3.connect(sys.argv[2], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
for i in range(n):
    db.execute("BEGIN IMMEDIATE"); db.execute("INSERT INTO t (body) VALUES (?)", ("x" * 300,)); db.execute("COMMIT")
    if i >= after:
        time.sleep(pace)
db.close()
"""

#: Loops of one CLI command per task: LOOP N ARGV...; the reaper reaps what each leaves behind.
LOOP = r"""
import subprocess, sys
n, argv = int(sys.argv[1]), sys.argv[2:]
for _ in range(n):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
"""

QL_RUN_LOOP = r"""
import os, subprocess, sys
n, data = int(sys.argv[1]), sys.argv[2]
if len(sys.argv) > 3:  # warm-up: HOST source and a task count, run first on the same data dir
    subprocess.run([sys.executable, "-c", sys.argv[3], "awaited", sys.argv[4], data], check=True)
ql = [sys.executable, "-m", "ql_core.cli.main", "--data-dir", data]
for _ in range(n):
    subprocess.run(ql + ["run", "--", "true"], check=True, stdout=subprocess.DEVNULL)
subprocess.run(ql + ["list"], check=True, stdout=subprocess.DEVNULL)
"""

NQ_LOOP = r"""
import subprocess, sys
for _ in range(int(sys.argv[1])):
    job = subprocess.run(["nq", "true"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["nq", "-w", job], check=True)
"""


def traced(argv: list[str], work: Path, env: dict[str, str],
           device: DeviceFs | None = None) -> tuple[int, int, int | None]:
    """(write_bytes, fsync+fdatasync calls, bytes the device received or None) of ``argv`` and
    every descendant. The strace summary goes to ``work``, off the measured device."""
    out = work / f"strace-{time.monotonic_ns()}"
    reaper = [PY, "-c", REAPER, *argv]
    if shutil.which("strace"):
        reaper = ["strace", "-f", "-qq", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out), *reaper]
    before = device.written() if device else 0
    done = subprocess.run(reaper, env=env, capture_output=True, text=True, check=True, timeout=1800)
    received = device.written() - before if device else None
    io = json.loads(done.stdout.strip().splitlines()[-1])
    syncs = 0
    if out.exists():
        for line in out.read_text().splitlines():
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync"):
                syncs += int(parts[3])
        out.unlink()
    return io["write_bytes"], syncs, received


def per_task(make: callable, k1: int, k2: int, work: Path, env: dict[str, str], *, warm: int = 0,
             device: DeviceFs | None = None, pairs: int = 1) -> tuple[float, float, float | None]:
    """(write_bytes, syncs, device bytes or None) per task: a run of warm + k2 tasks minus a run of
    warm + k1, each in a fresh directory (on the device's file system when there is one). With
    ``pairs`` > 1, each figure is the median over that many such pairs: one pair's device bytes
    moved by a third between runs (the floor read 10.3 KB in one run and 13.7 KB in another, and a
    goal measured against it flipped)."""
    measured = []
    for _ in range(pairs):
        results = []
        for k in (k1, k2):
            d = Path(tempfile.mkdtemp(dir=device.mount if device else work, prefix="pt-"))
            results.append(traced(make(warm + k, d), work, env, device))
            shutil.rmtree(d, ignore_errors=True)  # its deletion reaches the device before the next reading
        (b1, s1, d1), (b2, s2, d2) = results
        received = None if d1 is None or d2 is None else (d2 - d1) / (k2 - k1)
        measured.append(((b2 - b1) / (k2 - k1), (s2 - s1) / (k2 - k1), received))
    devices = [m[2] for m in measured]
    return (statistics.median(m[0] for m in measured), statistics.median(m[1] for m in measured),
            None if None in devices else statistics.median(devices))  # type: ignore[type-var]


#: Warm-up tasks (W) of each variant with a WAL: past its first checkpoint, so the measured tasks see
#: the WAL's steady state. ql: one checkpoint per WAL_CHECKPOINT_BYTES (4 MiB at 512-byte pages,
#: ~8200 frames, ~270 awaited tasks); the floor: SQLite's 1000 pages of 4 KiB, 2 per commit: 500.
WARM_QL, WARM_FLOOR = 400, 700


def bytes_and_syncs(work: Path, env: dict[str, str], quick: bool, pace: float = 0.0,
                    awaited_only: bool = False, pairs: int = 3) -> list[tuple[str, bool]]:
    """Print bytes and syncs per task of every variant; the goals of issue 25 they decide. With
    ``pace``: the floor and the awaited task only, a few tasks each ``pace`` seconds apart; with
    ``awaited_only``: the floor and the awaited task only (A/B rounds of a schema change)."""
    # The embedded window spans several checkpoints (~270 tasks apart) and a whole number of the
    # floor's (500 commits apart: a 300-commit --quick window held one and measured it at 25.3 KB);
    # `ql run` (a process per task, slow) a short one after W + K1 tasks, before the second checkpoint.
    k1, k2 = (50, 550) if quick else (100, 1100)
    r1, r2 = (4, 14) if quick else (10, 40)
    warm_run = 300
    variants = {
        "floor: sqlite3 INSERT+COMMIT": (lambda k, d: [PY, "-c", FLOOR, str(k), str(d / "f.db")], k1, k2, WARM_FLOOR),
        "ql embedded, awaited": (lambda k, d: [PY, "-c", HOST, "awaited", str(k), str(d / "data")], k1, k2, WARM_QL),
        "ql embedded, not awaited": (lambda k, d: [PY, "-c", HOST, "detached", str(k), str(d / "data")], k1, k2,
                                     WARM_QL),
        # W embedded tasks first (QL_RUN_LOOP's warm-up), then K `ql run`s: make gets W + K, so W is subtracted.
        "ql run -- true": (lambda k, d: [PY, "-c", QL_RUN_LOOP, str(k - warm_run), str(d / "data"), HOST,
                                         str(warm_run)], r1, r2, warm_run),
    }
    if pace:
        k1, k2 = (3, 13) if quick else (5, 25)
        variants = {
            "floor: sqlite3 INSERT+COMMIT": (lambda k, d: [PY, "-c", FLOOR, str(k), str(d / "f.db"), str(WARM_FLOOR),
                                                           str(pace)], k1, k2, WARM_FLOOR),
            "ql embedded, awaited": (lambda k, d: [PY, "-c", HOST, "awaited", str(k), str(d / "data"), str(WARM_QL),
                                                   str(pace)], k1, k2, WARM_QL),
        }
    if awaited_only:
        variants = {label: v for label, v in variants.items() if label.startswith(("floor:", "ql embedded, awaited"))}
    if shutil.which("tsp") and not pace and not awaited_only:
        variants["tsp -f true"] = (lambda k, d: ["sh", "-c", f'TS_SOCKET={d}/ts TMPDIR={d} {PY} -c "$0" "$@"; '
                                                             f'TS_SOCKET={d}/ts tsp -K', LOOP, str(k),
                                                             "tsp", "-f", "true"], k1, k2, 0)
    if shutil.which("nq") and not pace and not awaited_only:
        variants["nq true; nq -w"] = (lambda k, d: ["sh", "-c", f'NQDIR={d}/nq {PY} -c "$0" "$@"', NQ_LOOP,
                                                    str(k)], k1, k2, 0)
    why_not = device_fs_available()
    device = contextlib.nullcontext(None) if why_not else DeviceFs(work)
    written: dict[str, tuple[float, float, float | None]] = {}
    with device as fs:
        if fs:
            # A new file system's first writes cost more than later ones (block groups, bitmaps and the
            # journal used for the first time): one untimed floor run takes them, so the first
            # measured run does not (a 10-task --pace window saw -166 KB per task without it).
            scratch = Path(tempfile.mkdtemp(dir=fs.mount))
            subprocess.run([PY, "-c", FLOOR, str(WARM_FLOOR), str(scratch / "f.db")], env=env, check=True)
            shutil.rmtree(scratch)
        print(f"\n{'per task':<30} {'device':>10} {'vs floor':>9} {'write_bytes':>12} {'fsync+fdatasync':>16}  "
              f"(device: {'fresh ext4 on ' + fs.device if fs else 'n/a, ' + str(why_not)})")
        for label, (make, a, b, warm) in variants.items():
            try:
                # The two the byte goals compare: the median of ``pairs`` measurements each.
                compared = label.startswith(("floor:", "ql embedded, awaited"))
                written[label] = per_task(make, a, b, work, env, warm=warm, device=fs,
                                          pairs=pairs if compared else 1)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                print(f"{label:<30} failed: {exc}")
                continue
            by, sy, dev = written[label]
            base = written["floor: sqlite3 INSERT+COMMIT"]
            main_, base_ = (dev, base[2]) if dev is not None else (by, base[0])
            print(f"{label:<30} {'-' if dev is None else f'{dev / 1024:.1f} KB':>10} "
                  f"{main_ / base_ if base_ else float('nan'):>8.2f}x {by / 1024:>9.1f} KB {sy:>16.3f}  "
                  f"(W {warm}, K {a}/{b})")
    goals: list[tuple[str, bool]] = []
    aw = written.get("ql embedded, awaited")
    fl = written.get("floor: sqlite3 INSERT+COMMIT")
    qr = written.get("ql run -- true")
    if aw and fl:
        what, got, floor = ("on the device", aw[2], fl[2]) if aw[2] is not None else ("write_bytes", aw[0], fl[0])
        what += f", one task per {pace:g} s" if pace else ""
        goals.append((f"awaited task writes <= 24 KB {what} ({got / 1024:.1f} KB)", got <= 24 * 1024))
        goals.append((f"awaited task <= 2 fsync/fdatasync ({aw[1]:.3f})", aw[1] <= 2))
        goals.append((f"awaited task <= 2x the sqlite3 floor in bytes {what} ({got / floor:.2f}x)", got <= 2 * floor))
    if qr:
        goals.append((f"ql run <= 3 fsync/fdatasync ({qr[1]:.3f})", qr[1] <= 3))
    return goals


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """User + sys seconds of one process (and its reaped children), from wait4."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[3:]} exited {proc.returncode}")
    return ru.ru_utime + ru.ru_stime


def median_cpu(argv: list[str], env: dict[str, str], n: int) -> float:
    cpu_of(argv, env)  # warm the page cache
    return statistics.median(cpu_of(argv, env) for _ in range(n))


def paired_medians(a: list[str], b: list[str], env: dict[str, str], n: int) -> tuple[float, float]:
    """Medians of ``a`` and ``b`` run alternately (a, b, a, b, ...): a ratio of the two is not moved
    by the machine's load changing between a block of one and a block of the other."""
    cpu_of(a, env), cpu_of(b, env)  # warm the page cache
    pairs = [(cpu_of(a, env), cpu_of(b, env)) for _ in range(n)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def floor_script(db: Path, sql: str, arg: object = None) -> list[str]:
    params = "()" if arg is None else repr((arg,))
    return [PY, "-c", "import json, sqlite3\n"
            f"c = sqlite3.connect('file:{db}?mode=ro', uri=True)\n"
            f"cur = c.execute({sql!r}, {params})\n"
            "names = [d[0] for d in cur.description]\n"
            "print(json.dumps([dict(zip(names, r)) for r in cur.fetchall()]))\n"]


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return -1


def ctx_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def find_child_of_command(marker: str, timeout: float = 30) -> tuple[int, int] | None:
    """(pid of the ``sleep MARKER`` process, its parent's pid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "cmdline").read_bytes() == b"sleep\0" + marker.encode() + b"\0":
                    ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                    return int(entry.name), ppid
            except OSError:
                continue
        time.sleep(0.1)
    return None


def embedded_cpu(data: Path, n: int, pairs: int = 1) -> tuple[float, float, float, int]:
    """(CPU s per Popen+wait task, CPU s per awaited ql task, ql's ratio to Popen, host Pss KiB) in this
    interpreter: the medians of ``pairs`` measurements, each the Popen host's ``n`` tasks then ql's ``n`` on a runtime
    opened for the pair (its standby factory's CPU counts once it is reaped, at the pair's close), so
    a neighbour's burst on a shared machine moves one pair, not the figure."""
    import resource

    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    def used() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    measured: list[tuple[float, float]] = []
    host = 0
    for _ in range(max(1, pairs)):
        rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=data.parent))
        for _ in range(20):
            rt.run(["true"])
            subprocess.Popen(["true"]).wait()
        t0 = used()
        for _ in range(n):
            subprocess.Popen(["true"]).wait()
        popen = (used() - t0) / n
        t0 = used()
        for _ in range(n):
            rt.run(["true"])
        host = pss_kib(os.getpid())
        # Closed inside the measurement: it reaps the standby factory, whose CPU (one fork per task, and
        # the warm-up's few) counts only once it is reaped (getrusage's children are reaped children).
        rt.close()
        measured.append((popen, (used() - t0) / n))
    return (statistics.median(p for p, _ in measured), statistics.median(q for _, q in measured),
            statistics.median(q / p for p, q in measured), host)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tasks (noisier)")
    parser.add_argument("--dir", default="/var/tmp", help="where data dirs live (a real disk)")
    parser.add_argument("--window", type=float, default=20.0, help="idle wake-up window, seconds")
    parser.add_argument("--cpu-only", action="store_true",
                        help="only the CPU figures (first use, read commands, ql run, embedded per task)")
    parser.add_argument("--bytes-only", action="store_true", help="only the bytes and syncs per task")
    parser.add_argument("--pace", type=float, default=0.0, metavar="SECONDS",
                        help="exploratory: bytes at a device's pace: the floor and an awaited task only, one task "
                             "every SECONDS after the warm-up (try 6: past ext4's 5-second journal commit)")
    parser.add_argument("--pairs", type=int, default=3,
                        help="measurement pairs of the floor and the awaited task (bytes), and of the Popen host and "
                             "the embedded one (CPU per task), their medians reported (default 3)")
    parser.add_argument("--awaited-only", action="store_true",
                        help="with --bytes-only: the floor and an awaited task only (A/B rounds of a schema change: "
                             "run this file with each checkout's interpreter, alternately)")
    args = parser.parse_args()
    q = args.quick
    nreads = 5 if q else 15
    env = dict(os.environ)
    env.pop("QL_DATA_DIR", None)
    # Bytecode caches are written and used, as in a normal install: a PYTHONDONTWRITEBYTECODE
    # environment would recompile ql's modules in every measured `ql` (≈ 2-3x its CPU).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    rows: list[tuple[str, str, str]] = []
    goals: list[tuple[str, bool]] = []

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ql-bench-edge-") as tmp:
        work = Path(tmp)
        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {os.cpu_count()} CPUs  python {sys.version.split()[0]}  "
              f"load {os.getloadavg()[0]:.2f}  dir {args.dir}")

        # -- bytes and syncs per task ------------------------------------------------------------
        if not args.cpu_only:
            goals += bytes_and_syncs(work, env, q, args.pace, awaited_only=args.awaited_only, pairs=args.pairs)
        if args.bytes_only:
            return _print_goals(goals)

        # -- first use, later runs, read commands: CPU -------------------------------------------------
        data = work / "cpu-data"
        later_argv = QL + ["--data-dir", str(data), "run", "--", "true"]
        cpu_of(later_argv, env), cpu_of(later_argv, env)  # its data dir made, the page cache warm
        done = subprocess.run(QL + ["--data-dir", str(data), "--json", "list", "--limit", "1"], env=env,
                              capture_output=True, text=True, check=True)
        run_id = json.loads(done.stdout.splitlines()[0])["run_id"]
        db = data / "ql.db"
        from ql_core.db.journal_sql import EVENT_COLUMNS, RUN_COLUMNS
        from ql_core.db.sqlite_runs import SELECT_RUNS_NEWEST

        floor_status = floor_script(db, f"SELECT {RUN_COLUMNS} FROM ql_run WHERE id = ?", run_id)
        cpu_of(floor_status, env)
        # A first use, a later run and the floor, in turn (the load moves all three alike).
        firsts, laters, floors = [], [], []
        for i in range(5 if q else 11):
            firsts.append(cpu_of(QL + ["--data-dir", str(work / f"first-{i}"), "run", "--", "true"], env))
            laters.append(cpu_of(later_argv, env))
            floors.append(cpu_of(floor_status, env))
        first, later, floor = (statistics.median(x) for x in (firsts, laters, floors))
        reads = {
            "ql status": (QL + ["--data-dir", str(data), "--json", "status", run_id], floor_status),
            # The same SELECT as `ql list` runs (the merge of ix_ql_run_status's per-state ranges,
            # ql_core.db.sqlite_runs): the floor reads what ql reads, no more, no less.
            "ql list": (QL + ["--data-dir", str(data), "--json", "list"],
                        floor_script(db, SELECT_RUNS_NEWEST, 50)),
            "ql events": (QL + ["--data-dir", str(data), "--json", "events", run_id],
                          floor_script(db, f"SELECT {EVENT_COLUMNS} FROM ql_run_event WHERE run_id = ? ORDER BY seq",
                                       run_id)),
            "ql logs": (QL + ["--data-dir", str(data), "logs", run_id], floor_status),
        }
        print(f"\n{'CPU (user+sys), median':<30} {'ms':>9} {'floor ms':>9} {'ratio':>7}")
        print(f"{'python+sqlite3 floor':<30} {floor * 1000:>9.1f} {floor * 1000:>9.1f} {1:>6.2f}x")
        for label, (argv, floor_argv) in reads.items():
            c, f = paired_medians(argv, floor_argv, env, nreads)
            print(f"{label:<30} {c * 1000:>9.1f} {f * 1000:>9.1f} {c / f:>6.2f}x")
            goals.append((f"{label} <= 1.5x its floor in CPU ({c / f:.2f}x)", c <= 1.5 * f))
        print(f"{'ql run -- true (later)':<30} {later * 1000:>9.1f} {floor * 1000:>9.1f} {later / floor:>6.2f}x")
        print(f"{'ql run -- true (first use)':<30} {first * 1000:>9.1f} {later * 1000:>9.1f} {first / later:>6.2f}x "
              "(vs later)")
        goals.append((f"ql run -- true <= 2.5x the floor in CPU ({later / floor:.2f}x)", later <= 2.5 * floor))
        goals.append((f"first use <= 1.5x a later ql run in CPU ({first / later:.2f}x)", first <= 1.5 * later))

        # -- embedded CPU per task, host RSS -----------------------------------------------------------
        popen, ql_cpu, ratio, host_pss = embedded_cpu(work / "emb-data", 100 if q else 400, args.pairs)
        print(f"\n{'embedded CPU per true task':<30} {ql_cpu * 1e3:>7.2f} ms  Popen+wait host {popen * 1e3:.2f} ms  "
              f"{ratio:.2f}x (medians of {args.pairs} pairs)")
        goals.append((f"embedded CPU per task <= 3x the Popen host's ({ratio:.2f}x)", ratio <= 3))

        # -- RSS of launcher and idle supervisor, idle wake-ups ------------------------------------------
        if args.cpu_only:
            print(f"\n{'RSS (Pss)':<30} host {host_pss} KiB (after the awaited loop)")
            return _print_goals(goals)
        marker = f"{1000 + os.getpid() % 1000}.25"
        sup = subprocess.Popen(QL + ["--data-dir", str(data), "supervise"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        # `ql run` waits for its task: it is the host here; the launcher is its child.
        waiter = subprocess.Popen(QL + ["--data-dir", str(data), "run", "--", "sleep", marker], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found = find_child_of_command(marker)
        time.sleep(3)  # the supervisor's start-up is over
        launcher = found[1] if found else None
        s0, l0 = ctx_switches(sup.pid), ctx_switches(launcher) if launcher else 0
        time.sleep(args.window)
        s1, l1 = ctx_switches(sup.pid), ctx_switches(launcher) if launcher else 0
        per_min = 60 / args.window
        print(f"\n{'RSS (Pss)':<30} host {host_pss} KiB (after the awaited loop), launcher "
              f"{pss_kib(launcher) if launcher else -1} KiB, idle supervisor {pss_kib(sup.pid)} KiB")
        print(f"{'idle wake-ups/min':<30} supervisor {(s1 - s0) * per_min:.0f}, launcher of a running task "
              f"{(l1 - l0) * per_min:.0f}")
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup.kill()
            sup.wait()
        if found:
            os.kill(found[0], signal.SIGTERM)  # our own task
        try:
            waiter.wait(timeout=60)
        except subprocess.TimeoutExpired:
            waiter.kill()
            waiter.wait()
        subprocess.run(QL + ["--data-dir", str(data), "list"], env=env, stdout=subprocess.DEVNULL, check=False)

    _print_goals(goals)


def _print_goals(goals: list[tuple[str, bool]]) -> None:
    print("\ngoals (issue 25 acceptance)")
    for label, ok in goals:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")


if __name__ == "__main__":
    main()
