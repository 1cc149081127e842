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


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    return d


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


# Portability results for docs/platforms.md (ADR-0007 gate 11): see tests/platforms_plugin.py.
from .platforms_plugin import (  # noqa: E402,F401
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
