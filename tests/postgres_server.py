"""The PostgreSQL server of a test session: ``QL_TEST_POSTGRES_DSN`` when given, else a throwaway
server started from the machine's PostgreSQL binaries (``pg_ctl``) with pytest-postgresql, stopped
and removed when the session ends.

PostgreSQL refuses to run as root (``initdb``/``pg_ctl``: "cannot be run as root"); as root the
throwaway server runs as the ``postgres`` user (else ``nobody``) through a small ``pg_ctl`` wrapper
in a directory of its own that user owns. Trust authentication on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

__all__ = ["POSTGRES_DSN_ENV", "find_pg_ctl", "server_user", "throwaway_postgres", "Unavailable"]

POSTGRES_DSN_ENV = "QL_TEST_POSTGRES_DSN"
_SERVER_USER = "postgres"  # the cluster's superuser (initdb --username)


class Unavailable(Exception):
    """No throwaway server can be had here; the message names why and the fix."""


def find_pg_ctl() -> str | None:
    """``pg_ctl`` on PATH, else the newest under /usr/lib/postgresql/*/bin (Debian, Ubuntu)."""
    found = shutil.which("pg_ctl")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return candidates[-1] if candidates else None


def server_user() -> pwd.struct_passwd | None:
    """The unprivileged user the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise Unavailable("running as root and neither a 'postgres' nor a 'nobody' user exists "
                      f"(PostgreSQL refuses root): set {POSTGRES_DSN_ENV}")


def _await_ready(port: int, timeout_s: float = 120.0) -> None:
    """Until the server accepts a connection: its port opens while it still says "the database
    system is starting up" (bounded: the error of the last try)."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(f"postgresql://{_SERVER_USER}@127.0.0.1:{port}/postgres", connect_timeout=5).close()
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise Unavailable(f"the throwaway PostgreSQL did not accept connections within "
                                  f"{timeout_s:g} s: {str(exc).splitlines()[0]}") from None
            time.sleep(0.1)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a fresh PostgreSQL cluster; yield its admin DSN (``postgresql+psycopg://``)."""
    pg_ctl = find_pg_ctl()
    if pg_ctl is None:
        raise Unavailable(f"no PostgreSQL server binaries (pg_ctl) found: install postgresql or "
                          f"set {POSTGRES_DSN_ENV}=postgresql+psycopg://user@host/db")
    try:
        from port_for import get_port
        from pytest_postgresql.executors import PostgreSQLExecutor
    except ImportError:
        raise Unavailable("pytest-postgresql is not installed (pip install -e '.[dev]') and "
                          f"{POSTGRES_DSN_ENV} is not set") from None
    user = server_user()
    base = Path(tempfile.mkdtemp(prefix="ql-test-pg-"))
    try:
        executable = pg_ctl
        if user is not None:
            os.chown(base, user.pw_uid, user.pw_gid)
            # The wrapper: pg_ctl as that user, from / (the caller's cwd may be a 0700 dir).
            wrapper = base / "pg_ctl"
            wrapper.write_text("#!/bin/sh\ncd / || exit 1\n"
                               f"exec setpriv --reuid={user.pw_uid} --regid={user.pw_gid} "
                               f"--clear-groups -- '{pg_ctl}' \"$@\"\n")
            wrapper.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
            executable = str(wrapper)
        port = get_port(None)
        assert port is not None
        executor = PostgreSQLExecutor(
            executable=executable, host="127.0.0.1", port=port, datadir=str(base / "data"),
            unixsocketdir=str(base), logfile=str(base / "server.log"), startparams="-w",
            dbname="postgres", user=_SERVER_USER, timeout=120,
            postgres_options="-c fsync=off -c max_connections=300",
        )
        try:
            executor.start()
        except Exception as exc:
            log = base / "server.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise Unavailable(f"the throwaway PostgreSQL from {pg_ctl} did not start: "
                              f"{type(exc).__name__}: {' '.join(tail) or exc}") from None
        try:
            _await_ready(port)
            yield f"postgresql+psycopg://{_SERVER_USER}@127.0.0.1:{port}/postgres"
        finally:
            with contextlib.suppress(Exception):
                subprocess.run([executable, "stop", "-D", str(base / "data"), "-m", "immediate",
                                "-w"], capture_output=True, timeout=120, check=False)
            with contextlib.suppress(Exception):
                executor.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
