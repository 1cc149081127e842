"""Shared fixtures: real data dirs, real SQLite files, a real PostgreSQL, the real `ql` command."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from .postgres_server import POSTGRES_DSN_ENV, throwaway_postgres
from .postgres_server import Unavailable as PostgresUnavailable

QL = [sys.executable, "-m", "ql_core.cli.main"]


# -- libfaketime's leftovers ---------------------------------------------------------------------
# libfaketime 0.9.10, preloaded into the skewed-clock tests' processes, leaves a pid-named
# /dev/shm/faketime_shm_PID and sem.faketime_sem_PID for each faked process that forks, and never
# removes them. A faked process's descendants open its pair by name (FAKETIME_SHARED) and exit when
# it is gone, so nothing is removed while any process still has libfaketime loaded; otherwise each
# test session removes what appeared while it ran (what a late task left goes with the next CI run's
# start, .ci/run).
_SHM = "/dev/shm"


def _faketime_leftovers() -> set[str]:
    try:
        return {n for n in os.listdir(_SHM) if n.startswith(("faketime_shm_", "sem.faketime_sem_"))}
    except OSError:
        return set()


def _libfaketime_in_use() -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/maps", "rb") as maps:
                    if b"libfaketime" in maps.read():
                        return True
            except OSError:
                continue  # gone, or not ours to read
    return False


@pytest.fixture(scope="session", autouse=True)
def _no_faketime_leftovers() -> Iterator[None]:
    before = _faketime_leftovers()
    yield
    new = _faketime_leftovers() - before
    if new and not _libfaketime_in_use():
        for name in new:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(_SHM, name))


# -- pre-migrated templates: the Alembic migration runs once per session, not once per test ---------
TEMPLATE_DB_NAME = "ql.db"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run database at schema head, made ONCE per test session the way ql makes one (the edge
    store creates the file 0600 and runs the real Alembic migration in a child process). Never
    opened again: tests get a byte copy (:func:`seed_data_dir`), so each test's history is its own."""
    from ql_core.db.migrate import SCHEMA_HEAD
    from ql_plugins.edge_sqlite.store import SqliteJournal

    where = tmp_path_factory.mktemp("ql-template")
    path = where / TEMPLATE_DB_NAME
    journal = SqliteJournal(f"sqlite:///{path}")
    try:
        assert journal.connections.schema_revision() == SCHEMA_HEAD
    finally:
        journal.close()
    # ql's connections leave the WAL for the next process (no checkpoint on close); a byte copy of
    # ql.db alone needs it folded in first. A plain connection's close then removes the side files.
    import sqlite3

    plain = sqlite3.connect(path)
    try:
        plain.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        plain.close()
    leftovers = sorted(p.name for p in where.iterdir() if p.name.startswith(TEMPLATE_DB_NAME + "-"))
    assert not leftovers, f"the template database is still open somewhere: {leftovers}"
    return path


def seed_data_dir(directory: Path, template: Path) -> Path:
    """Make ``directory`` (0700) a fresh data dir whose run database is a copy of ``template``
    (a file copy while nothing holds the template open; the copy is created 0600 like ql's own)."""
    import shutil

    directory.mkdir(mode=0o700, exist_ok=True)
    target = directory / TEMPLATE_DB_NAME
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)
    shutil.copyfile(template, target)
    return directory


@pytest.fixture
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """This test's data dir (0700). Its run database is already migrated (a copy of the session's
    :func:`sqlite_template`); tests marked ``fresh_data_dir`` (first use, migration, a missing
    database) get an empty directory and let ql create and migrate it."""
    d = tmp_path / "data"
    if request.node.get_closest_marker("fresh_data_dir") is not None:
        d.mkdir(mode=0o700)
        return d
    return seed_data_dir(d, request.getfixturevalue("sqlite_template"))


@pytest.fixture
def ql_env(data_dir: Path, tmp_path: Path) -> dict[str, str]:
    """Environment for a `ql` subprocess: this test's data dir, no stray config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_") or k == POSTGRES_DSN_ENV}
    env["QL_DATA_DIR"] = str(data_dir)
    env["HOME"] = str(tmp_path)
    return env


def classic_env(env: dict[str, str], tmp: Path) -> dict[str, str]:
    """``env`` for `ql` processes that start tasks the classic way (``[plugin.local] standby =
    false``: launcher spawned after the create commit, handle in a commit of its own), keeping the
    config file ``env`` already names (its other settings stay)."""
    base = Path(env["QL_CONFIG"]).read_text() if env.get("QL_CONFIG") else ""
    config = tmp / "classic.toml"
    config.write_text(base + "\n[plugin.local]\nstandby = false\n")
    return dict(env, QL_CONFIG=str(config))


def run_ql(args: list[str], env: dict[str, str], *, timeout: float = 60, cwd: Path | None = None,
           input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(QL + args, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, input=None if input is None else input.decode())


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def status_json(env: dict[str, str], run_id: str) -> dict:
    """``ql --json status RUN``'s run record (the command must succeed)."""
    out = run_ql(["--json", "status", run_id], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])


