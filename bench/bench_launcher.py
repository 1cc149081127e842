"""Benchmark the launchers (ADR-0007 §6 gate 10): memory of a running launcher and the
submit-to-exec latency it adds over a bare ``subprocess.Popen`` of the same command, for
launcher.sh under each shell found and for the compiled launcher (launcher.c).

    python bench/bench_launcher.py [--runs N]

Memory comes from ``/proc/<launcher>/smaps_rollup`` while the command (``sleep``) runs: Rss, Pss,
private (Private_Clean + Private_Dirty) and Anonymous. Pss and private memory are what a launcher
really costs per task; most of Rss is the shell binary and libc, shared with every other process.

Latency is measured from the call to ``spawn_launcher`` (or ``Popen``) to the moment the command's
first action - writing one byte into a FIFO the benchmark polls - is visible, with
``time.monotonic_ns``. Both arms run the same command (``/bin/sh -c 'printf x >FIFO'``), interleaved,
in the same process; the difference is the launcher's overhead (shell: trampoline exec, token read,
env probe, fork, env exec; compiled: token read, fork). "end" is spawn to process exit (for the launcher: receipt published).
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ql_core.ids import new_id, shard_of  # noqa: E402
from ql_executors.local_process.launch import spawn_launcher  # noqa: E402

TOKEN = "bench-token-" + "x" * 32


def shells() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name in ("dash", "bash"):
        path = shutil.which(name)
        if path:
            found[name] = [path]
    busybox = shutil.which("busybox") or ("/bin/busybox" if os.path.exists("/bin/busybox") else None)
    if busybox:
        found["busybox"] = [busybox, "sh"]
    # launcher.c, built (once, into the user's cache) as the `auto` launcher choice would.
    from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher

    try:
        found["compiled"] = [COMPILED, compiled_launcher(os.environ)]
    except CompiledLauncherError as exc:
        print(f"compiled launcher skipped: {exc}")
    return found


COMPILED = "(compiled)"  # marks the compiled launcher's entry in shells()


def smaps_rollup(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            out[key] = int(parts[0])
    return out


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.log_path = root / "bench.log"

    def _log_fd(self) -> int:
        return os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def launch(self, shell: list[str], command: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        attempt_id = new_id()
        shard = self.root / "receipts" / shard_of(attempt_id)
        shard.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = self._log_fd()
        try:
            which: dict[str, object] = {"compiled": shell[1]} if shell[0] == COMPILED else {"shell": shell}
            proc = spawn_launcher(
                **which,  # type: ignore[arg-type]
                shard_dir=shard,
                run_id=new_id(),
                attempt_id=attempt_id,
                callback_sequence=1,
                started_at_ms=int(time.time() * 1000),
                mode="argv",
                command=command,
                token=TOKEN,
                log_fd=fd,
            )
        finally:
            os.close(fd)
        return proc, shard / f"{attempt_id}.json"

    def bare(self, command: list[str]) -> subprocess.Popen[bytes]:
        fd = self._log_fd()
        try:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            os.close(fd)

    def memory(self, shell: list[str]) -> dict[str, int]:
        proc, _ = self.launch(shell, ["sleep", "30"])
        try:
            deadline = time.monotonic() + 10
            while not any(
                Path(f"/proc/{c}/cmdline").read_bytes().startswith(b"sleep\0")
                for c in children(proc.pid)
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the command never started")
                time.sleep(0.005)
            time.sleep(0.3)  # settle: the launcher is now in its wait loop
            return smaps_rollup(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def python_sidecar_memory(self) -> dict[str, int]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            time.sleep(0.5)
            return smaps_rollup(proc.pid)
        finally:
            proc.kill()
            proc.wait()

    def latency_once(self, shell: list[str] | None) -> tuple[int, int]:
        fifo = self.root / "ready.fifo"
        if fifo.exists():
            fifo.unlink()
        os.mkfifo(fifo, 0o600)
        rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            command = ["/bin/sh", "-c", 'printf x >"$0"', str(fifo)]
            poller = select.poll()
            poller.register(rfd, select.POLLIN)
            t0 = time.monotonic_ns()
            if shell is None:
                proc = self.bare(command)
                receipt = None
            else:
                proc, receipt = self.launch(shell, command)
            while not poller.poll(1000):
                pass
            t_exec = time.monotonic_ns()
            proc.wait()
            t_end = time.monotonic_ns()
            if receipt is not None and not receipt.exists():
                raise RuntimeError("no receipt")
            return t_exec - t0, t_end - t0
        finally:
            os.close(rfd)


def ms(ns: float) -> str:
    return f"{ns / 1e6:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    found = shells()
    print(f"kernel {os.uname().release}  python {sys.version.split()[0]}  runs {args.runs}")
    shown = {name: argv[-1] if name == "compiled" else argv[0] for name, argv in found.items()}
    print(f"launchers: {', '.join(f'{k}={v}' for k, v in shown.items())}\n")
    with tempfile.TemporaryDirectory(prefix="ql-bench-") as tmp:
        bench = Bench(Path(tmp))

        print("memory of a running launcher, kB (from smaps_rollup)")
        print(f"{'':16}{'Rss':>8}{'Pss':>8}{'Private':>9}{'Anon':>8}")
        rows = {name: bench.memory(argv) for name, argv in found.items()}
        rows["python sidecar*"] = bench.python_sidecar_memory()
        for name, m in rows.items():
            private = m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)
            print(f"{name:16}{m['Rss']:8}{m['Pss']:8}{private:9}{m.get('Anonymous', 0):8}")
        print("* for scale: an idle `python -c 'time.sleep()'`, what a per-task Python wrapper costs\n")

        print("submit-to-exec latency, ms (median over runs; ratio = launcher / bare Popen)")
        print(f"{'':10}{'exec':>9}{'bare':>9}{'ratio':>7}{'overhead':>10}  {'end':>9}{'bare':>9}")
        for name, argv in found.items():
            for _ in range(3):  # warm caches
                bench.latency_once(argv)
                bench.latency_once(None)
            lx, bx, le, be = [], [], [], []
            for _ in range(args.runs):
                a, b = bench.latency_once(argv)
                lx.append(a)
                le.append(b)
                a, b = bench.latency_once(None)
                bx.append(a)
                be.append(b)
            mlx, mbx = statistics.median(lx), statistics.median(bx)
            mle, mbe = statistics.median(le), statistics.median(be)
            print(
                f"{name:10}{ms(mlx):>9}{ms(mbx):>9}{mlx / mbx:7.2f}{ms(mlx - mbx):>10}"
                f"  {ms(mle):>9}{ms(mbe):>9}"
            )


if __name__ == "__main__":
    main()
