"""A primary PostgreSQL cluster and its streaming replica on this machine, for the failover tests.

Both are started from the machine's server binaries (the directory of ``pg_ctl``, found as
tests/postgres_server.py finds it) in a temp dir of their own, each on a free port, trust
authentication on 127.0.0.1 only. As root they run as the ``postgres`` user (PostgreSQL refuses
root), through ``setpriv``, from ``/``. The replica is ``pg_basebackup -R`` of the primary.

What the tests do to them is what happens to a real pair: the replica is made synchronous
(``synchronous_standby_names`` + ``synchronous_commit = remote_apply``), or cut off from the
primary's WAL (``primary_conninfo = ''``, so the primary's last commits never reach it); the primary
is killed (SIGKILL to its postmaster and every child, as a lost host); the replica is promoted
(``pg_ctl promote``). Nothing is mocked. At the end both are stopped and the temp dir removed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tests.postgres_server import Unavailable, find_pg_ctl, server_user

__all__ = ["PgNode", "PgPair", "pg_pair"]

SUPERUSER = "postgres"
#: Server settings of both nodes (the replica inherits them from the base backup).
_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "100",
    "shared_buffers": "32MB",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "wal_keep_size": "256MB",
    "hot_standby": "on",
    "fsync": "off",  # nothing here survives a power loss, and the old primary is never restarted
    "log_min_messages": "warning",
}
#: Every wait of a server command (a loaded 2-core machine can be very slow).
TIMEOUT_S = 180


@dataclass
class PgNode:
    """One PostgreSQL cluster (data dir, port) run as ``user`` (None: as ourselves)."""

    name: str
    bin_dir: Path
    base: Path
    port: int
    user: pwd.struct_passwd | None

    @property
    def data(self) -> Path:
        return self.base / self.name

    @property
    def log(self) -> Path:
        return self.base / f"{self.name}.log"

    @property
    def conninfo(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def command(self, tool: str, *args: str) -> list[str]:
        argv = [str(self.bin_dir / tool), *args]
        if self.user is None:
            return argv
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}", "--clear-groups", "--",
                *argv]

    def run(self, tool: str, *args: str) -> str:
        """A server tool as the server's user; its output. Raises with the tail of its output on failure."""
        done = subprocess.run(self.command(tool, *args), cwd="/", capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-6:])
            log = self.log.read_text(errors="replace").strip().splitlines()[-6:] if self.log.exists() else []
            raise AssertionError(f"{tool} {' '.join(args[:3])} on {self.name} exited {done.returncode}: {tail}"
                                 + (f"\n--- {self.name}.log ---\n" + "\n".join(log) if log else ""))
        return done.stdout

    def configure(self, settings: dict[str, str]) -> None:
        """Append to postgresql.conf (a later line wins over an earlier one)."""
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("".join(f"{k} = {v}\n" for k, v in settings.items()))

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(TIMEOUT_S), "start")

    def promote(self) -> None:
        """End recovery: the replica becomes a primary on a new timeline (waits until it accepts writes)."""
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", str(TIMEOUT_S), "promote")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def kill(self) -> int:
        """SIGKILL the postmaster and every process it started, at once (the host is gone). Returns
        how many processes were killed."""
        pid = self.postmaster_pid()
        if pid is None:
            return 0
        victims = [pid] + _children(pid)
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        return len(victims)

    def stop(self) -> None:
        """Stop it if it still runs (teardown: immediate mode, then whatever is left is killed)."""
        pid = self.postmaster_pid()
        if pid is None or not _alive(pid):
            return
        with contextlib.suppress(Exception):
            subprocess.run(self.command("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"), cwd="/",
                           capture_output=True, timeout=60, check=False)
        if _alive(pid):
            self.kill()

    # -- SQL ---------------------------------------------------------------------------------------
    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One statement on its own autocommit connection; its rows (none for a command)."""
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def value(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def alter_system(self, **settings: str) -> None:
        """``ALTER SYSTEM SET`` each setting, then reload (postgresql.auto.conf is this node's own file)."""
        for key, value in settings.items():
            self.sql(f"ALTER SYSTEM SET {key} = '{value}'")
        self.sql("SELECT pg_reload_conf()")


def _children(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (the postmaster's backends and auxiliary processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(predicate: Any, what: str, timeout: float = TIMEOUT_S) -> Any:
    from ql_core.testing.executor import wait_until

    return wait_until(predicate, what, timeout, interval=0.1)


@dataclass
class PgPair:
    """The primary, its streaming replica, and the one multi-host URL a client is given."""

    primary: PgNode
    replica: PgNode

    @property
    def url(self) -> str:
        """Both hosts, the writable one chosen by libpq (``target_session_attrs=read-write``)."""
        return (f"postgresql://{SUPERUSER}@127.0.0.1:{self.primary.port},127.0.0.1:{self.replica.port}/postgres"
                f"?target_session_attrs=read-write")

    def make_synchronous(self) -> None:
        """Every commit on the primary waits until the replica applied it (``remote_apply``)."""
        self.primary.alter_system(synchronous_standby_names="*", synchronous_commit="remote_apply")
        _wait(lambda: self.primary.value("SELECT sync_state FROM pg_stat_replication") == "sync",
              "the replica to be the primary's synchronous standby")

    def cut_replication(self) -> str:
        """Stop the replica's WAL receiver for good (``primary_conninfo = ''``): what the primary
        commits from now on never reaches it. Returns the last WAL position the replica received."""
        self.replica.alter_system(primary_conninfo="")
        _wait(lambda: self.replica.value("SELECT count(*) FROM pg_stat_wal_receiver") == 0
              and self.primary.value("SELECT count(*) FROM pg_stat_replication") == 0,
              "the replica's WAL receiver to stop")
        return str(self.replica.value("SELECT pg_last_wal_receive_lsn()"))

    def fail_over(self, outage_s: float = 0.0) -> int:
        """The primary's host is lost (SIGKILL, every process of it); ``outage_s`` later (the HA tool
        noticing, no host taking writes meanwhile) the replica is promoted. Returns the wall clock
        (ms) just before the promotion: every answer a client recorded by then came from the old
        primary (the new one answers nothing before it is promoted)."""
        assert self.primary.kill() > 0, "the primary was not running"
        _wait(lambda: not _alive_port(self.primary.port), "the old primary's port to close", timeout=60)
        time.sleep(outage_s)
        before_promotion_ms = int(time.time() * 1000)
        self.replica.promote()
        _wait(lambda: self.replica.value("SELECT pg_is_in_recovery()") is False, "the replica to accept writes")
        return before_promotion_ms


def _alive_port(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def pg_pair() -> Iterator[PgPair]:
    """A fresh primary and its streaming replica (asynchronous until :meth:`PgPair.make_synchronous`)."""
    pg_ctl = find_pg_ctl()
    if pg_ctl is None:
        raise Unavailable("no PostgreSQL server binaries (pg_ctl) found: install postgresql")
    bin_dir = Path(pg_ctl).resolve().parent  # /usr/local/bin/pg_ctl may be a link to the real directory
    for tool in ("initdb", "pg_basebackup"):
        if not (bin_dir / tool).exists():
            raise Unavailable(f"no {tool} next to {pg_ctl}: install the PostgreSQL server package")
    from port_for import get_port

    user = server_user()
    base = Path(tempfile.mkdtemp(prefix="ql-test-pg-pair-"))
    nodes: list[PgNode] = []
    try:
        if user is not None:
            os.chown(base, user.pw_uid, user.pw_gid)
        ports = [get_port(None), get_port(None)]
        while ports[1] == ports[0]:
            ports[1] = get_port(None)
        primary = PgNode("primary", bin_dir, base, int(ports[0]), user)
        replica = PgNode("replica", bin_dir, base, int(ports[1]), user)
        nodes += [primary, replica]
        primary.run("initdb", "-D", str(primary.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C",
                    "--no-sync")
        primary.configure({**_SETTINGS, "port": str(primary.port), "unix_socket_directories": f"'{base}'"})
        primary.start()
        replica.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", SUPERUSER, "-D",
                    str(replica.data), "-R", "-X", "stream", "-c", "fast", "--no-sync")
        replica.configure({"port": str(replica.port)})
        replica.start()
        pair = PgPair(primary, replica)
        _wait(lambda: primary.value("SELECT state FROM pg_stat_replication") == "streaming",
              "the replica to stream from the primary")
        yield pair
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(base, ignore_errors=True)
