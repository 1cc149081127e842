"""Fail-closed behaviour (ADR-0007 §2.9 points 1, 2, 4–6; gate 13): read-only, bounded, no escapes."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.audit.audit_support import (
    DataDir,
    assert_one_line_error,
    clean_env,
    id_in_shard,
    make_data_dir,
    ql_executable,
    regular_inodes,
    run_ql,
    snapshot,
)

from ql_core.audit import audit_receipts
from ql_core.errors import DatabaseError, UnsafePathError


def rich_tree(d: DataDir) -> None:
    """Something of every kind in several shards, plus the runtime's and the audit's quarantines."""
    journaled = d.attempt("succeeded", journal="pending", shard="a7")
    running = d.attempt("running", shard="a7")
    d.put("a7", f"{journaled}.json")
    d.put("a7", f"{running}.json")
    d.put("a7", f"{d.attempt('failed', shard='a7')}.json")
    d.put("a7", f".{id_in_shard('a7')}.x9.tmp")
    d.put("a7", "junk")
    d.put("a7", "young", age_s=1)
    os.symlink("/etc", d.receipts / "a7" / "to-etc")
    (d.receipts / "a7" / "nested").mkdir()
    (d.receipts / "a7" / "nested" / "inner").write_bytes(b"inside a directory entry")
    os.mkfifo(d.receipts / "a7" / "fifo")
    d.put("00", "junk0")
    d.put("ff", "junkff")
    for i in range(40):
        d.put("10", f"many-{i}")
    (d.receipts / ".quarantine" / "a7").mkdir(mode=0o700, parents=True)
    (d.receipts / ".quarantine" / "a7" / f"{journaled}.json").write_bytes(b"runtime quarantine")
    (d.orphans / "a7").mkdir(mode=0o700, parents=True)
    d.orphans.chmod(0o700)
    (d.orphans / "a7" / "earlier").write_bytes(b"quarantined last week")
    (d.path / "logs" / "a7").mkdir(mode=0o700, parents=True)
    (d.path / "logs" / "a7" / "x.log").write_bytes(b"log")


def test_report_mode_changes_nothing_in_any_shard(audit_dir: DataDir) -> None:
    d = audit_dir
    rich_tree(d)
    before = snapshot(d.path)
    cursor = "00"
    seen = set()
    for _ in range(8):  # 8 x 32 shards: the whole ring, continued with next_shard
        result = run_ql(d.path, "--shard", cursor, "--shards", "32", "--limit", "64")
        assert result.returncode == 0, result.stderr
        doc = result.json()
        seen.update(s["shard"] for s in doc["shards"])
        assert doc["moved"] == 0
        assert all(e["action"] != "quarantined" for e in doc["entries"])
        cursor = doc["next_shard"]
    assert cursor == "00" and len(seen) == 256
    human = run_ql(d.path, "--shard", "a0", "--shards", "32", json_mode=False)
    assert human.returncode == 0, human.stderr
    assert snapshot(d.path) == before


def test_quarantine_never_touches_other_trees(audit_dir: DataDir) -> None:
    d = audit_dir
    rich_tree(d)
    runtime_q = snapshot(d.receipts / ".quarantine")
    logs = snapshot(d.path / "logs")
    earlier = snapshot(d.orphans)
    inodes = regular_inodes(d.path)
    cursor = "00"
    moved = 0
    for _ in range(8):
        doc = run_ql(d.path, "--shard", cursor, "--shards", "32", "--quarantine").json()
        moved += doc["moved"]
        cursor = doc["next_shard"]
    assert moved == 5  # a7: terminal receipt, temp, junk; 00/junk0; ff/junkff (10 overflowed)
    assert snapshot(d.receipts / ".quarantine") == runtime_q
    assert snapshot(d.path / "logs") == logs
    after = snapshot(d.orphans)
    assert {k: v for k, v in after.items() if k in earlier and k != "a7"} == {
        k: v for k, v in earlier.items() if k != "a7"}
    assert after["a7/earlier"] == earlier["a7/earlier"]
    assert (d.receipts / "a7" / "nested" / "inner").read_bytes() == b"inside a directory entry"
    assert os.path.islink(d.receipts / "a7" / "to-etc")
    assert len(os.listdir(d.receipts / "10")) == 40
    assert inodes <= regular_inodes(d.path)


# ----------------------------------------------------------------- escapes


@pytest.mark.parametrize("quarantine", [False, True])
def test_symlinked_shard_dir_fails_and_moves_nothing(audit_dir: DataDir, tmp_path: Path,
                                                     quarantine: bool) -> None:
    d = audit_dir
    d.put("a6", "eligible-before")  # an eligible file in an earlier shard of the same run
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"not ours")
    os.utime(outside / "victim", (1000, 1000))
    os.symlink(outside, d.receipts / "a7")
    before, before_outside = snapshot(d.path), snapshot(outside)
    args = ["--shard", "a6", "--shards", "2"] + (["--quarantine"] if quarantine else [])
    result = run_ql(d.path, *args)
    assert_one_line_error(result, 1, "receipts/a7", "symlink")
    assert result.stdout == ""
    assert snapshot(d.path) == before
    assert snapshot(outside) == before_outside
    assert not d.orphans.exists()


def test_shard_dir_replaced_by_a_file_fails(audit_dir: DataDir) -> None:
    d = audit_dir
    (d.receipts / "a7").write_bytes(b"")
    with pytest.raises(UnsafePathError, match="not a directory"):
        audit_receipts(d.path, d.url, shard="a7", shards=1)


def test_symlinked_receipt_root_fails(tmp_path: Path) -> None:
    d = make_data_dir(tmp_path / "data")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "a7").mkdir(parents=True)
    (elsewhere / "a7" / "victim").write_bytes(b"x")
    os.utime(elsewhere / "a7" / "victim", (1000, 1000))
    d.receipts.rmdir()
    os.symlink(elsewhere, d.receipts)
    before = snapshot(elsewhere)
    result = run_ql(d.path, "--shard", "a7", "--shards", "1", "--quarantine")
    assert_one_line_error(result, 1, "receipts", "symlink")
    assert snapshot(elsewhere) == before


def test_data_dir_reached_through_a_symlink_is_fine(tmp_path: Path) -> None:
    """Only the receipt tree must be canonical; a symlinked data dir path is a normal setup."""
    d = make_data_dir(tmp_path / "real")
    d.put("a7", "junk")
    os.symlink(d.path, tmp_path / "alias")
    doc = run_ql(tmp_path / "alias", "--shard", "a7", "--shards", "1", "--quarantine").json()
    assert doc["moved"] == 1
    assert (d.orphans / "a7" / "junk").is_file()


@pytest.mark.parametrize("quarantine", [False, True])
def test_symlinked_orphan_quarantine_fails_and_moves_nothing(audit_dir: DataDir, tmp_path: Path,
                                                             quarantine: bool) -> None:
    d = audit_dir
    d.put("a7", "eligible")
    d.put("00", "eligible")
    outside = tmp_path / "outside-q"
    outside.mkdir(mode=0o700)
    os.symlink(outside, d.orphans)
    before = snapshot(d.path)
    args = ["--shard", "00", "--shards", "32"] + (["--quarantine"] if quarantine else [])
    result = run_ql(d.path, *args)
    assert_one_line_error(result, 1, ".orphan-quarantine", "symlink")
    assert snapshot(d.path) == before
    assert os.listdir(outside) == []
    result = run_ql(d.path, "--shard", "a7", "--shards", "1", "--quarantine")
    assert_one_line_error(result, 1, ".orphan-quarantine")
    assert snapshot(d.path) == before


def test_symlinked_orphan_quarantine_shard_fails_and_moves_nothing(audit_dir: DataDir,
                                                                  tmp_path: Path) -> None:
    d = audit_dir
    d.put("a6", "eligible")
    d.put("a7", "eligible")
    outside = tmp_path / "outside-q"
    outside.mkdir(mode=0o700)
    d.orphans.mkdir(mode=0o700)
    os.symlink(outside, d.orphans / "a7")
    before = snapshot(d.path)
    result = run_ql(d.path, "--shard", "a6", "--shards", "2", "--quarantine")
    assert_one_line_error(result, 1, ".orphan-quarantine/a7", "symlink")
    assert snapshot(d.path) == before
    assert os.listdir(outside) == []


def test_loose_orphan_quarantine_is_refused_before_anything_moves(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("a6", "eligible")
    d.put("a7", "eligible")
    (d.orphans / "a7").mkdir(mode=0o700, parents=True)
    d.orphans.chmod(0o700)
    (d.orphans / "a7").chmod(0o755)
    before = snapshot(d.path)
    with pytest.raises(UnsafePathError, match="0700"):
        audit_receipts(d.path, d.url, shard="a6", shards=2, quarantine=True)
    assert snapshot(d.path) == before
    # report mode only reads, and says what --quarantine would do
    report = audit_receipts(d.path, d.url, shard="a6", shards=2)
    assert report.counts["unknown_file"] == 2


# ------------------------------------------------------------------- CLI rules


@pytest.mark.parametrize(("args", "fragment"), [
    (["--shards", "33"], "hard cap of 32"),
    (["--limit", "65"], "hard cap of 64"),
    (["--limit", "1000000"], "hard cap of 64"),
    (["--shards", "0"], "--shards"),
    (["--shards", "many"], "--shards"),
    (["--limit", "-1"], "--limit"),
    (["--shard", "zz"], "--shard"),
    (["--shard", "1ff"], "--shard"),
    (["--shard", "../.."], "--shard"),
    (["--min-age", "0"], "--min-age"),
    (["--min-age", "1.5"], "--min-age"),
])
def test_usage_errors_exit_2_with_one_line(audit_dir: DataDir, args: list[str], fragment: str) -> None:
    before = snapshot(audit_dir.path)
    result = run_ql(audit_dir.path, *args, "--quarantine")
    assert_one_line_error(result, 2, fragment)
    assert result.stdout == ""
    assert snapshot(audit_dir.path) == before


def test_brief_example_of_a_cap(audit_dir: DataDir) -> None:
    result = run_ql(audit_dir.path, "--shards", "33", json_mode=False)
    assert_one_line_error(result, 2, "--shards 33", "32")


def test_missing_action_is_a_usage_error(audit_dir: DataDir) -> None:
    proc = subprocess.run([ql_executable(), "--data-dir", str(audit_dir.path), "audit"],
                          capture_output=True, text=True, env=clean_env(), cwd=audit_dir.path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_cluster_control_refuses(audit_dir: DataDir) -> None:
    env = clean_env(QL_DATABASE_URL="postgresql+psycopg://nobody@127.0.0.1:1/none")
    proc = subprocess.run(
        [ql_executable(), "--data-dir", str(audit_dir.path), "--profile", "cluster-control",
         "audit", "receipts", "--quarantine"],
        capture_output=True, text=True, env=env, cwd=audit_dir.path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "control plane never scans worker-local paths" in proc.stderr
    assert "on the worker" in proc.stderr


# ------------------------------------------------------------------ database


def test_missing_database_fails_closed_when_receipts_need_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "receipts" / "a7").mkdir(parents=True, mode=0o700)
    receipt = data / "receipts" / "a7" / f"{id_in_shard('a7')}.json"
    receipt.write_bytes(b"{}")
    os.utime(receipt, (1000, 1000))
    before = snapshot(data)
    result = run_ql(data, "--shard", "a7", "--shards", "1", "--quarantine")
    assert_one_line_error(result, 1, "run database")
    assert snapshot(data) == before
    assert not (data / "ql.db").exists()  # read-only open: never creates the database


def test_database_without_schema_fails_closed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "receipts" / "a7").mkdir(parents=True, mode=0o700)
    sqlite3.connect(data / "ql.db").close()
    receipt = data / "receipts" / "a7" / f"{id_in_shard('a7')}.json"
    receipt.write_bytes(b"{}")
    os.utime(receipt, (1000, 1000))
    with pytest.raises(DatabaseError, match="schema"):
        audit_receipts(data, f"sqlite:///{data / 'ql.db'}", shard="a7", shards=1, quarantine=True)
    assert receipt.exists()


def test_sqlite_connection_cannot_write(audit_dir: DataDir) -> None:
    from ql_core.db.audit_reads import _open_sqlite

    conn = _open_sqlite(audit_dir.url)
    try:
        with pytest.raises(sqlite3.Error):
            conn.execute("DELETE FROM ql_receipt_journal")
        with pytest.raises(sqlite3.Error):
            conn.execute("CREATE TABLE x (y)")
    finally:
        conn.close()


def test_database_is_opened_read_only(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("a7", f"{d.attempt('succeeded')}.json")
    d.put("a7", f"{d.attempt('running')}.json")
    wal = d.path / "ql.db-wal"
    db_before = (d.path / "ql.db").read_bytes()
    # The WAL outlives the writers' connections (no checkpoint on close): it must not change either.
    wal_before = wal.read_bytes() if wal.exists() else b""
    audit_receipts(d.path, d.url, shard="a7", shards=1, quarantine=True)
    assert (d.path / "ql.db").read_bytes() == db_before
    assert (wal.read_bytes() if wal.exists() else b"") == wal_before


# ---------------------------------------------------------- what it touches

_PROBE = textwrap.dedent("""
    import json, os, sys

    events = []

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, (str, bytes)):
                path = os.fsdecode(path)
            else:
                path = repr(path)
            events.append(["open", path, mode if isinstance(mode, str) else None,
                           flags if isinstance(flags, int) else None])
        elif event in ("os.remove", "os.link", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree",
                       "os.truncate", "os.chmod", "os.utime", "os.symlink"):
            events.append([event, repr(args)])

    sys.addaudithook(hook)
    from ql_core.cli.main import main

    code = main(sys.argv[1:])
    heavy = sorted(m for m in sys.modules
                   if m.split(".")[0] in ("sqlalchemy", "sqlmodel", "alembic", "pluggy", "stevedore")
                   or m in ("ql_core.db.models", "ql_core.db.engine", "ql_core.db.migrate"))
    with open(os.environ["QL_PROBE_OUT"], "w") as fh:
        json.dump({"code": code, "events": events, "heavy": heavy}, fh)
