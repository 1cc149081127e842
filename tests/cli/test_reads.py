"""Reads never write (issue item 2) and settle what they show (item 3), through the real `ql` command."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env, json_lines, ql_proc

RUN = "01a22b46-155c-7d09-872b-21304a383465"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home")


def _ql(env: dict[str, str], data: Path, *args: str, **kw) -> subprocess.CompletedProcess[str]:
    return ql_proc(["--data-dir", str(data), *args], env, **kw)


@pytest.mark.parametrize("args", [["status", RUN], ["list"], ["events", RUN], ["logs", RUN], ["cancel", RUN],
                                  ["doctor"], ["audit", "receipts"]], ids=lambda a: a[0])
def test_a_mistyped_data_dir_is_never_created(env, tmp_path: Path, args: list[str]) -> None:
    typo = tmp_path / "typo" / "ql"
    out = _ql(env, typo, *args)
    # `ql list` there: no runs, exit 0 (docs/cli.md) — its one note still names the mistyped directory.
    assert out.returncode == (0 if args[0] == "list" else 1), out.stdout + out.stderr
    assert not (tmp_path / "typo").exists()
    if args[0] != "doctor":
        assert len(out.stderr.splitlines()) == 1 and str(typo) in out.stderr


@pytest.mark.parametrize("args", [["status", RUN], ["list"], ["events", RUN], ["logs", RUN]], ids=lambda a: a[0])
def test_an_empty_data_dir_stays_empty(env, tmp_path: Path, args: list[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    out = _ql(env, empty, *args)
    assert out.returncode == (0 if args[0] == "list" else 1) and "nothing has run" in out.stderr, out.stderr
    assert list(empty.iterdir()) == []


def test_the_database_is_private_and_reads_do_not_migrate_or_touch_it(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _ql(env, data, "run", "--", "true").returncode == 0
    db = data / "ql.db"
    assert db.stat().st_mode & 0o777 == 0o600

    def snapshot() -> tuple:
        # SQLite's own side files (ql.db-wal/-shm, 0600, no content) may appear for a reader.
        names = sorted(p.name for p in data.iterdir() if not p.name.endswith(("-wal", "-shm")))
        return db.stat().st_mtime_ns, db.stat().st_size, names

    before = snapshot()
    for args in (["list"], ["--json", "list"], ["doctor"], ["status", RUN], ["events", RUN]):
        assert _ql(env, data, *args).returncode in (0, 1)
    assert snapshot() == before
    assert all(p.stat().st_mode & 0o077 == 0 for p in data.iterdir())


def test_list_and_status_work_while_another_process_holds_the_write_lock(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _ql(env, data, "run", "--", "true").returncode == 0
    run_id = json_lines(_ql(env, data, "--json", "list").stdout)[0]["run_id"]
    holder = subprocess.Popen(
        ["python3", "-c", "import sqlite3, sys, time\n"
                          "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                          "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(30)",
         str(data / "ql.db")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        listed = _ql(env, data, "--json", "list")
        status = _ql(env, data, "--json", "status", run_id)
        elapsed = time.monotonic() - started
    finally:
        holder.kill()
        holder.communicate()
    assert listed.returncode == 0 and json_lines(listed.stdout)[0]["run_id"] == run_id, listed.stderr
    assert status.returncode == 0 and json_lines(status.stdout)[0]["status"] == "succeeded", status.stderr
    assert elapsed < 5  # neither waited for the lock (the busy timeout is 5 s)


# -- item 3: a detached run settles on its own --------------------------------------------------------------
def _wait_for_receipts(data: Path, n: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(list((data / "receipts").glob("*/*.json"))) < n:
        assert time.monotonic() < deadline, "the launchers never published their receipts"
        time.sleep(0.05)


def test_status_settles_a_detached_run_without_any_supervisor(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    detached = _ql(env, data, "--json", "run", "--detach", "--", "sh", "-c", "exit 4")
    run_id = json_lines(detached.stdout)[0]["run_id"]
    _wait_for_receipts(data, 1)
    view = json_lines(_ql(env, data, "--json", "status", run_id).stdout)[0]
    assert (view["status"], view["exit_code"]) == ("failed", 4)
    assert view["attempts"][0]["status"] == "failed"
    assert list((data / "receipts").glob("*/*.json")) == []  # consumed by the read


def test_status_enforces_a_passed_deadline(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    detached = _ql(env, data, "--json", "run", "--detach", "--timeout", "0.5", "--", "sleep", "60")
    run_id = json_lines(detached.stdout)[0]["run_id"]
    time.sleep(0.8)
    deadline = time.monotonic() + 30
    while True:
        view = json_lines(_ql(env, data, "--json", "status", run_id).stdout)[0]
        if view["status"] != "running":
            break
        assert view["cancel_reason"] == "timeout"  # the first read committed the intent and sent TERM
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert (view["status"], view["reason"]) == ("timed_out", "timeout")
    types = [e["type"] for e in json_lines(_ql(env, data, "--json", "events", run_id).stdout)]
    assert types.index("run.cancel_requested") < types.index("run.timed_out")


def test_list_settles_at_most_page_size_runs_per_call(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = tmp_path / "ql.toml"
    config.write_text("[limits]\npage_size = 3\n")
    for _ in range(5):
        assert _ql(env, data, "run", "--detach", "--", "true").returncode == 0
    _wait_for_receipts(data, 5)

    def listed() -> list[str]:
        out = ql_proc(["--config", str(config), "--data-dir", str(data), "--json", "list"], env)
        assert out.returncode == 0, out.stderr
        return [r["status"] for r in json_lines(out.stdout)]

    assert listed() == ["succeeded"] * 3 + ["running"] * 2  # newest first; three settled
    assert listed() == ["succeeded"] * 5
    assert all(r["finished_at_ms"] for r in json_lines(_ql(env, data, "--json", "list").stdout))


def test_list_of_a_running_task_leaves_it_running(env, tmp_path: Path) -> None:
    data = tmp_path / "data"
    detached = _ql(env, data, "--json", "run", "--detach", "--", "sleep", "30")
    run_id = json_lines(detached.stdout)[0]["run_id"]
    try:
        rows = json_lines(_ql(env, data, "--json", "list").stdout)
        assert rows[0]["run_id"] == run_id and rows[0]["status"] == "running"
    finally:
        _ql(env, data, "cancel", run_id)
    assert os.path.isdir(data)
