"""`ql run` when its stdout goes away (item 4), and Ctrl-C: cancel 130, detach 125 (item 5)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env, json_lines, ql_proc
from tests.conftest import QL


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home", QL_DATA_DIR=str(tmp_path / "data"))


def test_head_does_not_turn_a_failure_into_success(env) -> None:
    """`ql run -- sh -c 'seq 1 200000; exit 3' | head -1` — ql's status is still 3."""
    out = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -1', "bash", *QL, "run", "--", "sh", "-c",
                          "seq 1 200000; exit 3"], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout == "1\n"
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr


def test_a_reader_that_leaves_early_does_not_stop_the_wait(env, tmp_path: Path) -> None:
    """The reader goes away while the task is still running: ql keeps waiting, then exits with its code."""
    proc = subprocess.Popen([*QL, "run", "--", "sh", "-c", "echo first; sleep 1; seq 1 100000; exit 5"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"first\n"
    proc.stdout.close()  # the reader leaves
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert b"Traceback" not in err
    log = ql_proc(["logs", json_lines(ql_proc(["--json", "list"], env).stdout)[0]["run_id"]], env).stdout
    assert log.startswith("first\n1\n") and log.endswith("100000\n")  # nothing lost from the log itself


@pytest.mark.parametrize("json_mode", [False, True])
def test_stdout_closed_from_the_start(env, json_mode: bool) -> None:
    args = ["--json"] * json_mode + ["run", "--", "sh", "-c", "echo out; exit 6"]
    out = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *QL, *args], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 6 and out.stderr == "", out.stderr
    # The database was not written through fd 1: the run is there and readable.
    rows = json_lines(ql_proc(["--json", "list"], env).stdout)
    assert [(r["status"], r["exit_code"]) for r in rows] == [("failed", 6)]


def _started(env, *command: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([*QL, "run", "--", *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_ctrl_c_cancels_with_130_and_twice_detaches_with_125(env) -> None:
    cancelled = _started(env, "sh", "-c", "echo ready; sleep 30")
    cancelled.send_signal(signal.SIGINT)
    _out, err = cancelled.communicate(timeout=60)
    assert cancelled.returncode == 130 and "ended cancelled" in err, err

    # A task that ignores TERM: the first Ctrl-C commits the cancel, the second detaches at once.
    detached = _started(env, "sh", "-c", "trap '' TERM; echo ready; sleep 30")
    detached.send_signal(signal.SIGINT)
    assert detached.stderr is not None
    first = detached.stderr.readline()  # the first Ctrl-C was handled: only now is the next one a second
    assert "Ctrl-C again to detach" in first, first
    detached.send_signal(signal.SIGINT)
    _out, err = detached.communicate(timeout=60)
    err = first + err
    assert detached.returncode == 125, err
    assert "detached" in err and "Traceback" not in err
    newest = json_lines(ql_proc(["--json", "list", "--limit", "1"], env).stdout)[0]
    assert newest["status"] == "running"  # it goes on (KILL follows after the grace)
    ql_proc(["cancel", newest["run_id"]], env)


def test_help_of_every_command_lists_its_exit_codes(env) -> None:
    from ql_core.cli.main import COMMANDS, EXIT_CODES, all_commands, exit_codes

    assert set(EXIT_CODES) == set(COMMANDS)
    names = all_commands()
    assert {"worker", "control", "workers"} <= set(names) - set(COMMANDS)  # the cluster plugin's
    for name in names:
        out = ql_proc([name, "--help"], env)
        assert out.returncode == 0, out.stderr
        assert "exit codes:" in out.stdout
        for code, _text in exit_codes(name):
            assert f"  {code} " in out.stdout, (name, code)
    run_help = ql_proc(["run", "--help"], env).stdout
    assert "125" in run_help and "130" in run_help and "124" in run_help and "75" in run_help
