"""Issue 26 item 4 through the real `ql` command: `ql wait`, `ql logs -f`'s end status, run id
prefixes and `last`, `--detach`'s bare id, `ql list`'s table, stdin, JSON notes, the real end of a
log, the truncation note, `ql supervise`'s "1 round", and item 7's `--cwd` and 127."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from ql_core.testing.executor import wait_until
from tests.cli.cli_support import clean_env, json_lines
from tests.conftest import QL

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home", QL_DATA_DIR=str(tmp_path / "data"))


def ql(env: dict[str, str], *args: str, stdin: int | None = subprocess.DEVNULL,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(QL + list(args), env=env, capture_output=True, text=True, timeout=timeout, stdin=stdin)


def detach(env: dict[str, str], *command: str, options: tuple[str, ...] = ()) -> str:
    out = ql(env, "run", "--detach", *options, "--", *command)
    assert out.returncode == 0, out.stderr
    assert UUID.fullmatch(out.stdout.rstrip("\n")) and out.stdout.count("\n") == 1, out.stdout
    return out.stdout.strip()


# -- ql wait --------------------------------------------------------------------------------------
def test_wait_exits_with_the_run_exit_code_without_any_host(env) -> None:
    run_id = detach(env, "sh", "-c", "exit 3")  # its host (ql run --detach) is gone already
    out = ql(env, "wait", run_id)
    assert out.returncode == 3, out.stderr
    assert out.stdout.split()[:4] == [run_id, "failed", "exit", "3"]
    assert ql(env, "status", run_id).stdout.split()[2] == "failed"


def test_wait_for_several_runs_exits_with_the_first_non_zero_status(env) -> None:
    ok = detach(env, "true")
    bad = detach(env, "sh", "-c", "exit 7")
    out = ql(env, "--json", "wait", ok, bad, ok)
    assert out.returncode == 7, out.stderr
    records = {r["run_id"]: r for r in json_lines(out.stdout)}
    assert sorted(records) == sorted([ok, bad])  # a run given twice is waited for once
    assert (records[ok]["exit_status"], records[bad]["exit_status"]) == (0, 7)
    assert ql(env, "wait", bad, ok).returncode == 7 and ql(env, "wait", ok).returncode == 0


def test_wait_timeout_stops_waiting_and_the_run_goes_on_then_cancel_is_130(env) -> None:
    run_id = detach(env, "sleep", "120")
    out = ql(env, "wait", "--timeout", "0.5", run_id)
    assert out.returncode == 125, out.stderr
    assert "stopped waiting" in out.stderr and out.stdout == ""
    assert ql(env, "status", run_id).stdout.split()[2] == "running"
    assert ql(env, "cancel", run_id).returncode == 0
    waited = ql(env, "wait", run_id)
    assert waited.returncode == 130 and f"{run_id}  cancelled" in waited.stdout


def test_wait_maps_a_passed_deadline_to_124(env) -> None:
    run_id = detach(env, "sleep", "120", options=("--timeout", "1"))
    out = ql(env, "wait", "last")
    assert out.returncode == 124, out.stderr
    assert out.stdout.split()[:2] == [run_id, "timed_out"]


def test_wait_for_an_unknown_run_is_not_found_at_once(env) -> None:
    detach(env, "true")
    out = ql(env, "wait", "last", "0000")
    assert out.returncode == 1 and "not found" in out.stderr and out.stdout == ""


# -- ql logs -f -------------------------------------------------------------------------------------
def test_logs_follow_exits_with_the_run_status_and_says_how_it_ended(env) -> None:
    run_id = detach(env, "sh", "-c", "echo out; exit 5")
    out = ql(env, "logs", "-f", run_id)
    assert (out.returncode, out.stdout) == (5, "out\n"), out.stderr
    assert out.stderr == f"ql: run {run_id} failed (exit 5)\n"
    as_json = ql(env, "--json", "logs", "--follow", run_id)
    assert as_json.returncode == 5
    (note,) = json_lines(as_json.stderr)
    assert note["note"] == "ended" and (note["status"], note["exit_code"], note["exit_status"]) == ("failed", 5, 5)
    plain = ql(env, "logs", run_id)  # without --follow: the log was printed, exit 0
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "out\n", "")


def test_logs_follow_of_a_cancelled_run_exits_130(env) -> None:
    run_id = detach(env, "sleep", "120")
    follower = subprocess.Popen(QL + ["logs", "-f", run_id], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert ql(env, "cancel", run_id).returncode == 0
        _out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 130 and f"run {run_id} cancelled" in err


def test_logs_json_offset_past_the_end_reports_the_real_end(env) -> None:
    empty = detach(env, "true")
    ql(env, "wait", empty)
    (state,) = json_lines(ql(env, "--json", "logs", "--offset", "99999", empty).stdout)
    assert state["end"] == 0
    some = detach(env, "sh", "-c", "printf abc")
    ql(env, "wait", some)
    (state,) = json_lines(ql(env, "--json", "logs", "--offset", "99999", some).stdout)
    assert state["end"] == 3
    records = json_lines(ql(env, "--json", "logs", "--offset", "1", some).stdout)
    assert [r.get("data") for r in records[:-1]] == ["bc"] and records[-1]["end"] == 3


# -- RUN arguments: prefixes and last ----------------------------------------------------------------
def test_a_unique_prefix_and_last_name_a_run(env) -> None:
    first = detach(env, "true")
    second = detach(env, "sh", "-c", "exit 4")
    ql(env, "wait", first, second)
    common = os.path.commonprefix([first, second])
    assert common, "two ids created together share their leading time digits"
    tail = len(common) + 1
    assert ql(env, "status", second[:tail]).stdout.split()[1] == second
    assert ql(env, "status", second[:tail].upper()).stdout.split()[1] == second
    assert ql(env, "status", "last").stdout.split()[1] == second
    assert json_lines(ql(env, "--json", "events", first[:tail]).stdout)[0]["run_id"] == first
    assert ql(env, "logs", "-f", "last").returncode == 4
    ambiguous = ql(env, "status", common)
    assert ambiguous.returncode == 2 and "ambiguous" in ambiguous.stderr and "give more characters" in ambiguous.stderr
    assert "2 or more" in ambiguous.stderr and len(ambiguous.stderr.splitlines()) == 1
    assert ql(env, "cancel", common).returncode == 2


def test_a_prefix_nothing_matches_is_not_found_and_a_non_id_is_a_usage_error(env) -> None:
    detach(env, "true")
    missing = ql(env, "status", "ffff")
    assert missing.returncode == 1 and "not found" in missing.stderr
    for command in ("cancel", "status", "events", "logs", "wait"):
        out = ql(env, command, "not-a-uuid")
        assert out.returncode == 2 and "is not a run id" in out.stderr, (command, out.stderr)
    as_json = ql(env, "--json", "cancel", "not-a-uuid")
    assert json.loads(as_json.stderr)["error"] == "usage"


def test_last_with_no_run_is_not_found(env, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir(mode=0o700)
    assert ql(env, "reconcile").returncode == 0  # a used data dir without any run
    out = ql(env, "status", "last")
    assert out.returncode == 1 and "no run yet" in out.stderr


def test_a_prefix_is_one_range_of_the_primary_key(env, tmp_path: Path) -> None:
    """Bounded: SQLite plans the prefix lookup as a search of the primary key, never a scan."""
    from ql_plugins.edge_sqlite import statements

    detach(env, "true")
    with sqlite3.connect(tmp_path / "data" / "ql.db") as db:
        plan = " ".join(str(row[-1]) for row in db.execute("EXPLAIN QUERY PLAN " + statements.SELECT_RUN_IDS_IN_RANGE,
                                                           ("01", "02", 2)))
    assert plan.startswith("SEARCH") and "(id>? AND id<?)" in plan, plan


# -- ql run ----------------------------------------------------------------------------------------
def test_piped_stdin_is_not_passed_on_and_ql_run_says_so(env) -> None:
    piped = subprocess.run(QL + ["run", "--", "cat"], env=env, input="x\n", capture_output=True, text=True,
                           timeout=120)
    assert (piped.returncode, piped.stdout) == (0, "")
    assert piped.stderr.startswith("ql: warning: the task's stdin is /dev/null") and piped.stderr.count("\n") == 1
    quiet = ql(env, "run", "--", "cat")  # stdin /dev/null: nothing to warn about
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    helped = ql(env, "run", "--help").stdout
    assert "stdin is /dev/null" in " ".join(helped.split())


def test_json_mode_notes_on_stderr_are_json_lines(env, tmp_path: Path) -> None:
    data = tmp_path / "input.txt"
    data.write_text("x\n")
    with data.open() as stdin:
        out = subprocess.run(QL + ["--json", "run", "--", "cat"], env=env, stdin=stdin, capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 0
    notes = json_lines(out.stderr)
    assert [n["note"] for n in notes] == ["stdin_ignored"] and notes[0]["run_id"] == json_lines(out.stdout)[0]["run_id"]


def test_ql_run_says_when_output_was_truncated_at_the_quota(env, tmp_path: Path) -> None:
    config = tmp_path / "ql.toml"
    config.write_text("[limits]\nlog_max_bytes = 1024\n")
    env = dict(env, QL_CONFIG=str(config))
    out = ql(env, "run", "--", "sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x")
    assert out.returncode == 0 and len(out.stdout) <= 1024
    assert "truncated at 1024 bytes" in out.stderr and len(out.stderr.splitlines()) == 1
    short = ql(env, "run", "--", "echo", "hi")
    assert (short.stdout, short.stderr) == ("hi\n", "")
    events = [e["type"] for e in json_lines(ql(env, "--json", "events", "last").stdout)]
    assert "log.truncated" not in events


def test_a_missing_cwd_is_named_and_an_unexecutable_command_is_127(env) -> None:
    out = ql(env, "run", "--cwd", "/nonexistent-ql-cwd", "--", "true")
    assert out.returncode == 1 and "working directory (cwd) '/nonexistent-ql-cwd' does not exist" in out.stderr
    assert "/bin/sh" not in out.stderr
    missing = ql(env, "run", "--", "/nonexistent-ql-command")
    assert missing.returncode == 127
    assert ql(env, "status", "last").stdout.split()[2:5] == ["failed", "exit", "127"]


# -- ql list --------------------------------------------------------------------------------------
def test_list_has_a_header_times_and_durations(env) -> None:
    done = detach(env, "true")
    ql(env, "wait", done)
    running = detach(env, "sleep", "120")
    try:
        lines = ql(env, "list").stdout.splitlines()
        assert lines[0].split() == ["RUN", "STATUS", "EXIT", "CREATED", "DURATION", "NAME"]
        assert lines[1].startswith(f"{running}  running") and "running for " in lines[1]
        assert lines[2].startswith(f"{done}  succeeded") and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  \d+\.\ds", lines[2])
        assert all("RUN" not in json.dumps(r) for r in json_lines(ql(env, "--json", "list").stdout))
    finally:
        ql(env, "cancel", running)


def test_list_before_anything_ran_exits_0(env) -> None:
    out = ql(env, "list")
    assert (out.returncode, out.stdout) == (0, "")
    assert out.stderr.startswith("ql: no runs: no ql data dir at ")


# -- ql supervise ----------------------------------------------------------------------------------
def test_supervise_says_1_round(env) -> None:
    detach(env, "true")  # nothing settles it: the supervisor's first round applies its receipt
    sup = subprocess.Popen(QL + ["supervise", "--interval", "3600"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert sup.stdout is not None
        seen: list[str] = []
        wait_until(lambda: seen.append(sup.stdout.readline()) or "applied=" in seen[-1] or sup.poll() is not None,
                   timeout=120, what="the first round")
        sup.send_signal(signal.SIGTERM)
        rest, err = sup.communicate(timeout=120)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.communicate()
    assert sup.returncode == 0, err
    assert "ql: stopped after 1 round\n" in rest