""")


@pytest.mark.parametrize("quarantine", [False, True])
def test_never_opens_receipt_files_and_never_loads_the_orm(audit_dir: DataDir, tmp_path: Path,
                                                         quarantine: bool) -> None:
    d = audit_dir
    rich_tree(d)
    names = {name for _, dirs, files in os.walk(d.receipts) for name in files + dirs}
    out = tmp_path / "probe.json"
    args = ["--data-dir", str(d.path), "--json", "audit", "receipts", "--shard", "a0", "--shards", "32",
            "--limit", "64"] + (["--quarantine"] if quarantine else [])
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True,
                          env=clean_env(QL_PROBE_OUT=str(out)), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(out.read_text())
    assert probe["code"] == 0
    assert probe["heavy"] == []
    doc = json.loads(proc.stdout)
    receipts = str(d.receipts)
    for event in probe["events"]:
        if event[0] != "open":
            continue
        _, path, _mode, flags = event
        if flags is not None and flags & os.O_DIRECTORY:
            assert flags & os.O_NOFOLLOW, event  # directory fds only, never through a symlink
            continue
        absolute = os.path.abspath(os.path.join(str(tmp_path), path))
        assert not absolute.startswith(receipts), event  # no file under receipts/ is ever opened
        assert os.path.basename(path) not in names, event
    removes = [e for e in probe["events"] if e[0] == "os.remove"]
    links = [e for e in probe["events"] if e[0] == "os.link"]
    others = [e for e in probe["events"]
              if e[0] in ("os.rename", "os.rmdir", "shutil.rmtree", "os.truncate", "os.chmod", "os.utime",
                          "os.symlink")]
    assert others == []
    if quarantine:
        assert doc["moved"] == 3
        assert len(links) == len(removes) == doc["moved"]  # the only unlinks: originals after their link
    else:
        assert doc["moved"] == 0
        assert removes == links == []
        assert [e for e in probe["events"] if e[0] == "os.mkdir"] == []


def test_the_audit_module_imports_nothing_heavy() -> None:
    code = ("import sys, ql_core.audit, ql_core.cli.cmd_audit; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel', 'alembic', "
            "'psycopg') or m in ('ql_core.db.models', 'ql_core.db.engine', 'ql_core.db.migrate')]; print(bad)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_private_modes_of_created_directories_ignore_the_umask(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("a7", "junk")
    old = os.umask(0)
    try:
        audit_receipts(d.path, d.url, shard="a7", shards=1, quarantine=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(d.orphans).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(d.orphans / "a7").st_mode) == 0o700
