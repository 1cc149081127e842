"""Per-attempt log quota: enforced after the fact, never blocking or killing the task, no pipe."""

from __future__ import annotations

import os

import pytest
from tests.logs.logs_support import PY, reap, wait_for

QUOTA = 4096
CHUNK = 2048
STEPS = 20  # 20 x 2 KiB = 10 x the quota

# Writes STEPS chunks ("AAAA…", "BBBB…", …); after each one waits for <gate>/go<k> (when a gate is given).
GATED_WRITER = """
import os, sys, time
chunk, steps, gate, code = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
for k in range(steps):
    os.write(1, bytes([65 + k % 26]) * chunk)
    while gate != "-" and not os.path.exists(os.path.join(gate, "go%d" % k)):
        time.sleep(0.002)
sys.exit(code)
"""


def expected_output(steps: int = STEPS, chunk: int = CHUNK) -> bytes:
    return b"".join(bytes([65 + k % 26]) * chunk for k in range(steps))


def writer(gate: str = "-", code: int = 3, steps: int = STEPS, chunk: int = CHUNK) -> list[str]:
    return [PY, "-c", GATED_WRITER, str(chunk), str(steps), gate, str(code)]


def truncation_events(rt, run_id: str) -> list[dict]:
    return [e.as_dict() for e in rt.events(run_id) if e.type == "log.truncated"]


def test_ten_times_the_quota_keeps_the_true_exit_code_and_exactly_the_quota(runtime) -> None:
    from ql_core.log_retention import enforce_log_retention
    from ql_core.logs import log_facts

    sub = runtime.submit(writer(code=3), log_max_bytes=QUOTA)
    view = runtime.wait(sub)  # the fast path cuts the log after the terminal commit
    assert (view.status, view.exit_code) == ("failed", 3)
    log = runtime.log_path(sub.run_id)
    assert log.read_bytes() == expected_output()[:QUOTA]
    facts = log_facts(runtime.node, sub.log_artifact_id)
    assert facts is not None
    assert (facts.max_bytes, facts.truncated) == (QUOTA, True)  # the cut is recorded at once
    assert facts.size_bytes == QUOTA  # ... and the final size, right after the terminal commit
    assert enforce_log_retention(runtime.node, 16)["log_finalized"] == 0  # nothing left to size
    events = truncation_events(runtime, sub.run_id)
    assert len(events) == 1 and events[0]["reason"] == "LOG_MAX_BYTES"
    assert events[0]["attempt_id"] == sub.attempt_id


def test_between_rounds_the_file_holds_at_most_quota_plus_what_was_written_since(runtime, tmp_path) -> None:
    """The task and the test take turns: chunk k is written, one enforcement round runs, and only
    then may the task write chunk k+1 — so the documented bound can be checked exactly."""
    from ql_core.log_retention import LogKeeper
    from ql_core.logs import log_facts

    gate = tmp_path / "gate"
    gate.mkdir()
    sub = runtime.submit(writer(str(gate), code=0), log_max_bytes=QUOTA)
    log = runtime.log_path(sub.run_id)
    keeper = LogKeeper(runtime.node)
    written = 0
    cuts = 0
    for k in range(STEPS):
        before = min(written, QUOTA) + CHUNK
        written += CHUNK
        wait_for(lambda: log.stat().st_size == before)  # noqa: B023 - exactly: nothing else writes
        counts = keeper.round(16)
        cuts += counts["log_truncated"]
        assert log.stat().st_size == min(written, QUOTA)
        (gate / f"go{k}").touch()
    view = runtime.wait(sub)
    assert (view.status, view.exit_code) == ("succeeded", 0)
    assert cuts == STEPS - QUOTA // CHUNK  # every round after the quota was reached cut one chunk
    keeper.round(16)  # records the final size
    assert log.read_bytes() == expected_output()[:QUOTA]
    facts = log_facts(runtime.node, sub.log_artifact_id)
    assert facts is not None and facts.truncated and facts.size_bytes == QUOTA
    assert len(truncation_events(runtime, sub.run_id)) == 1  # recorded once, not once per cut


def test_readers_never_see_bytes_past_the_quota(runtime) -> None:
    from ql_core.follow import follow_log
    from ql_core.logs import read_log_chunk

    sub = runtime.submit(writer(), log_max_bytes=QUOTA)
    reap(sub)  # ended, but nobody finalized the log yet: the file is still past the quota (its
    log = runtime.log_path(sub.run_id)  # launcher cuts it to quota + 1 at most, ql to the quota)
    assert log.stat().st_size > QUOTA
    assert b"".join(c.data for c in follow_log(runtime, sub.run_id)) == expected_output()[:QUOTA]
    assert read_log_chunk(runtime.config.data_dir, sub.log_artifact_id, QUOTA - 10,
                          max_bytes=QUOTA) == expected_output()[QUOTA - 10:QUOTA]
    assert read_log_chunk(runtime.config.data_dir, sub.log_artifact_id, QUOTA, max_bytes=QUOTA) == b""


