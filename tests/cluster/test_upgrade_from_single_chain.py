"""A control database and a data dir made by ql before the cluster's schema became the plugin's own
Alembic branch upgrade in place with today's code and keep every row.

The old release is the repository's own commit (:data:`BEFORE_THE_SPLIT`), exported with
``git archive`` and run in child processes with ``PYTHONPATH`` on it: its migrations, its ``ql``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from ql_core.db.migrate import SCHEMA_HEAD

from tests.conftest import QL

ROOT = Path(__file__).resolve().parents[2]
#: main just before the split: one chain 0001 ... 0008, the cluster's revisions in ql_core.
BEFORE_THE_SPLIT = "403eda1"
#: Functions the cluster branch's revisions after the split (re)define — 0011_cluster_throughput,
#: 0012_cluster_set_based, 0013_cluster_hot_leases and 0015_cluster_wide_claims: same answers and rows, other plans —
#: 0016_cluster_empty_logs' new ql_artifact_empty_many and 0017_cluster_spawn_complete's new
#: ql_spawn_complete_many. Every other function is kept byte for byte.
REDEFINED_AFTER_THE_SPLIT = frozenset({"ql__event", "ql__attempts_used", "ql__digest", "ql_claim",
                                       "ql__queued_runs", "ql__batch_check", "ql_start_many",
                                       "ql_running_many", "ql_renew_many", "ql_complete_many",
                                       "ql__lock_attempts", "ql_sweep", "ql__fence", "ql_artifact_empty_many",
                                       "ql_spawn_complete_many"})


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("old-release")
    archive = target / "old.tar"
    out = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), BEFORE_THE_SPLIT,
                          "ql_core", "ql_plugins", "ql_executors"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.skip(f"the commit before the split is not in this checkout: {out.stderr.strip()}")
    with tarfile.open(archive) as tar:
        # The data filter where this Python has it (3.11.4+; Debian 12's python3 is 3.11.2): the
        # archive is our own, so an older one extracts it as it is.
        tar.extractall(target, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert not (target / "ql_plugins" / "cluster_fenced" / "migrations").exists()  # really the old layout
    return target


def _env(home: Path, code: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update(HOME=str(home), QL_PLUGIN_CACHE="off")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return env


def _ql(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(QL + args, env=env, capture_output=True, text=True, timeout=300, cwd="/")


#: Alembic's own upgrade to every head, past ``upgrade()``'s shortcut (a database already at the
#: shipped head is not even opened by Alembic): what the next release's first revision will run.
_ALEMBIC_UPGRADE = (
    "import sys\nfrom alembic import command\nfrom sqlalchemy import create_engine\n"
    "from ql_core.db.migrate import alembic_config\n"
    "engine = create_engine(sys.argv[1])\n"
    "with engine.begin() as conn:\n    command.upgrade(alembic_config(conn), 'heads')\n"
)


def _alembic_upgrade(url: str, env: dict[str, str]) -> None:
    out = subprocess.run([sys.executable, "-c", _ALEMBIC_UPGRADE, url], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def _sqlite_rows(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table, in the declared columns (not SQLite's own keys, which 0011 adds)."""
    from ql_core.db.models import SQLITE_ONLY_COLUMNS

    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {}
        for t in tables:
            columns = [f'"{r[1]}"' for r in conn.execute(f'PRAGMA table_info("{t}")')
                       if (t, r[1]) not in SQLITE_ONLY_COLUMNS]
            out[t] = sorted(conn.execute(f'SELECT {", ".join(columns)} FROM "{t}"').fetchall(), key=repr)
        return out
    finally:
        conn.close()