def detach_json(env: dict[str, str], *args: str) -> dict:
    """``ql --json run --detach ARGS``'s first line: run_id and attempt_id."""
    out = run_ql(["--json", "run", "--detach", *args], env)
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)[0]


def published_receipt(data_dir: Path, attempt_id: str, bound_s: float = 60) -> dict:
    """The receipt file of ``attempt_id`` once it is there (bounded wait)."""
    from ql_core.testing.executor import wait_until

    path = data_dir / "receipts" / attempt_id[-2:] / f"{attempt_id}.json"
    wait_until(path.exists, "the receipt", bound_s, interval=0.05)
    return json.loads(path.read_text())


def release_host(host: subprocess.Popen[str], go: Path) -> None:
    """A test's clean-up of a `ql` host whose task waits for the file ``go``: let the task end, then
    kill and reap the host if it still runs (a failed assertion leaves no process behind)."""
    go.touch()
    if host.poll() is None:
        host.kill()
        host.communicate()


def await_open(host: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    """Until ``host`` printed its first line (``open``: its runtime is open), bounded by ``timeout``;
    a host that died first is fine (its end of file reads as an empty line)."""
    assert host.stdout is not None
    ready, _, _ = select.select([host.stdout], [], [], timeout)
    assert ready, f"{what} did not open its runtime within {timeout:g} s"
    host.stdout.readline()


@pytest.fixture
def runtime(data_dir: Path):
    """An opened edge runtime on a real SQLite file in a temp data dir."""
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    yield rt
    rt.close()


@pytest.fixture
def classic_runtime(data_dir: Path):
    """An edge runtime whose tasks start the classic way (``[plugin.local] standby = false``): the
    launcher spawned after the create commit, its handle in a commit of its own."""
    import dataclasses

    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    config = load_config(data_dir=data_dir, environ={}, cwd=data_dir)
    rt = Runtime.open(dataclasses.replace(config, plugin_settings={"local": {"standby": False}}))
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def postgres_admin_dsn() -> Iterator[str]:
    """The PostgreSQL server of this session (an admin DSN, ``postgresql+psycopg://``): the one
    ``QL_TEST_POSTGRES_DSN`` names, else a throwaway server started from the machine's ``pg_ctl``
    (see tests/postgres_server.py). Skipped with the reason where neither can be had, except under
    CI=true, where that is a failure."""
    in_ci = os.environ.get("CI") == "true"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        reason = "psycopg is not installed: pip install -e '.[dev]'"
        pytest.fail(reason) if in_ci else pytest.skip(reason)
    dsn = os.environ.get(POSTGRES_DSN_ENV)
    if dsn:
        yield dsn
        return
    with contextlib.ExitStack() as stack:
        try:
            dsn = stack.enter_context(throwaway_postgres())
        except PostgresUnavailable as exc:
            pytest.fail(f"CI=true: {exc}") if in_ci else pytest.skip(f"no PostgreSQL: {exc}")
        yield dsn


@pytest.fixture(scope="session")
def postgres_url(postgres_admin_dsn: str) -> Iterator[str]:
    """A fresh PostgreSQL database for this test session (dropped afterwards)."""
    import psycopg

    dsn = postgres_admin_dsn
    in_ci = os.environ.get("CI") == "true"
    conninfo = dsn.replace("postgresql+psycopg://", "postgresql://")
    name = f"ql_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        if in_ci:
            pytest.fail(f"CI=true but PostgreSQL is unreachable: {exc}")
        pytest.skip(f"PostgreSQL is unreachable: {str(exc).splitlines()[0]}")
    base = dsn.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')



@pytest.fixture(scope="session")
def postgres_template(postgres_url: str) -> Iterator[str]:
    """The name of a PostgreSQL database at schema head, migrated ONCE per session (the real Alembic
    migration, in a child process) and never connected to again: tests clone it with
    :func:`clone_postgres` (``CREATE DATABASE ... TEMPLATE``, a file copy) instead of migrating a
    fresh database each."""
    import psycopg

    from ql_core.db.migrate import SCHEMA_HEAD, migrate_url_in_child

    name = f"ql_tpl_{uuid.uuid4().hex[:12]}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        assert migrate_url_in_child(f"{postgres_url.rsplit('/', 1)[0]}/{name}") == SCHEMA_HEAD
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def clone_postgres(postgres_url: str, template: str, prefix: str) -> Iterator[str]:
    """A private database ``<prefix><random>`` cloned from ``template`` (SQLAlchemy URL), dropped
    on exit: each test's rows are its own."""
    import psycopg

    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield f"{postgres_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Portability results for docs/platforms.md (ADR-0007 gate 11): see tests/platforms_plugin.py.
from .platforms_plugin import (  # noqa: E402,F401
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
