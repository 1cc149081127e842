"""Log retention by age and total size: bounded per call, never an active attempt's log."""

from __future__ import annotations

import os
import shutil

from tests.logs.logs_support import PY

from tests import dbview
from tests.conftest import run_ql


def backdate(rt, run_ids: list[str], ms: int) -> None:
    for run_id in run_ids:
        dbview.rows(rt, "UPDATE ql_log_artifact SET created_at_ms = created_at_ms - ? WHERE run_id = ?", (ms, run_id))


def finished(rt, argv: list[str]) -> str:
    sub = rt.submit(argv)
    rt.wait(sub)
    return sub.run_id


def facts_of(rt, run_id: str):
    from ql_core.logs import log_facts

    return log_facts(rt.node, rt.status(run_id).log_artifact_id)


def test_old_logs_of_ended_runs_are_deleted_active_and_blocked_ones_never(make_runtime) -> None:
    from ql_core.log_retention import enforce_log_retention

    rt = make_runtime(limits={"log_retention_s": 3600})
    ended = [finished(rt, ["sh", "-c", f"echo run {i}"]) for i in range(3)]
    blocked = finished(rt, ["sh", "-c", "echo blocked"])
    # as if its identity had become unverifiable
    dbview.rows(rt, "UPDATE ql_run_attempt SET status = 'blocked' WHERE run_id = ?", (blocked,))
    active = rt.submit(["sh", "-c", "echo active; sleep 30"])
    fresh = finished(rt, ["sh", "-c", "echo fresh"])
    try:
        backdate(rt, ended + [blocked, active.run_id], 2 * 3600 * 1000)
        counts = enforce_log_retention(rt.node, 16)
        assert counts["log_expired"] == 3, counts
        for run_id in ended:
            assert not rt.log_path(run_id).exists()
            facts = facts_of(rt, run_id)
            assert facts.deleted and facts.size_bytes == len("run 0\n")
        for run_id in (blocked, active.run_id, fresh):
            assert rt.log_path(run_id).exists() and not facts_of(rt, run_id).deleted
        assert enforce_log_retention(rt.node, 16)["log_expired"] == 0  # idempotent
    finally:
        rt.cancel(active.run_id)
        rt.wait(active)


def test_each_call_deletes_at_most_limit_logs(make_runtime) -> None:
    from ql_core.log_retention import enforce_log_retention

    rt = make_runtime(limits={"log_retention_s": 3600})
    # Logs with bytes in them: an empty one (sized 0, its file dropped at the end) is not retention's.
    runs = [finished(rt, ["sh", "-c", "echo kept"]) for _ in range(5)]
    backdate(rt, runs, 2 * 3600 * 1000)
    assert [enforce_log_retention(rt.node, 2)["log_expired"] for _ in range(4)] == [2, 2, 1, 0]


def test_the_total_size_cap_evicts_the_oldest_first(make_runtime) -> None:
    from ql_core.log_retention import enforce_log_retention

    rt = make_runtime(limits={"log_total_max_bytes": 1024 * 1024})
    write = [PY, "-c", "import os\nos.write(1, b'z' * 400 * 1024)\n"]
    runs = [finished(rt, write) for _ in range(4)]  # 1.6 MiB in total
    busy = rt.submit([PY, "-c", "import os, time\nos.write(1, b'q' * 900 * 1024); time.sleep(30)\n"])
    try:
        counts = enforce_log_retention(rt.node, 16)
        assert counts["log_evicted"] == 2, counts
        assert [facts_of(rt, r).deleted for r in runs] == [True, True, False, False]
        assert rt.log_path(busy.run_id).exists()  # active: neither counted nor deleted
        assert enforce_log_retention(rt.node, 16)["log_evicted"] == 0
    finally:
        rt.cancel(busy.run_id)
        rt.wait(busy)


def test_the_process_that_ends_a_run_records_its_log_size(make_runtime) -> None:
    """Sizing happens when the run ends — by the waiting host (fast path) or by whoever settles it
    (a round, a reader) — not by a later capped pass (docs/logs.md "Size at the end")."""
    rt = make_runtime()
    waited = finished(rt, ["sh", "-c", "printf 12345"])
    assert facts_of(rt, waited).size_bytes == 5  # the fast path, right after its terminal commit
    sub = rt.submit([PY, "-c", "import os\nos.write(1, b'k' * 5000)\n"], log_max_bytes=2048)
    sub.task.live.process.wait()
    rt.recover_attempt(sub.attempt_id)  # the round's path: receipt -> terminal -> size, cut to quota
    assert rt.status(sub.run_id).terminal
    facts = facts_of(rt, sub.run_id)
    assert (facts.size_bytes, facts.truncated) == (2048, True)
    assert rt.log_path(sub.run_id).stat().st_size == 2048


def test_a_log_left_unsized_by_a_crash_is_sized_by_the_next_pass(make_runtime) -> None:
    """A crash between the terminal commit and the sizing leaves the log in the sizing queue
    (ix_ql_log_unsized); the next retention pass cuts and sizes it."""
    from ql_core.log_retention import enforce_log_retention

    rt = make_runtime()
    sub = rt.submit([PY, "-c", "import os\nos.write(1, b'k' * 5000)\n"], log_max_bytes=2048)
    sub.task.live.process.wait()
    rt.recover_attempt(sub.attempt_id)
    # What a process killed right after the terminal commit leaves: an ended log, not sized, longer
    # than its quota (the task wrote it all before it ended).
    log = rt.log_path(sub.run_id)
    log.write_bytes(b"k" * 5000)
    dbview.rows(rt, "UPDATE ql_log_artifact SET size_bytes = NULL WHERE run_id = ?", (sub.run_id,))
    counts = enforce_log_retention(rt.node, 16)
    assert counts["log_finalized"] == 1 and counts["log_truncated"] == 1
    facts = facts_of(rt, sub.run_id)
    assert (facts.size_bytes, facts.truncated) == (2048, True)
    assert log.stat().st_size == 2048
    assert enforce_log_retention(rt.node, 16)["log_finalized"] == 0  # out of the queue


def test_a_symlinked_shard_is_never_followed(make_runtime, tmp_path) -> None:
    from ql_core.log_retention import enforce_log_retention

    rt = make_runtime(limits={"log_retention_s": 3600})
    run_id = finished(rt, ["sh", "-c", "echo mine"])
    log = rt.log_path(run_id)
    outside = tmp_path / "outside"
    shutil.move(str(log.parent), outside)
    os.symlink(outside, log.parent)
    backdate(rt, [run_id], 2 * 3600 * 1000)
    counts = enforce_log_retention(rt.node, 16)
    # Its size was recorded when it ended (before the shard was swapped): only the expiry is refused.
    assert counts["log_errors"] == 1 and counts["log_expired"] == 0
    assert (outside / log.name).read_bytes() == b"mine\n"
    assert not facts_of(rt, run_id).deleted


def test_log_keeper_round_and_the_cli_note_for_a_deleted_log(make_runtime, ql_env, tmp_path) -> None:
    from ql_core.log_retention import LogKeeper

    rt = make_runtime(limits={"log_retention_s": 3600})
    run_id = finished(rt, ["sh", "-c", "echo gone"])
    backdate(rt, [run_id], 2 * 3600 * 1000)
    counts = LogKeeper(rt.node).round(8)
    assert counts["log_expired"] == 1
    out = run_ql(["logs", run_id], dict(ql_env, QL_CONFIG=str(tmp_path / "ql.toml")))
    assert out.returncode == 0 and out.stdout == ""
    assert "deleted by retention" in out.stderr