def test_a_follower_enforces_the_quota_and_finalizes_at_the_end(runtime) -> None:
    from ql_core.follow import follow_log
    from ql_core.logs import log_facts

    code = ("import os, time\nfor k in range(20):\n"
            "    os.write(1, bytes([65 + k]) * 2048); time.sleep(0.1)\n")
    sub = runtime.submit([PY, "-c", code], log_max_bytes=QUOTA)
    log = runtime.log_path(sub.run_id)
    sizes = []
    data = b""
    for chunk in follow_log(runtime, sub.run_id, follow=True):
        data += chunk.data
        sizes.append(log.stat().st_size)
    # the follower settled the run and cut the log before ending
    reap(sub)
    assert data == expected_output()[:QUOTA]
    assert log.stat().st_size == QUOTA
    assert max(sizes) < 20 * 2048  # cut while it ran, not only at the end
    facts = log_facts(runtime.node, sub.log_artifact_id)
    assert facts is not None and facts.truncated
    assert runtime.status(sub.run_id).status == "succeeded"


def test_the_quota_limits_only_the_log_not_other_files_and_sends_no_signal(runtime, tmp_path) -> None:
    other = tmp_path / "other.bin"
    code = ("import os, sys\nf = open(sys.argv[1], 'wb')\n"
            "for _ in range(40):\n    os.write(1, b'x' * 1024); f.write(b'y' * 1024)\n"
            "f.close()\n")
    sub = runtime.submit([PY, "-c", code, str(other)], log_max_bytes=QUOTA)
    view = runtime.wait(sub)
    assert (view.status, view.exit_code) == ("succeeded", 0)  # no SIGXFSZ, no EFBIG
    assert other.stat().st_size == 40 * 1024
    assert runtime.log_path(sub.run_id).stat().st_size == QUOTA


def test_under_the_quota_nothing_is_cut_and_the_size_is_recorded(runtime) -> None:
    from ql_core.log_retention import enforce_log_retention
    from ql_core.logs import log_facts

    sub = runtime.submit(["sh", "-c", "echo hello"], log_max_bytes=QUOTA)
    runtime.wait(sub)
    enforce_log_retention(runtime.node, 16)
    facts = log_facts(runtime.node, sub.log_artifact_id)
    assert facts is not None and (facts.size_bytes, facts.truncated) == (6, False)
    assert truncation_events(runtime, sub.run_id) == []


def test_the_profile_quota_is_the_default_and_the_override_is_validated(runtime) -> None:
    from ql_core.errors import UsageError
    from ql_core.logs import log_facts

    sub = runtime.submit(["true"])
    runtime.wait(sub)
    facts = log_facts(runtime.node, sub.log_artifact_id)
    assert facts is not None and facts.max_bytes == runtime.profile.log_max_bytes
    for bad in (10, 1 << 41, True, 2.5):
        with pytest.raises(UsageError, match="log_max_bytes"):
            runtime.submit(["true"], log_max_bytes=bad)


def test_the_quota_pass_is_bounded_and_resumes_from_its_cursor(runtime, tmp_path) -> None:
    from ql_core.logs import enforce_log_quotas

    gate = tmp_path / "gate"
    gate.mkdir()
    subs = [runtime.submit(writer(str(gate), steps=3), log_max_bytes=QUOTA) for _ in range(5)]
    for sub in subs:
        wait_for(lambda s=sub: runtime.log_path(s.run_id).stat().st_size == CHUNK)
    for k in range(2):  # let every task write its 3 chunks (6 KiB > 4 KiB)
        (gate / f"go{k}").touch()
    for sub in subs:
        wait_for(lambda s=sub: runtime.log_path(s.run_id).stat().st_size == 3 * CHUNK)
    seen = 0
    cursor = ""
    rounds = 0
    while True:
        counts, cursor = enforce_log_quotas(runtime.node, 2, cursor=cursor)
        assert counts["log_quota_checked"] <= 2
        seen += counts["log_truncated"]
        rounds += 1
        if not cursor:
            break
    assert seen == 5 and rounds == 3
    (gate / "go2").touch()
    for sub in subs:
        assert runtime.wait(sub).exit_code == 3
        assert runtime.log_path(sub.run_id).stat().st_size == QUOTA


def test_a_symlinked_log_is_never_followed_when_cutting(runtime, tmp_path) -> None:
    from ql_core.errors import UnsafePathError
    from ql_core.logs import enforce_log_quota, log_facts

    sub = runtime.submit(["sh", "-c", "echo hi"], log_max_bytes=QUOTA)
    runtime.wait(sub)
    victim = tmp_path / "victim"
    victim.write_bytes(b"v" * (QUOTA * 2))
    log = runtime.log_path(sub.run_id)
    log.unlink()
    os.symlink(victim, log)
    facts = log_facts(runtime.node, sub.log_artifact_id)
    assert facts is not None
    with pytest.raises(UnsafePathError):
        enforce_log_quota(runtime.node, facts)
    assert victim.stat().st_size == QUOTA * 2

