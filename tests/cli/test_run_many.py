"""`ql run --detach --many FILE` on a local node: one run per line, the whole file checked first (one
wrong line submits nothing, the error names the line and never a value), ids printed in order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ql_core.cli.run_many import MAX_LOCAL_MANY
from tests.cli.cli_support import clean_env, json_lines, ql_proc


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home", QL_DATA_DIR=str(tmp_path / "data"))


def _lines(path: Path, *objs: object) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def _runs(env: dict[str, str]) -> list[dict[str, object]]:
    out = ql_proc(["--json", "list"], env)
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)


def test_each_line_is_a_run_with_its_own_options_and_the_ids_come_back_in_order(env: dict[str, str],
                                                                               tmp_path: Path) -> None:
    script = 'test "$QL_T_DAY" = "mon day" && test -n "$HOME"'  # added on top of ql's own environment
    tasks = _lines(tmp_path / "burst.jsonl",
                   {"command": ["true"], "name": "first"},
                   "",  # blank lines are skipped; line numbers stay the file's
                   {"command": ["sh", "-c", "exit 3"], "timeout": 30, "name": "second"},
                   {"command": ["sh", "-c", script], "env": {"QL_T_DAY": "mon day"}, "name": "third"},
                   {"command": ["echo $0"], "shell": True, "cwd": str(tmp_path), "name": "fourth"})
    out = ql_proc(["--json", "run", "--detach", "--many", str(tasks)], env)
    assert out.returncode == 0, out.stderr
    lines = json_lines(out.stdout)
    assert [line["line"] for line in lines] == [1, 3, 4, 5]
    assert {line["status"] for line in lines} == {"running"} and len({line["run_id"] for line in lines}) == 4
    for line, (name, code) in zip(lines, [("first", 0), ("second", 3), ("third", 0), ("fourth", 0)]):
        waited = ql_proc(["--json", "wait", str(line["run_id"])], env)
        assert waited.returncode == code, waited.stderr
        status = json.loads(ql_proc(["--json", "status", str(line["run_id"])], env).stdout)
        assert (status["name"], status["exit_code"]) == (name, code)
    events = ql_proc(["--json", "events", str(lines[2]["run_id"])], env)
    assert "mon day" not in events.stdout  # an env value is in no event
    # Text mode: the bare ids, one per line (RUNS=$(ql run --detach --many FILE)).
    text = ql_proc(["run", "--detach", "--many", str(_lines(tmp_path / "one.jsonl", {"command": ["true"]}))], env)
    assert text.returncode == 0 and len(text.stdout.split()) == 1 and len(text.stdout.strip()) == 36, text.stdout


@pytest.mark.parametrize("bad, says", [
    ('{"command": ["true"], "env": {"1BAD": "secretvalue"}}', 'line 2: "env" maps NAMEs'),
    ('{"command": "secretvalue"}', "line 2: command must be a list of arguments"),
    ('{"command": ["true"], "secretkey": 1}', "line 2 has a key ql run does not take"),
    ('{"command": ["true"], "timeout": -1}', "line 2: timeout_s"),
    ('{"command": ["true"], "retries": "secretvalue"}', 'line 2: "retries" must be a whole number'),
    ('["secretvalue"]', 'line 2 must be a JSON object with a "command"'),
    ('{"command": ["secretvalue"', "line 2 is not JSON"),
    ('{"command": ["true", 1]}', "line 2: command must be a list of str"),
])
def test_one_wrong_line_submits_nothing_and_the_error_names_the_line_not_the_value(
        env: dict[str, str], tmp_path: Path, bad: str, says: str) -> None:
    marker = tmp_path / "ran"
    tasks = _lines(tmp_path / "t.jsonl", {"command": ["touch", str(marker)]}, bad, {"command": ["true"]})
    out = ql_proc(["run", "--detach", "--many", str(tasks)], env)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "secretvalue" not in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == "" and not marker.exists()
    assert not (tmp_path / "data").exists() or _runs(env) == []


@pytest.mark.parametrize("args, says", [
    (["run", "--many", "F"], "give --detach too"),
    (["run", "--detach", "--many", "F", "--name", "x"], "put --name into the lines"),
    (["run", "--detach", "--many", "F", "--", "true"], "put the command into the lines"),
])
def test_many_takes_its_runs_from_the_file_only(env: dict[str, str], tmp_path: Path, args: list[str],
                                                says: str) -> None:
    tasks = _lines(tmp_path / "t.jsonl", {"command": ["true"]})
    out = ql_proc([str(tasks) if a == "F" else a for a in args], env)
    assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_what_is_not_a_regular_file_is_refused_without_blocking_and_stdin_works(env: dict[str, str],
                                                                               tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = ql_proc(["run", "--detach", "--many", str(fifo)], env)  # no writer: an open that blocks would hang
    assert out.returncode == 2 and "not a regular file" in out.stderr, out.stderr
    out = ql_proc(["run", "--detach", "--many", str(tmp_path / "missing")], env)
    assert out.returncode == 2 and "cannot open the file" in out.stderr, out.stderr
    empty = _lines(tmp_path / "empty.jsonl", "", "  ")
    out = ql_proc(["run", "--detach", "--many", str(empty)], env)
    assert out.returncode == 2 and "holds no run" in out.stderr, out.stderr
    import subprocess

    from tests.cli.cli_support import QL

    piped = subprocess.run([*QL, "--json", "run", "--detach", "--many", "-"], env=env, capture_output=True,
                           text=True, timeout=120, input=json.dumps({"command": ["true"]}) + "\n")
    assert piped.returncode == 0 and json_lines(piped.stdout)[0]["line"] == 1, piped.stderr


def test_a_node_that_runs_its_tasks_takes_a_bounded_number_per_file(env: dict[str, str], tmp_path: Path) -> None:
    tasks = _lines(tmp_path / "t.jsonl", *([{"command": ["true"]}] * (MAX_LOCAL_MANY + 1)))
    out = ql_proc(["run", "--detach", "--many", str(tasks)], env)
    assert out.returncode == 2 and f"at most {MAX_LOCAL_MANY}" in out.stderr and "cluster-control" in out.stderr
    assert not (tmp_path / "data").exists() or _runs(env) == []
