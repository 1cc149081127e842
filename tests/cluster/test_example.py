"""examples/cluster as a new user runs it: `up.sh` twice, `ql run` on the control node, a worker
killed and brought back with `up.sh`, `down.sh` — and afterwards no process of ours is left.

A copy of the example in a temp dir, on a throwaway database and worker role (QL_EXAMPLE_DB,
QL_EXAMPLE_ROLE), so nothing collides with another test or a real `ql_example`. Only the
processes the example started are looked at (the pids in its pid files, their process groups
and sessions, and their descendants), never the rest of the machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from tests.cluster.worker_support import wait_for

pytestmark = pytest.mark.postgres

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster"
ROLES = ("control", "worker-a", "worker-b")


def _stat(pid: int) -> tuple[int, int, int, int] | None:
    """(ppid, pgid, sid, start time) of a live process, None when it is gone (or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def _processes() -> dict[int, tuple[int, int, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            out[int(name)] = st
    return out


def ours(leaders: set[int]) -> dict[int, int]:
    """The processes the example started: the leaders, everything in their groups or sessions, and
    their descendants — pid -> start time (so a reused pid is never mistaken for ours)."""
    table = _processes()
    found = {pid: st[3] for pid, st in table.items() if pid in leaders or st[1] in leaders or st[2] in leaders}
    grew = True
    while grew:
        grew = False
        for pid, st in table.items():
            if pid not in found and st[0] in found:
                found[pid] = st[3]
                grew = True
    return found


def command_of(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def alive(procs: dict[int, int]) -> dict[int, int]:
    return {pid: start for pid, start in procs.items() if (st := _stat(pid)) is not None and st[3] == start}


class Example:
    def __init__(self, root: Path, admin: str) -> None:
        self.dir = root / "cluster"
        shutil.copytree(EXAMPLE, self.dir, ignore=shutil.ignore_patterns(".run"))
        tag = uuid.uuid4().hex[:10]
        self.db, self.role, self.admin = f"ql_ex_{tag}", f"ql_ex_w_{tag}", admin
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        self.env.update({"QL_EXAMPLE_DB": self.db, "QL_EXAMPLE_ROLE": self.role, "QL_ADMIN_URL": admin,
                         "HOME": str(root),
                         "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
        self.started: set[int] = set()

    def sh(self, script: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(self.dir / script), *args], env=self.env, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        for role in ROLES:
            if (pid := self.pid(role)) is not None:
                self.started.add(pid)
        return out

    def pid(self, role: str) -> int | None:
        try:
            return int((self.dir / ".run" / f"{role}.pid").read_text())
        except (OSError, ValueError):
            return None

    def ql(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ql", "--config", str(self.dir / ".run" / "control.toml"), *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def log(self, role: str) -> bytes:
        return (self.dir / ".run" / f"{role}.log").read_bytes()

    def logs(self) -> str:
        return "\n".join(f"--- {r}\n" + self.log(r).decode(errors="replace")[-3000:]
                         for r in ROLES if (self.dir / ".run" / f"{r}.log").exists())

    def workers_up(self) -> bool:
        out = self.ql("--json", "workers")
        return out.returncode == 0 and out.stdout.count('"alive"') >= 2

    def cleanup(self) -> None:
        import psycopg

        for pid in alive(ours(self.started)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{self.role}"')


@pytest.fixture
def example(postgres_admin_dsn: str, tmp_path: Path) -> Iterator[Example]:
    parts = urlsplit(postgres_admin_dsn.replace("postgresql+psycopg://", "postgresql://"))
    if (parts.hostname, parts.port or 5432, parts.username) != ("127.0.0.1", 5432, "postgres"):
        pytest.skip("the example's configs name postgres@127.0.0.1:5432")
    if shutil.which("flock") is None or shutil.which("setsid") is None:
        pytest.skip("the example's scripts need flock and setsid (util-linux)")
    ex = Example(tmp_path, "postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        yield ex
    finally:
        ex.cleanup()


def test_up_twice_run_restart_a_worker_then_down_leaves_nothing_running(example: Example) -> None:
    first = example.sh("up.sh")
    assert first.returncode == 0, first.stderr + first.stdout
    pids = {role: example.pid(role) for role in ROLES}
    assert all(pids.values()), first.stdout
    wait_for(example.workers_up, what="both workers registered", timeout=120, every=0.5, diagnose=example.logs)
    logs_before = {role: example.log(role) for role in ROLES}

    again = example.sh("up.sh")
    assert again.returncode == 0, again.stderr + again.stdout
    for role in ROLES:
        assert f"{role} already running (pid {pids[role]})" in again.stdout, again.stdout
        assert example.pid(role) == pids[role]
        assert example.log(role).startswith(logs_before[role]), f"{role}'s log was truncated"
    assert len([pid for pid in ours(example.started) if command_of(pid)[-1:] == ["control"]]) == 1  # one ql control

    # A new user's first command: the task's lines stream on the control node, its code comes back.
    run = example.ql("run", "--", "sh", "-c", "echo hello from a worker; echo line two; exit 3")
    assert (run.returncode, run.stdout) == (3, "hello from a worker\nline two\n"), run.stderr

    # A worker killed: up.sh starts just that one again, the others are left alone.
    os.killpg(pids["worker-a"], signal.SIGKILL)
    wait_for(lambda: not alive(ours({pids["worker-a"]})), what="worker-a's group gone")
    restarted = example.sh("up.sh")
    assert restarted.returncode == 0, restarted.stderr + restarted.stdout
    assert "started worker-a" in restarted.stdout
    assert example.pid("worker-a") != pids["worker-a"]
    assert (example.pid("control"), example.pid("worker-b")) == (pids["control"], pids["worker-b"])

    # restart.sh: one line stops a worker (it drains) and starts it again.
    before = example.pid("worker-b")
    cycled = example.sh("restart.sh", "worker-b")
    assert cycled.returncode == 0, cycled.stderr + cycled.stdout
    assert "stopped worker-b" in cycled.stdout and "started worker-b" in cycled.stdout
    assert example.pid("worker-b") != before

    running = ours(example.started)
    assert running, "nothing of the example was running before down.sh"
    down = example.sh("down.sh")
    assert down.returncode == 0, down.stderr + down.stdout
    left = alive(ours(example.started) | running)
    assert not left, f"down.sh left processes of the example running: {sorted(left)}\n{example.logs()}"
    assert not any((example.dir / ".run" / f"{role}.pid").exists() for role in ROLES)
