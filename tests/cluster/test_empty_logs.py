"""A task that printed nothing costs the artifact store no call of its own (revision 0016).

Its empty, final log is recorded as a finalized 0-byte artifact in the transaction of the completion
the worker sends anyway (``ql_artifact_empty_many``); the worker's log shipper makes no open and no
finalize for it. Counted for real: PostgreSQL's own per-function call counts (``track_functions``)
of the worker's backends. Readers see what they saw before: an empty log, finalized, and the run's
exit status at once."""

from __future__ import annotations

import signal
import time

import pytest

from tests.cluster.log_support import assert_shipped_equals_local, wait_finalized, writer_command
from tests.cluster.worker_support import Harness, wait_for

pytestmark = pytest.mark.postgres


def _calls(harness: Harness) -> dict[str, int]:
    harness.sql.execute("SELECT pg_stat_clear_snapshot()")
    rows = harness.sql.execute("SELECT funcname, calls FROM pg_stat_user_functions"
                               " WHERE funcname LIKE 'ql\\_artifact\\_%'").fetchall()
    return {r["funcname"]: int(r["calls"]) for r in rows}


def test_quiet_tasks_make_no_artifact_calls_and_read_back_empty(harness: Harness) -> None:
    db = harness.sql.execute("SELECT current_database() AS d").fetchone()["d"]
    # Counted per function by the server itself, for every backend that connects from now on.
    harness.sql.execute(f'ALTER DATABASE "{db}" SET track_functions = \'pl\'')
    harness.start_worker("a", slots=4)
    # Quick ones, a failing one and a long one (its log is looked at while it runs).
    quiet = [harness.submit(["true"]) for _ in range(6)] + [harness.submit(["sleep", "1.5"]),
                                                          harness.submit(["false"])]
    for run_id in quiet:
        harness.wait_status(run_id)
    for run_id in quiet:
        art = wait_finalized(harness, harness.attempts(run_id)[0]["id"])
        assert (art["committed_bytes"], art["total_bytes"], art["chunk_count"]) == (0, 0, 0)
    wait_for(lambda: all(r["state"] == "final" for r in harness.local_rows("a", "SELECT state FROM ql_log_ship")),
             what="every ship row acknowledged", diagnose=harness.logs)

    # Readers: empty output, the run's status, at once (not log_follow_unfinalized_s).
    for run_id, code in ((quiet[0], 0), (quiet[-1], 1)):
        started = time.monotonic()
        out = harness.ql("logs", "-f", run_id, timeout=60)
        assert (out.returncode, out.stdout) == (code, ""), out.stderr
        assert "not finalized" not in out.stderr
        assert time.monotonic() - started < 30
        out = harness.ql("logs", run_id, timeout=60)
        assert (out.returncode, out.stdout) == (0, ""), out.stderr

    worker = harness.procs[-1]
    worker.signal(signal.SIGTERM)
    worker.wait()
    # A backend's counts reach the statistics when it exits (or goes idle): wait for the one call
    # that must be there, then the ones that must not.
    calls = wait_for(lambda: (lambda c: c if c.get("ql_artifact_empty_many", 0) >= 1 else None)(_calls(harness)),
                     what="the worker's function counts", diagnose=lambda: repr(_calls(harness)))
    assert calls.get("ql_artifact_open", 0) == 0, calls
    assert calls.get("ql_artifact_finalize", 0) == 0, calls
    assert calls.get("ql_artifact_append", 0) == 0, calls


def test_a_task_that_prints_after_a_quiet_start_still_ships(harness: Harness) -> None:
    """Its artifact is opened with its first byte (not at the shipper's first look): every byte
    ships, from byte 0."""
    harness.start_worker("a")
    run_id = harness.submit(["sh", "-c", "sleep 1.5; " + writer_command(2000)[2]])
    harness.wait_status(run_id)
    data = assert_shipped_equals_local(harness, "a", harness.attempts(run_id)[0]["id"])
    assert len(data) == 2000 * 100
