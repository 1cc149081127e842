"""Live logs and wake-ups: what the watchfiles wake-up buys and costs, and that followers cost the task nothing.

Run: ``python bench/bench_logs.py [--trials N] [--idle-s S] [--mb MB] [--dir DIR]``.

1. **Completion latency after a host restart.** A task is started by ``ql run --detach`` (that host is
   gone); a fresh supervisor starts, its first round (the startup reconciliation) finds the task still
   running; then the task ends. Latency = commit time of the terminal event − the finish time the
   receipt proves. With watchfiles the supervisor sleeps a 30 s interval and is woken by the receipt;
   without it, it scans every 5 s (the standalone default) — so the expected latency is ~U(0, 5 s).
2. **Idle cost of the receipts watcher** over ``--idle-s`` seconds (default 20), measured in a child
   process per variant with a supervisor sleeping a 30 s interval and all 256 receipt shard directories
   present: CPU time (user+sys) over the window, RSS, Python threads, OS threads, inotify watches.
3. **Task runtime with and without a stalled follower.** The task writes ``--mb`` MiB (1 MiB writes)
   to its log. Variants: no follower; a follower that reads everything; a follower generator that read
   once and is never advanced again; ``ql logs --follow`` whose stdout pipe nobody reads (it blocks);
   the stalled generator again with the watchfiles wake-up on. Reported: the task's own write-loop
   time as the task measures it (what back-pressure would slow), median and min of ``--trials`` runs
   (variants interleaved, so page-cache writeback noise spreads over all of them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

QL = [sys.executable, "-m", "ql_core.cli.main"]


def _config(directory: Path, *, plugins: tuple[str, ...], extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ql.toml"
    names = ", ".join(f'"{p}"' for p in plugins)
    path.write_text(f'profile = "standalone"\nplugins = [{names}]\ndata_dir = "data"\n{extra}')
    return path


def _open(config: Path) -> Any:
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    return Runtime.open(load_config(config_path=config, environ={}, cwd=config.parent), environ={})


def _env(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_CONFIG"] = str(config)
    return env


# -- 1. completion latency after a restart ----------------------------------------------------


def restart_latency(base: Path, *, watch: bool, trials: int) -> list[int]:
    config = _config(base / ("lat-watch" if watch else "lat-scan"), plugins=("watchfiles",) if watch else ())
    interval = 30.0 if watch else 5.0
    latencies = []
    for _ in range(trials):
        out = subprocess.run(QL + ["--json", "run", "--detach", "--", "sh", "-c", "sleep 2.5; exit 3"],
                             env=_env(config), capture_output=True, text=True, check=True)
        run_id = json.loads(out.stdout.splitlines()[-1])["run_id"]
        rt = _open(config)  # the restarted host
        supervisor = rt.supervisor(interval_s=interval)
        waker = rt.start_wakeups(supervisor)
        assert (waker is not None) == watch
        supervisor.start()
        try:
            while supervisor.rounds < 1:
                time.sleep(0.01)
            if rt.status(run_id).terminal:
                print("   (a trial ended before the first round: machine too busy; skipped)")
                continue
            while not rt.status(run_id).terminal:
                time.sleep(0.02)
            view = rt.status(run_id)
            event = [e for e in rt.events(run_id) if e["type"] == f"run.{view.status}"][0]
            latencies.append(event["at_ms"] - view.finished_at_ms)
        finally:
            if waker is not None:
                waker.stop()
            supervisor.stop()
            rt.close()
    return latencies


# -- 2. idle cost ---------------------------------------------------------------------------------


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def _inotify_watches() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                count += sum(1 for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                             if line.startswith("inotify wd:"))
        except OSError:
            continue
    return count


def idle_child(directory: Path, watch: bool, seconds: float) -> dict[str, Any]:
    """Runs in a child process: a supervisor with (or without) the watcher, idle for ``seconds``."""
    config = _config(directory, plugins=("watchfiles",) if watch else ())
    rt = _open(config)
    root = rt.config.data_dir / "receipts"
    for shard in range(256):
        (root / f"{shard:02x}").mkdir(mode=0o700, exist_ok=True)
    supervisor = rt.supervisor(interval_s=30.0)
    rss_before = _rss_kib()
    waker = rt.start_wakeups(supervisor)
    supervisor.start()
    while supervisor.rounds < 1:
        time.sleep(0.01)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "variant": "watchfiles" if watch else "no watcher",
        "cpu_ms": round(1000 * ((usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)), 1),
        "rss_kib_before": rss_before,
        "rss_kib_after": _rss_kib(),
        "py_threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "inotify_watches": _inotify_watches(),
        "wakeup_batches": getattr(waker, "batches", 0),
    }
    if waker is not None:
        waker.stop()
    supervisor.stop()
    rt.close()
    return result


def idle_cost(base: Path, seconds: float) -> list[dict[str, Any]]:
    results = []
    for watch in (False, True):
        out = subprocess.run([sys.executable, __file__, "--idle-child", str(base / f"idle-{watch}"),
                              "--watch" if watch else "--no-watch", "--idle-s", str(seconds)],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.splitlines()[-1]))
    return results


# -- 3. task runtime vs followers ---------------------------------------------------------------


def _writer(mb: int, gate: Path) -> list[str]:
    """Waits for ``gate/go0``, writes one line, waits for ``gate/go1``, then writes ``mb`` MiB in 1 MiB
    writes to stdout (its log) and records its own write-loop time in ``gate/time``."""
    code = ("import os, sys, time\ngate = sys.argv[1]\n"
            "def wait(name):\n"
            "    while not os.path.exists(os.path.join(gate, name)): time.sleep(0.002)\n"
            "wait('go0'); os.write(1, b'hello\\n'); wait('go1')\n"
            "b = b'x' * (1 << 20)\nt0 = time.perf_counter()\n"
            f"for _ in range({mb}): os.write(1, b)\n"
            "open(os.path.join(gate, 'time'), 'w').write(repr(time.perf_counter() - t0))\n")
    return [sys.executable, "-c", code, str(gate)]


def task_runtime(base: Path, *, mb: int, trials: int) -> dict[str, tuple[float, float]]:
    """name -> (median, min) of the task's own write-loop time, as the task measured it.

    The task writes its big loop only once the follower is in place: the generator followers have
    waited for (and got) the first line and are then never advanced again; ``ql logs -f`` has had
    a second to start and is blocked on its full stdout pipe.
    """
    from ql_core.follow import follow_log

    plain_cfg = _config(base / "rt-plain", plugins=())
    watch_cfg = _config(base / "rt-watch", plugins=("watchfiles",))
    loops: dict[str, list[float]] = {}
    counter = iter(range(1_000_000))

    def timed(rt: Any, name: str, follower: str | None) -> None:
        gate = base / f"gate-{next(counter)}"
        gate.mkdir()
        sub = rt.submit(_writer(mb, gate), log_max_bytes=1 << 40)
        kept: list[Any] = []
        helper: threading.Thread | None = None
        proc = None
        if follower == "reading":
            first = threading.Event()

            def read_all() -> None:
                for _ in follow_log(rt, sub.run_id, follow=True):
                    first.set()
            helper = threading.Thread(target=read_all)
            helper.start()
            (gate / "go0").touch()
            first.wait(30)
        elif follower == "stalled":
            gen = follow_log(rt, sub.run_id, follow=True)
            kept.append(gen)
            helper = threading.Thread(target=lambda: kept.append(next(gen)))  # waits for the first line
            helper.start()
            time.sleep(0.3)
            (gate / "go0").touch()
            helper.join(30)
            helper = None
        elif follower == "blocked-cli":
            proc = subprocess.Popen(QL + ["logs", sub.run_id, "--follow"], env=_env(plain_cfg),
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            (gate / "go0").touch()
            time.sleep(0.3)
        else:
            (gate / "go0").touch()
        (gate / "go1").touch()
        assert sub.task is not None
        sub.task.live.process.wait()
        loops.setdefault(name, []).append(float((gate / "time").read_text()))
        rt.wait(sub)
        if kept:
            kept[0].close()
        if helper is not None:
            helper.join()
        if proc is not None:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        os.unlink(rt.log_path(sub.run_id))
        shutil.rmtree(gate)

    plain, watched = _open(plain_cfg), _open(watch_cfg)
    try:
        for _ in range(trials):
            timed(plain, "no follower", None)
            timed(plain, "follower reading everything", "reading")
            timed(plain, "stalled follower (generator)", "stalled")
            timed(plain, "stalled `ql logs -f` (pipe never read)", "blocked-cli")
            timed(watched, "stalled follower + watchfiles", "stalled")
    finally:
        plain.close()
        watched.close()
    return {name: (statistics.median(times), min(times)) for name, times in loops.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--dir", help="where to put the data dirs (default: a temp dir under /var/tmp)")
    parser.add_argument("--idle-child", help=argparse.SUPPRESS)
    parser.add_argument("--watch", dest="watch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-watch", dest="watch", action="store_false", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.idle_child:
        print(json.dumps(idle_child(Path(args.idle_child), args.watch, args.idle_s)))
        return

    base = Path(tempfile.mkdtemp(prefix="ql-bench-logs-", dir=args.dir or "/var/tmp"))
    try:
        import watchfiles

        print(f"ql bench_logs — python {sys.version.split()[0]}, watchfiles {watchfiles.__version__}, "
              f"{os.cpu_count()} CPUs, data under {base}")
        print("\n1. completion latency after a host restart (terminal commit − receipt finish time)")
        for watch in (False, True):
            lat = restart_latency(base, watch=watch, trials=args.trials)
            label = "watchfiles, 30 s interval" if watch else "no watcher, 5 s interval"
            print(f"   {label:28s} median {statistics.median(lat):6.0f} ms   min {min(lat):6d}   "
                  f"max {max(lat):6d}   ({', '.join(map(str, lat))})")
        print(f"\n2. idle cost over {args.idle_s:g} s (supervisor idle, 256 receipt shards present)")
        for r in idle_cost(base, args.idle_s):
            print(f"   {r['variant']:12s} cpu {r['cpu_ms']:7.1f} ms  rss {r['rss_kib_before']:7d} → "
                  f"{r['rss_kib_after']:7d} KiB  py threads {r['py_threads']}  os threads {r['os_threads']}  "
                  f"inotify watches {r['inotify_watches']}  wake-up batches {r['wakeup_batches']}")
        print(f"\n3. task writing {args.mb} MiB to its log: its own write-loop time, "
              f"median (min) of {args.trials}")
        for name, (median, best) in task_runtime(base, mb=args.mb, trials=args.trials).items():
            print(f"   {name:40s} {median * 1000:8.1f} ms  ({best * 1000:.1f})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
