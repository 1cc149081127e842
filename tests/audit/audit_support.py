"""Helpers for the receipt-audit tests: real files, a real migrated database, the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ql_core.ids import new_id

#: Old enough for the default minimum age (3600 s).
OLD_S = 2 * 3600


def id_in_shard(shard: str) -> str:
    """A fresh lowercase UUIDv7 whose last two hex digits are ``shard`` (the last 12 are random)."""
    return new_id()[:-2] + shard


def set_age(path: Path, age_s: float) -> None:
    """Make ``path`` (not what a symlink points to) look ``age_s`` seconds old."""
    when = time.time() - age_s
    os.utime(path, (when, when), follow_symlinks=False)


def insert_attempt(engine: Any, attempt_id: str, status: str, journal: str | None = None) -> None:
    """A run + attempt row and, if ``journal`` is a state, its receipt-journal row."""
    from sqlalchemy import text

    now_ms = int(time.time() * 1000)
    run_id = new_id()
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO ql_run (id, status, version, event_seq, created_at_ms, updated_at_ms) "
            "VALUES (:id, :status, 1, 0, :now, :now)"), {"id": run_id, "status": status, "now": now_ms})
        # On SQLite an attempt's key is its run's key and its number (ql_core.db.sqlite_runs).
        key, key_of = ("attempt_key, ", "(SELECT (run_key << 8) + 1 FROM ql_run WHERE id = :run), ") \
            if engine.dialect.name == "sqlite" else ("", "")
        conn.execute(text(
            f"INSERT INTO ql_run_attempt ({key}id, run_id, attempt_no, executor, runtime_owner, status, "
            "log_artifact_id, callback_token_hash, callback_sequence, created_at_ms, version) "
            f"VALUES ({key_of}:id, :run, 1, 'local', 'node', :status, :log, :hash, 0, :now, 1)"),
            {"id": attempt_id, "run": run_id, "status": status, "log": new_id(), "hash": "0" * 64,
             "now": now_ms})
        if journal is not None:
            conn.execute(text(
                "INSERT INTO ql_receipt_journal (attempt_id, run_id, state, receipt_ref, "
                "registered_at_ms, updated_at_ms) VALUES (:id, :run, :state, :ref, :now, :now)"),
                {"id": attempt_id, "run": run_id, "state": journal,
                 "ref": f"{attempt_id[-2:]}/{attempt_id}.json", "now": now_ms})


@dataclass
class DataDir:
    """A data dir with a migrated ql.db and helpers to populate receipts/."""

    path: Path
    url: str

    @property
    def receipts(self) -> Path:
        return self.path / "receipts"

    @property
    def orphans(self) -> Path:
        return self.receipts / ".orphan-quarantine"

    def shard(self, shard: str) -> Path:
        d = self.receipts / shard
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        return d

    def put(self, shard: str, name: str, *, age_s: float = OLD_S, data: bytes = b'{"x":1}') -> Path:
        path = self.shard(shard) / name
        path.write_bytes(data)
        path.chmod(0o600)
        set_age(path, age_s)
        return path

    def attempt(self, status: str, journal: str | None = None, *, shard: str = "a7") -> str:
        from ql_core.db.engine import create_db_engine

        attempt_id = id_in_shard(shard)
        engine = create_db_engine(self.url)
        try:
            insert_attempt(engine, attempt_id, status, journal)
        finally:
            engine.dispose()
        return attempt_id


# ------------------------------------------------------------------ snapshots

#: SQLite's shared-memory side files, which any reader of a WAL database may create (never content).
SQLITE_SIDE_FILES = {"ql.db-wal", "ql.db-shm"}


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every path under ``root``: lstat mode/size/mtime/inode/nlink, content hash or link target."""
    result: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel in SQLITE_SIDE_FILES:
                continue
            st = os.lstat(full)
            extra: Any = None
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as fh:
                    extra = hashlib.sha256(fh.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                extra = os.readlink(full)
            result[rel] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, st.st_nlink, extra)
    return result


def regular_inodes(root: Path) -> set[tuple[int, int]]:
    """(dev, inode) of every regular file reachable under ``root`` without following symlinks."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + dirnames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                found.add((st.st_dev, st.st_ino))
    return found


# ----------------------------------------------------------------------- CLI


def ql_executable() -> str:
    candidate = Path(sys.executable).parent / "ql"
    return str(candidate) if candidate.exists() else "ql"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update(extra)
    return env


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, self.stdout
        return json.loads(lines[0])


def run_ql(data_dir: Path, *args: str, json_mode: bool = True, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> CliResult:
    cmd = [ql_executable(), "--data-dir", str(data_dir)]
    if json_mode:
        cmd.append("--json")
    cmd += ["audit", "receipts", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or clean_env(),
                          cwd=cwd or data_dir.parent, timeout=120)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(result: CliResult, code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def make_data_dir(path: Path, template: Path | None = None) -> DataDir:
    """A data dir at ``path`` with a migrated SQLite ql.db and an empty receipts/ (0700); given the
    session's ``template`` (tests/conftest.py ``sqlite_template``) the database is a copy of it, else
    it is migrated here."""
    url = f"sqlite:///{path / 'ql.db'}"
    path.mkdir(mode=0o700)
    if template is not None:
        from tests.conftest import seed_data_dir

        seed_data_dir(path, template)
    else:
        from ql_core.db.engine import create_db_engine
        from ql_core.db.migrate import upgrade

        engine = create_db_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
    (path / "receipts").mkdir(mode=0o700)
    return DataDir(path, url)
