"""Log paths: this version creates every log in a time shard (``logs/t<tt>/``); the random shards
(``logs/<xx>/``) where older versions created theirs are still read, followed and deleted by retention
— after an upgrade, and while an older process still writes there."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.conftest import json_lines, run_ql, status_json


def _log_id(env: dict[str, str], run_id: str) -> str:
    return status_json(env, run_id)["attempts"][0]["log_artifact_id"]


def _files(data_dir: Path) -> dict[str, str]:
    """Every log file: its id -> its shard directory's name."""
    return {p.stem: p.parent.name for p in (data_dir / "logs").glob("*/*.log")}


def _to_older_layout(data_dir: Path, log_id: str) -> None:
    """Move a log where versions before the time shards created it (``<xx>/``). A task still writing
    it goes on writing there (its descriptor follows the file), as an older launcher would."""
    from ql_core.paths import legacy_log_relative_path, log_relative_path

    logs = data_dir / "logs"
    legacy = logs / legacy_log_relative_path(log_id)
    legacy.parent.mkdir(mode=0o700, exist_ok=True)
    os.rename(logs / log_relative_path(log_id), legacy)


def test_time_shard_is_bits_16_to_23_of_the_milliseconds() -> None:
    from ql_core.ids import new_id, time_shard_of

    for ms in (0, 65_535, 65_536, 1_796_590_489_805, (1 << 48) - 1):
        log_id = new_id(ms)
        assert int(log_id[:8] + log_id[9:13], 16) == ms  # the id's top 48 bits: its milliseconds
        assert time_shard_of(log_id) == f"{(ms >> 16) & 0xFF:02x}"
    # ~65 s share a directory; 256 of them come round every ~4.7 h.
    assert time_shard_of(new_id(5 << 16)) == time_shard_of(new_id((6 << 16) - 1)) != time_shard_of(new_id(6 << 16))
    assert time_shard_of(new_id(5 << 16)) == time_shard_of(new_id((5 + 256) << 16))


def test_every_new_log_is_in_its_time_shard(runtime) -> None:
    from ql_core.ids import time_shard_of

    subs = [runtime.submit(["sh", "-c", f"echo {i}"]) for i in range(3)]
    for sub in subs:
        runtime.wait(sub)
    data_dir = runtime.node.config.data_dir
    assert _files(data_dir) == {s.log_artifact_id: f"t{time_shard_of(s.log_artifact_id)}" for s in subs}
    for i, sub in enumerate(subs):
        assert runtime.log_path(sub.run_id).read_bytes() == f"{i}\n".encode()
    assert not [p for p in (data_dir / "logs").iterdir() if not p.name.startswith("t")]


def test_logs_in_the_older_layout_are_read_followed_and_deleted_by_retention(data_dir: Path, ql_env,
                                                                             tmp_path: Path) -> None:
    """A data dir an older version used (its logs in random shards, one task of it still running and
    writing there): every log is read by ``ql logs``, the running one followed to its end, new logs go
    to time shards, and retention deletes old and new where they are."""
    from ql_core.ids import shard_of, time_shard_of

    old = []
    for i in range(4):
        done = run_ql(["--json", "run", "--", "sh", "-c", f"echo old {i}"], ql_env)
        assert done.returncode == 0, done.stderr
        old.append(json_lines(done.stdout)[0]["run_id"])
    quiet = json_lines(run_ql(["--json", "run", "--", "true"], ql_env).stdout)[0]["run_id"]
    go, wrote = tmp_path / "go", tmp_path / "wrote"
    running = json_lines(run_ql(["--json", "run", "--detach", "--", "sh", "-c",
                                 f'echo before; touch "{wrote}"; while [ ! -e "{go}" ]; do sleep 0.02; done; '
                                 f'echo after'], ql_env).stdout)[0]["run_id"]
    deadline = time.monotonic() + 30
    while not wrote.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert wrote.exists(), "the detached task never started"
    old_ids = {_log_id(ql_env, r) for r in old + [running]}
    for log_id in old_ids:
        _to_older_layout(data_dir, log_id)
    assert _files(data_dir) == {i: shard_of(i) for i in old_ids}

    for i, run_id in enumerate(old):
        out = run_ql(["logs", run_id], ql_env)
        assert out.returncode == 0 and out.stdout == f"old {i}\n", out.stderr
    assert run_ql(["logs", quiet], ql_env).stdout == ""
    new = json_lines(run_ql(["--json", "run", "--", "sh", "-c", "echo new"], ql_env).stdout)[0]["run_id"]
    new_id = _log_id(ql_env, new)
    assert _files(data_dir)[new_id] == f"t{time_shard_of(new_id)}"
    assert run_ql(["logs", new], ql_env).stdout == "new\n"
    go.touch()
    out = run_ql(["logs", "--follow", running], ql_env, timeout=30)
    assert out.returncode == 0 and out.stdout == "before\nafter\n", out.stderr

    from ql_core.config import load_config
    from ql_core.log_retention import enforce_log_retention
    from ql_core.runtime import Runtime

    conf = tmp_path / "retention.toml"
    conf.write_text("[limits]\nlog_retention_s = 3600\n")
    rt = Runtime.open(load_config(config_path=conf, data_dir=data_dir, environ={}, cwd=tmp_path), environ={})
    try:
        from tests import dbview

        dbview.rows(rt, "UPDATE ql_log_artifact SET created_at_ms = created_at_ms - 7200000", ())
        counts = enforce_log_retention(rt.node, 64)
        # and the followed and the new run; the quiet one's log is empty (dropped at its end, its size
        # 0 recorded): nothing to expire (migration 0020 lists no empty log)
        assert counts["log_expired"] == len(old) + 2, counts
    finally:
        rt.close()
    assert _files(data_dir) == {}
    for run_id in old + [new]:
        out = run_ql(["logs", run_id], ql_env)
        assert out.returncode == 0 and out.stdout == "" and "deleted" in out.stderr
    out = run_ql(["logs", quiet], ql_env)
    assert out.returncode == 0 and out.stdout == "" and "deleted" not in out.stderr


def test_a_symlink_in_the_older_layout_is_never_followed(data_dir: Path, ql_env, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not a log\n")
    run_id = json_lines(run_ql(["--json", "run", "--", "sh", "-c", "echo mine"], ql_env).stdout)[0]["run_id"]
    log_id = _log_id(ql_env, run_id)
    _to_older_layout(data_dir, log_id)
    from ql_core.paths import legacy_log_relative_path

    legacy = data_dir / "logs" / legacy_log_relative_path(log_id)
    legacy.unlink()
    legacy.symlink_to(secret)
    out = run_ql(["logs", run_id], ql_env)
    assert out.returncode != 0 and "not a log" not in out.stdout and "symlink" in out.stderr, (out.stdout, out.stderr)
    assert secret.read_text() == "not a log\n"
