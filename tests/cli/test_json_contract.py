"""One JSON contract (item 5, docs/cli.md): field names per command, errors as JSON, logs that keep every byte."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.cli.cli_support import clean_env, json_lines, ql_proc

#: The only values `status` may take anywhere in ql's JSON: a run's or an attempt's state.
STATES = {"queued", "starting", "running", "succeeded", "failed", "cancelled", "timed_out", "lost", "blocked"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return clean_env(tmp_path / "home", QL_DATA_DIR=str(tmp_path / "data"))


def _json(env, *args: str, rc: int = 0) -> list[dict]:
    out = ql_proc(["--json", *args], env)
    assert out.returncode == rc, (args, out.stderr)
    return json_lines(out.stdout)


def _statuses(value: object) -> list[object]:
    """Every value of a key named status, at any depth."""
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "status"] + [s for v in value.values() for s in _statuses(v)]
    if isinstance(value, list):
        return [s for v in value for s in _statuses(v)]
    return []


def test_every_command_uses_status_only_for_run_and_attempt_states(env, tmp_path: Path) -> None:
    records = _json(env, "run", "--name", "x", "--", "sh", "-c", "echo hi")
    run_id = records[0]["run_id"]
    records += _json(env, "run", "--detach", "--", "true")
    records += _json(env, "status", run_id) + _json(env, "list") + _json(env, "events", run_id)
    records += _json(env, "logs", run_id) + _json(env, "cancel", run_id) + _json(env, "reconcile")
    records += _json(env, "doctor") + _json(env, "db", "upgrade") + _json(env, "plugins")
    records += _json(env, "audit", "receipts", "--shards", "32")
    found = _statuses(records)
    assert found and {s for s in found if s is not None} <= STATES, found


def test_field_sets(env) -> None:
    run_id = _json(env, "run", "--", "sh", "-c", "exit 2", rc=2)[0]["run_id"]
    (status,) = _json(env, "status", run_id)
    assert set(status) == {"run_id", "name", "status", "exit_code", "reason", "created_at_ms", "finished_at_ms",
                           "deadline_at_ms", "cancel_reason", "attempts"}
    assert set(status["attempts"][0]) == {"attempt_id", "attempt_no", "status", "exit_code", "reason", "executor",
                                          "created_at_ms", "started_at_ms", "finished_at_ms", "log_artifact_id"}
    (row,) = _json(env, "list")
    assert set(row) == {"run_id", "status", "exit_code", "reason", "name", "created_at_ms", "finished_at_ms",
                        "verified"}
    assert row["verified"] is True  # a terminal run is settled
    assert row["finished_at_ms"] >= row["created_at_ms"]
    events = _json(env, "events", run_id)  # one event per line, like list
    assert [e["seq"] for e in events] == [1, 2, 3, 4] and all(e["run_id"] == run_id for e in events)
    assert set(events[0]) == {"run_id", "seq", "type", "attempt_id", "status", "exit_code", "reason", "at_ms"}
    assert _json(env, "cancel", run_id) == [{"run_id": run_id, "outcome": "already_terminal"}]
    (counts,) = _json(env, "reconcile")
    from ql_core.cli.cmd_reconcile import COUNT_KEYS

    assert list(counts) == ["complete", "rounds", "attempts_checked", "journal_checked", *COUNT_KEYS, "other"]
    doctor = _json(env, "doctor")
    assert set(doctor[0]) == {"config"} and set(doctor[-1]) == {"healthy", "checks", "data_dir", "profile"}
    assert all(set(r) == {"check", "result", "detail"} for r in doctor[1:-1])
    assert doctor[-1]["checks"] == {r["check"]: r["result"] for r in doctor[1:-1]}


@pytest.mark.parametrize("args,kind,rc", [
    (["frobnicate"], "usage", 2),
    (["list", "--status", "done"], "usage", 2),
    (["status", "01a22b46-155c-7d09-872b-21304a383465"], "not_found", 1),
    (["--config", "/nonexistent/ql.toml", "list"], "config", 2),
])
def test_errors_are_one_json_object_on_stderr(env, args: list[str], kind: str, rc: int) -> None:
    ql_proc(["run", "--", "true"], env)
    out = ql_proc(["--json", *args], env)
    assert out.returncode == rc and out.stdout == ""
    (line,) = out.stderr.splitlines()
    error = json.loads(line)
    assert set(error) == {"error", "message", "exit_code"}
    assert (error["error"], error["exit_code"]) == (kind, rc) and error["message"]


def test_status_values_are_validated(env) -> None:
    out = ql_proc(["list", "--status", "success"], env)
    assert out.returncode == 2 and "succeeded" in out.stderr
    for state in ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"):
        assert ql_proc(["list", "--status", state], env).returncode in (0, 1)  # 1: no data dir yet


def test_names_are_escaped_in_text_and_exact_in_json(env) -> None:
    name = "evil\nname\x1b[2J\u202e\\"
    run_id = _json(env, "run", "--name", name, "--", "true")[0]["run_id"]
    listed = ql_proc(["list"], env).stdout
    # a header and one row
    assert listed.count("\n") == 2 and listed.startswith("RUN ") and "\x1b" not in listed and "\u202e" not in listed
    assert "evil\\nname\\x1b[2J\\u202e\\\\" in listed
    shown = ql_proc(["status", run_id], env).stdout
    assert "\x1b" not in shown and "evil\\nname" in shown
    assert _json(env, "status", run_id)[0]["name"] == name


def _log_bytes(records: list[dict]) -> bytes:
    out = b""
    for r in records:
        out += r["data"].encode("utf-8") if r["encoding"] == "utf-8" else base64.b64decode(r["data"])
    return out


def test_logs_json_never_splits_a_character_and_keeps_every_byte(env, tmp_path: Path) -> None:
    # 65535 ASCII bytes, then a 3-byte character across the 64 KiB chunk boundary, then bytes that are
    # not UTF-8 at all, then more text.
    script = tmp_path / "emit.py"
    script.write_text("import sys\n"
                      "sys.stdout.buffer.write(b'a' * 65535 + '\u20ac'.encode() + b'\\n' + b'\\xff\\xfe\\x00raw'"
                      " + b'\\n' + 'z\u00e9\\n'.encode() * 3)\n")
    import sys

    run_id = _json(env, "run", "--", sys.executable, str(script))[0]["run_id"]
    records = _json(env, "logs", run_id)
    chunks, state = records[:-1], records[-1]
    data = (tmp_path / "data")
    on_disk = next(data.glob("logs/*/*.log")).read_bytes()
    assert _log_bytes(chunks) == on_disk
    for r in chunks:
        assert set(r) == {"run_id", "offset", "end", "encoding", "data"}
        if r["encoding"] == "utf-8":
            assert "\ufffd" not in r["data"]
    assert any(r["encoding"] == "base64" for r in chunks)
    assert "\u20ac" in "".join(r["data"] for r in chunks if r["encoding"] == "utf-8")
    assert [r["offset"] for r in chunks[1:]] == [r["end"] for r in chunks[:-1]]  # contiguous
    assert set(state) == {"run_id", "status", "exit_code", "reason", "end", "log_truncated", "log_deleted"}
    assert (state["status"], state["end"]) == ("succeeded", len(on_disk))
    # Resuming at the end gives nothing new but the state; resuming in the middle of the euro sign
    # never produces a replacement character either.
    assert _json(env, "logs", run_id, "--offset", str(state["end"]))[:-1] == []
    middle = _json(env, "logs", run_id, "--offset", "65536")
    assert _log_bytes(middle[:-1]) == on_disk[65536:]


def test_logs_follow_json_ends_with_the_state(env) -> None:
    run_id = _json(env, "run", "--detach", "--", "sh", "-c", "echo one; sleep 0.5; echo two; exit 9")[0]["run_id"]
    records = _json(env, "logs", "--follow", run_id, rc=9)  # --follow exits with the run's exit status
    assert "".join(r["data"] for r in records[:-1]) == "one\ntwo\n"
    assert (records[-1]["status"], records[-1]["exit_code"]) == ("failed", 9)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=20).map(str.encode), st.binary(max_size=8)), max_size=8),
       st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_json_chunks_keep_every_byte_at_any_split(parts: list[bytes], cuts: list[int]) -> None:
    from ql_core.cli.cmd_logs import JsonChunks

    data = b"".join(parts)
    points = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = JsonChunks("r", 0)
    records = []
    for a, b in zip(points, points[1:]):
        records += chunks.feed(data[a:b])
    records += chunks.flush()
    assert _log_bytes(records) == data
    assert [r["offset"] for r in records] == [0, *(r["end"] for r in records[:-1])][:len(records)]
    for r in records:
        if r["encoding"] == "utf-8":
            assert r["data"] and "\ufffd" not in r["data"] or "\ufffd" in data.decode("utf-8", "ignore")
