"""Helpers of the cluster-log tests: the shipped bytes, the local file, a task that writes a known log."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ql_core.paths import log_path
from tests.cluster.worker_support import QL, Harness, Proc, wait_for


def artifact(h: Harness, attempt_id: str) -> dict[str, Any] | None:
    return h.sql.execute("SELECT * FROM ql_artifact WHERE attempt_id = %s", (attempt_id,)).fetchone()


def shipped(h: Harness, attempt_id: str) -> bytes:
    """Every stored chunk, checked to be contiguous from 0 (no hole, no overlap, no duplicate)."""
    out = bytearray()
    for row in h.sql.execute("SELECT byte_offset, length, sha256, data FROM ql_artifact_chunk "
                             "WHERE attempt_id = %s ORDER BY byte_offset", (attempt_id,)).fetchall():
        assert row["byte_offset"] == len(out), f"hole or overlap at {len(out)}"
        data = bytes(row["data"])
        assert len(data) == row["length"] <= 1024 * 1024
        assert hashlib.sha256(data).hexdigest() == row["sha256"]
        out += data
    return bytes(out)


def local_log(h: Harness, worker: str, attempt_id: str) -> bytes:
    log_id = h.sql.execute("SELECT log_artifact_id FROM ql_run_attempt WHERE id = %s", (attempt_id,)).fetchone()
    return Path(log_path(h.worker_dir(worker), log_id["log_artifact_id"])).read_bytes()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_finalized(h: Harness, attempt_id: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for(lambda: (lambda a: a if a is not None and a["status"] == "final" else None)(
        artifact(h, attempt_id)), timeout=timeout, what=f"the log of {attempt_id} to be finalized",
        diagnose=h.logs)


def assert_shipped_equals_local(h: Harness, worker: str, attempt_id: str) -> bytes:
    art = wait_finalized(h, attempt_id)
    data = shipped(h, attempt_id)
    local = local_log(h, worker, attempt_id)
    assert len(data) == art["total_bytes"] == len(local), (len(data), art["total_bytes"], len(local))
    assert sha(data) == art["sha256"] == sha(local)
    return data


def writer_command(lines: int, *, pause_every: int = 0, pause_s: float = 0.05, width: int = 100) -> list[str]:
    """A task that prints ``lines`` numbered lines of ``width`` bytes (pausing now and then)."""
    script = ("i=0; while [ $i -lt %d ]; do printf '%%08d %%0%dd\\n' $i 0; i=$((i+1)); "
              % (lines, width - 10))
    if pause_every:
        script += f"if [ $((i % {pause_every})) -eq 0 ]; then sleep {pause_s}; fi; "
    script += "done"
    return ["sh", "-c", script]


def bulk_command(mib: int, *, pieces: int = 1, pause_s: float = 0.0) -> list[str]:
    """A task that writes ``mib`` MiB of random bytes in ``pieces`` parts (pausing between them)."""
    per = mib // pieces
    script = f"for p in $(seq {pieces}); do head -c {per}M /dev/urandom; sleep {pause_s}; done"
    return ["sh", "-c", script]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


__all__ = ["artifact", "shipped", "local_log", "sha", "wait_finalized", "assert_shipped_equals_local",
           "writer_command", "bulk_command", "rss_kib", "Client", "run_id_of", "Streamed", "streamed"]


class Client:
    """A `ql` command on the control profile, its stdout collected by a thread as it arrives."""

    def __init__(self, harness: Harness, args: list[str], *, config: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        env.update({"QL_CONFIG": str(config or harness.control_config()), "HOME": str(harness.root)})
        self.proc = subprocess.Popen(QL + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self.out = bytearray()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while piece := self.proc.stdout.read1(65536):
            self.out += piece

    def finish(self, timeout: float = 120) -> tuple[int, bytes, str]:
        rc = self.proc.wait(timeout)
        self._thread.join(10)
        assert self.proc.stderr is not None
        return rc, bytes(self.out), self.proc.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def run_id_of(harness: Harness) -> str:
    """The one run of this test's database (ql run prints no id in text mode)."""
    row = wait_for(lambda: harness.sql.execute("SELECT id FROM ql_run").fetchone(), what="the run",
                   diagnose=harness.logs)
    return row["id"]


@dataclass
class Streamed:
    """A task streaming on the control node (:func:`streamed`): its worker, the `ql` client that
    submitted it, its run, and the `ql logs -f` following it (if asked for)."""

    worker: Proc
    client: Client
    run_id: str
    follower: Client | None = None

    def finish(self) -> tuple[tuple[int, bytes, str], tuple[int, bytes, str]]:
        """``(rc, stdout, stderr)`` of the client, then of the follower, once both have ended."""
        assert self.follower is not None, "streamed(..., follow=True) makes the follower"
        return self.client.finish(), self.follower.finish()


@contextmanager
def streamed(harness: Harness, *args: str, script: str = 'echo "started"; sleep 60', first: bytes = b"started\n",
             follow: bool = False) -> Iterator[Streamed]:
    """`ql control` and `ql worker` "a", then `ql <args> -- sh -c <script>` on the control node until its
    stdout is ``first`` (the task is running on the worker); with ``follow``, a `ql logs -f` of the run
    too, until it printed the same. Whichever client is still running on leaving is killed."""
    harness.start_control()
    worker = harness.start_worker("a")
    client = Client(harness, [*args, "--", "sh", "-c", script])
    follower = None
    try:
        wait_for(lambda: bytes(client.out) == first, what=f"{first!r} on `ql {args[0]}`'s stdout",
                 diagnose=lambda: harness.logs() + f"\nstdout so far: {bytes(client.out)!r}")
        run_id = run_id_of(harness)
        if follow:
            follower = Client(harness, ["logs", "-f", run_id])
            wait_for(lambda: bytes(follower.out) == first, what="the follower's first line", diagnose=harness.logs)
        yield Streamed(worker, client, run_id, follower)
    finally:
        client.close()
        if follower is not None:
            follower.close()
