"""Following a log: offsets, reconnects, waiting past the end, no tailer without a follower (gate 8)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.logs.logs_support import PY, lines_output, lines_script, reap, thread_names, wait_for

from tests.conftest import QL, run_ql


def test_follow_from_zero_and_from_a_middle_offset(runtime) -> None:
    from ql_core.follow import follow_log

    sub = runtime.submit(lines_script(40, 0.01, exit_code=3))
    chunks = list(follow_log(runtime, sub.run_id, follow=True))
    reap(sub)
    expected = lines_output(40)
    assert b"".join(c.data for c in chunks) == expected
    # contiguous: every chunk starts where the previous one ended
    assert chunks[0].offset == 0
    assert all(a.end == b.offset for a, b in zip(chunks, chunks[1:]))
    view = runtime.status(sub.run_id)
    assert (view.status, view.exit_code) == ("failed", 3)

    middle = len(expected) // 3 + 5
    tail = list(follow_log(runtime, sub.run_id, offset=middle))
    assert tail[0].offset == middle
    assert b"".join(c.data for c in tail) == expected[middle:]
    assert list(follow_log(runtime, sub.run_id, offset=len(expected) + 100)) == []


def test_reconnect_from_last_offset_has_no_loss_and_no_duplicate(runtime) -> None:
    """A follower stops mid-run; a new one starts at the last end; together: the exact output."""
    from ql_core.follow import follow_log

    n = 150
    sub = runtime.submit(lines_script(n, 0.01))
    received = bytearray()
    first = follow_log(runtime, sub.run_id, follow=True, chunk_bytes=100)
    for chunk in first:
        assert chunk.offset == len(received)
        received += chunk.data
        if len(received) >= 700:
            break
    first.close()
    assert runtime.status(sub.run_id).status == "running"  # really mid-run
    resume_at = len(received)
    second = follow_log(runtime, sub.run_id, offset=resume_at, follow=True, chunk_bytes=100)
    for chunk in second:
        assert chunk.offset == len(received)
        received += chunk.data
    reap(sub)
    assert bytes(received) == lines_output(n)
    assert runtime.status(sub.run_id).status == "succeeded"


def test_offset_past_the_end_waits_for_the_bytes(runtime) -> None:
    from ql_core.follow import follow_log

    code = ("import sys, time\nsys.stdout.write('a' * 100); sys.stdout.flush(); time.sleep(0.8)\n"
            "sys.stdout.write('b' * 100); sys.stdout.flush()\n")
    sub = runtime.submit([PY, "-c", code])
    wait_for(lambda: runtime.log_path(sub.run_id).stat().st_size >= 100)
    started = time.monotonic()
    chunks = list(follow_log(runtime, sub.run_id, offset=150, follow=True))
    waited = time.monotonic() - started
    reap(sub)
    assert b"".join(c.data for c in chunks) == b"b" * 50
    assert chunks[0].offset == 150
    assert waited > 0.3  # it waited for the task instead of returning at the end of the file


def test_no_thread_timer_or_fd_exists_while_nobody_follows(runtime) -> None:
    """Gate 8: a plain read starts nothing; a follower starts no thread; nothing remains after it."""
    from ql_core.follow import follow_log

    before = thread_names()
    fds_before = len(os.listdir("/proc/self/fd"))
    sub = runtime.submit(lines_script(30, 0.02))
    seen_during: set[str] = set()
    for _chunk in follow_log(runtime, sub.run_id, follow=True):
        seen_during |= thread_names()
    reap(sub)
    assert seen_during <= before, f"a follower started threads: {seen_during - before}"
    plain = follow_log(runtime, sub.run_id)
    assert thread_names() <= before  # creating the generator does nothing at all
    data = b"".join(c.data for c in plain)
    assert data == lines_output(30)
    assert thread_names() <= before
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_a_suspended_follower_holds_no_open_file(runtime) -> None:
    from ql_core.follow import follow_log

    sub = runtime.submit(lines_script(20, 0.02))
    follower = follow_log(runtime, sub.run_id, follow=True)
    next(follower)
    log = str(runtime.log_path(sub.run_id))
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")]
    assert log not in open_files
    follower.close()
    reap(sub)


def _timed_task(runtime, argv: list[str]) -> float:
    started = time.monotonic()
    sub = runtime.submit(argv)
    runtime.wait(sub)
    return time.monotonic() - started


def test_a_stalled_follower_does_not_slow_the_task(runtime, ql_env) -> None:
    """20 MB of output with (a) no follower, (b) a follower generator that is never advanced again,
    (c) `ql logs --follow` whose stdout pipe nobody reads. Precise numbers: bench/bench_logs.py."""
    from ql_core.follow import follow_log

    writer = [PY, "-c", "import os\nb = b'x' * 65536\nfor _ in range(320): os.write(1, b)\n"]
    baseline = _timed_task(runtime, writer)

    sub = runtime.submit(writer)
    stalled = follow_log(runtime, sub.run_id, follow=True)
    next(stalled)  # read once, then never again
    started = time.monotonic()
    runtime.wait(sub)
    with_stalled = time.monotonic() - started
    stalled.close()

    sub = runtime.submit(writer)
    # The reader of our pipe never reads: `ql logs` blocks writing to it, the task must not care.
    blocked = subprocess.Popen(QL + ["logs", sub.run_id, "--follow"], env=ql_env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        started = time.monotonic()
        runtime.wait(sub)
        with_blocked = time.monotonic() - started
    finally:
        blocked.kill()
        blocked.wait()
        assert blocked.stdout is not None
        blocked.stdout.close()
    assert runtime.log_path(sub.run_id).stat().st_size == 320 * 65536
    bound = max(5 * baseline, baseline + 5.0)
    assert with_stalled < bound, (baseline, with_stalled)
    assert with_blocked < bound, (baseline, with_blocked)


def test_ql_logs_follow_ends_the_run_without_a_supervisor(ql_env) -> None:
    """`ql run --detach` exits at once; only `ql logs --follow` is left to notice the end."""
    detached = run_ql(["--json", "run", "--detach", "--", "sh", "-c",
                       "echo first; sleep 1; echo second; exit 4"], ql_env)
    assert detached.returncode == 0, detached.stderr
    import json

    run_id = json.loads(detached.stdout.splitlines()[-1])["run_id"]
    follow = run_ql(["logs", run_id, "--follow"], ql_env, timeout=60)
    assert follow.returncode == 4, follow.stderr  # --follow exits with the run's status
    assert follow.stderr == f"ql: run {run_id} failed (exit 4)\n"
    assert follow.stdout == "first\nsecond\n"
    status = json.loads(run_ql(["--json", "status", run_id], ql_env).stdout)
    assert (status["status"], status["exit_code"]) == ("failed", 4)
    # from an offset, and as JSON chunks with byte offsets
    again = run_ql(["--json", "logs", run_id, "--offset", "6"], ql_env)
    records = [json.loads(line) for line in again.stdout.splitlines()]
    chunks, state = records[:-1], records[-1]  # the last record is the run's state
    assert chunks[0]["offset"] == 6 and "".join(r["data"] for r in chunks) == "second\n"
    assert chunks[-1]["end"] == state["end"] == len("first\nsecond\n") and state["status"] == "failed"


def test_ql_logs_rejects_a_negative_offset_and_an_unknown_run(ql_env) -> None:
    bad = run_ql(["logs", "01a22b46-155c-7d09-872b-21304a383465", "--offset", "-1"], ql_env)
    assert bad.returncode == 2 and "offset" in bad.stderr
    missing = run_ql(["logs", "01a22b46-155c-7d09-872b-21304a383465"], ql_env)
    assert missing.returncode != 0 and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_follow_rejects_a_negative_offset(runtime) -> None:
    from ql_core.follow import follow_log

    with pytest.raises(ValueError):
        next(follow_log(runtime, "01a22b46-155c-7d09-872b-21304a383465", offset=-1))


def test_follow_heartbeat_yields_empty_chunks_while_idle(runtime) -> None:
    from ql_core.follow import follow_log

    sub = runtime.submit(["sh", "-c", "echo a; sleep 1.2; echo b"])
    chunks = list(follow_log(runtime, sub.run_id, follow=True, heartbeat_s=0.3))
    reap(sub)
    assert b"".join(c.data for c in chunks) == b"a\nb\n"
    beats = [c for c in chunks if not c.data]
    # Beats while idle between the lines (offset 2), and on a loaded machine maybe after the last
    # line while the run's end is still being seen (offset 4): never past what was read.
    assert any(c.offset == 2 for c in beats) and all(c.offset in (2, 4) for c in beats), beats


def test_the_follower_survives_the_host_that_started_the_task(data_dir: Path, ql_env) -> None:
    """The launcher's parent is killed mid-run (SIGKILL); a new follower still gets every byte."""
    from ql_core.config import load_config
    from ql_core.follow import follow_log
    from ql_core.runtime import Runtime

    host = subprocess.Popen(QL + ["--json", "run", "--", PY, "-c",
                                  "import sys, time\nfor i in range(30):\n"
                                  "    print('tick %02d' % i, flush=True); time.sleep(0.05)\n"],
                            env=ql_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert host.stdout is not None
    import json

    run_id = json.loads(host.stdout.readline())["run_id"]
    time.sleep(0.3)
    host.kill()
    host.wait()
    host.stdout.close()
    rt = Runtime.open(load_config(data_dir=data_dir, environ={}, cwd=data_dir))
    try:
        data = b"".join(c.data for c in follow_log(rt, run_id, follow=True))
        assert data == b"".join(b"tick %02d\n" % i for i in range(30))
        assert rt.status(run_id).status == "succeeded"
    finally:
        rt.close()


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("Linux /proc needed")