def test_a_data_dir_of_the_single_chain_upgrades_in_place(old_release: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = _env(tmp_path, old_release)
    for command in (["true"], ["false"], ["sh", "-c", "exit 7"]):
        out = _ql(["--data-dir", str(data), "run", "--", *command], old)
        assert out.returncode in (0, 1, 7), out.stderr
    before = _sqlite_rows(data / "ql.db")
    assert before["alembic_version"] == [("0008_worker_draining",)] and len(before["ql_run"]) == 3

    new = _env(tmp_path, None)
    up = _ql(["--json", "--data-dir", str(data), "db", "upgrade"], new)
    assert up.returncode == 0, up.stderr
    assert f'"revision":"{SCHEMA_HEAD}"' in up.stdout.replace(" ", "")
    assert _kept(_sqlite_rows(data / "ql.db"), before)  # only core's 0009, 0010 and 0011 applied, every row kept
    after = _sqlite_rows(data / "ql.db")
    _alembic_upgrade(f"sqlite:///{data / 'ql.db'}", new)
    assert _sqlite_rows(data / "ql.db") == after  # Alembic itself sees every revision applied
    listed = _ql(["--json", "--data-dir", str(data), "list"], new)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 3, listed.stderr
    again = _ql(["--data-dir", str(data), "run", "--", "true"], new)
    assert again.returncode == 0, again.stderr


def _kept(after: dict[str, list[tuple]], before: dict[str, list[tuple]]) -> bool:
    """Every row of ``before`` is in ``after`` unchanged; ``alembic_version`` names both heads now
    (core's 0009 on 0007, the cluster branch's 0008)."""
    assert after["alembic_version"] == [(rev,) for rev in SCHEMA_HEAD.split(",")], after["alembic_version"]
    # A table a later revision adds starts empty (SQLite 0014's ql_attempt_host).
    return {k: v for k, v in after.items() if k != "alembic_version" and (k in before or v)} == \
        {k: v for k, v in before.items() if k != "alembic_version"}


def _without_redefined(rows: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {**rows, "functions": [f for f in rows["functions"] if f[0] not in REDEFINED_AFTER_THE_SPLIT]}


def _pg_rows(conninfo: str) -> dict[str, list[tuple]]:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        rows = {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
        rows["functions"] = sorted(conn.execute(
            "SELECT proname, md5(prosrc) FROM pg_proc WHERE pronamespace = 'public'::regnamespace").fetchall())
    return rows


def test_a_control_database_of_the_single_chain_upgrades_in_place(old_release: Path, tmp_path: Path) -> None:
    dsn = os.environ.get("QL_TEST_POSTGRES_DSN")
    if not dsn:
        pytest.skip("no PostgreSQL: set QL_TEST_POSTGRES_DSN=postgresql+psycopg://user@host/db")
    import psycopg

    base = dsn.rsplit("/", 1)[0]
    admin = (base + "/postgres").replace("postgresql+psycopg://", "postgresql://")
    name = f"ql_old_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{base}/{name}"
    try:
        old = _env(tmp_path, old_release)
        key = tmp_path / "spec.key"
        made = _ql(["db", "new-spec-key", str(key)], old)
        assert made.returncode == 0, made.stderr
        config = tmp_path / "control.toml"
        config.write_text(f'profile = "cluster-control"\ndata_dir = "{tmp_path / "control-data"}"\n'
                          f'database_url = "{url}"\n[plugin.cluster-fenced]\nspec_key_file = "{key}"\n')
        for command in (["true"], ["sleep", "60"]):
            queued = _ql(["--config", str(config), "run", "--detach", "--", *command], old)
            assert queued.returncode == 0, queued.stderr
        before = _pg_rows(url.replace("postgresql+psycopg://", "postgresql://"))
        assert before["alembic_version"] == [("0008_worker_draining",)] and len(before["ql_run"]) == 2
        assert before["ql_run_spec"] and before["functions"]

        new = _env(tmp_path, None)
        up = _ql(["--config", str(config), "db", "upgrade"], new)
        assert up.returncode == 0, up.stderr
        after = _pg_rows(url.replace("postgresql+psycopg://", "postgresql://"))
        # core's 0009 and 0010 (nothing on PostgreSQL) and the cluster's 0011 (functions only) applied,
        # every row kept
        assert {f for f, _ in after["functions"]} - {f for f, _ in before["functions"]} <= REDEFINED_AFTER_THE_SPLIT
        assert _kept(_without_redefined(after), _without_redefined(before))
        _alembic_upgrade(url, new)
        assert _pg_rows(url.replace("postgresql+psycopg://", "postgresql://")) == after
        listed = _ql(["--json", "--config", str(config), "list"], new)
        assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 2, listed.stderr
        assert all('"queued"' in line for line in listed.stdout.splitlines())
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
