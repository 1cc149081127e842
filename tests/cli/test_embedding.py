"""The embedding API as docs/api.md documents it (item 6): typed views without secrets, readers that
create nothing, re-attaching by run id, a supervisor whose first round runs at start."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from ql_core.config import load_config
from ql_core.errors import NotFoundError
from ql_core.records import AttemptView, EventRecord, RunView
from ql_core.runtime import Runtime
from tests.cli.cli_support import clean_env, json_lines, ql_proc


def _detached(tmp_path: Path, *command: str) -> str:
    """Submit from another process (`ql run --detach`), as a host that died after submitting would."""
    (tmp_path / "home").mkdir(exist_ok=True)
    out = ql_proc(["--json", "--data-dir", str(tmp_path / "d"), "run", "--detach", "--", *command],
                  clean_env(tmp_path / "home"))
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)[0]["run_id"]


def test_views_are_typed_and_carry_no_token(tmp_path: Path) -> None:
    with Runtime.open(load_config(data_dir=tmp_path / "d")) as rt:
        sub = rt.submit(["sh", "-c", "exit 4"], name="typed")
        view = rt.wait(sub)
        assert isinstance(view, RunView) and view.terminal and (view.status, view.exit_code) == ("failed", 4)
        assert all(isinstance(a, AttemptView) for a in view.attempts)
        assert view.current_attempt is view.attempts[-1] and view.log_artifact_id == sub.log_artifact_id
        for record in (view, *view.attempts):
            names = set(getattr(record, "_fields", ())) or {f.name for f in dataclasses.fields(record)}
            assert names and not {n for n in names if "token" in n or "handle" in n}, names
        assert "token" not in str(view.as_dict()) and sub.token not in repr(view) and sub.token not in repr(sub)
        events = rt.events(sub.run_id)
        assert all(isinstance(e, EventRecord) for e in events) and events[-1].type == "run.failed"
        assert [v.run_id for v in rt.list_runs(status="failed")] == [sub.run_id]
        with pytest.raises(AttributeError):  # immutable
            view.status = "succeeded"  # type: ignore[misc]


def test_a_reader_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no ql data dir"):
        Runtime.open(load_config(data_dir=tmp_path / "typo"), create=False)
    assert not (tmp_path / "typo").exists()


def test_wait_by_run_id_reattaches_and_settle_ends_a_finished_run(tmp_path: Path) -> None:
    config = load_config(data_dir=tmp_path / "d")
    run_id = _detached(tmp_path, "sh", "-c", "sleep 0.3; exit 6")
    with Runtime.open(config, create=False) as reader:  # a restarted host re-attaches by id
        view = reader.wait(run_id)
        assert (view.status, view.exit_code) == ("failed", 6)
    other_id = _detached(tmp_path, "true")
    deadline = time.monotonic() + 20
    receipts = tmp_path / "d" / "receipts"
    while not list(receipts.glob("*/*.json")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with Runtime.open(config, create=False) as reader:
        shown = reader.status(other_id)
        assert shown.status == "running"  # committed facts only, until someone settles it
        reader.settle(shown)
        assert reader.status(other_id).status == "succeeded"


def test_the_supervisors_first_round_runs_at_start(tmp_path: Path) -> None:
    config = load_config(data_dir=tmp_path / "d")
    run_id = _detached(tmp_path, "true")
    deadline = time.monotonic() + 20
    while not list((tmp_path / "d" / "receipts").glob("*/*.json")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with Runtime.open(config) as rt:
        supervisor = rt.supervisor()  # edge: 30 s between rounds, but the first is at start()
        assert supervisor.interval_s == 30
        watch = rt.start_wakeups(supervisor)
        supervisor.start()
        try:
            while rt.status(run_id).status != "succeeded":
                assert time.monotonic() < deadline, "the startup round did not settle the run"
                time.sleep(0.05)
        finally:
            assert supervisor.stop() is True
            if watch is not None:
                watch.stop()
