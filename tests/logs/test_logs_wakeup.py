"""The watchfiles wake-up plugin: early supervisor rounds and follower wake-ups, never required."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.logs.logs_support import lines_output, lines_script, reap, thread_names, wait_for

from tests.conftest import run_ql


def _terminal_latency_ms(rt, run_id: str) -> int:
    """Commit time of the terminal event minus the finish time the receipt proved."""
    view = rt.status(run_id)
    terminal = [e for e in rt.events(run_id) if e.type == f"run.{view.status}"]
    assert len(terminal) == 1
    return terminal[0].at_ms - view.finished_at_ms


def _detached(ql_env: dict[str, str], config: Path, *argv: str) -> str:
    env = dict(ql_env, QL_CONFIG=str(config))
    out = run_ql(["--json", "run", "--detach", "--", *argv], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])["run_id"]


def _restart_latency(make_runtime, ql_env, tmp_path: Path, *, plugins: tuple[str, ...],
                     interval_s: float) -> tuple[int, int]:
    """A task submitted by a host that is gone ends while a fresh supervisor sleeps out its interval."""
    rt = make_runtime(plugins=plugins)
    run_id = _detached(ql_env, tmp_path / "ql.toml", "sh", "-c", "sleep 2; exit 5")
    supervisor = rt.supervisor(interval_s=interval_s)
    watch = rt.start_wakeups(supervisor)
    assert (watch is not None) == bool(plugins)
    supervisor.start()
    try:
        wait_for(lambda: supervisor.rounds >= 1)
        assert rt.status(run_id).status == "running"  # the first round found it still running
        view = wait_for(lambda: (v := rt.status(run_id)).terminal and v, timeout=interval_s + 20)
        assert (view.status, view.exit_code) == ("failed", 5)
        return _terminal_latency_ms(rt, run_id), supervisor.rounds
    finally:
        if watch is not None:
            assert watch.stop()
        assert supervisor.stop()


def test_with_watchfiles_a_receipt_wakes_a_sleeping_supervisor(make_runtime, ql_env, tmp_path) -> None:
    latency_ms, rounds = _restart_latency(make_runtime, ql_env, tmp_path, plugins=("watchfiles",),
                                          interval_s=60.0)
    # The interval is 60 s: only the wake-up can explain a completion within seconds
    # (typically ~0.1 s; precise numbers in bench/bench_logs.py).
    assert latency_ms < 15_000, latency_ms
    assert rounds <= 4


def test_without_watchfiles_the_periodic_scan_still_completes(make_runtime, ql_env, tmp_path) -> None:
    latency_ms, _rounds = _restart_latency(make_runtime, ql_env, tmp_path, plugins=(), interval_s=2.0)
    assert latency_ms < 2000 + 10_000, latency_ms


def test_the_receipt_watch_is_one_bounded_daemon_thread(make_runtime) -> None:
    rt = make_runtime(plugins=("watchfiles",))
    before = thread_names()
    wakes: list[float] = []

    class Counting:
        def wake(self) -> None:
            wakes.append(time.monotonic())

    watch = rt.start_wakeups(Counting())
    assert watch is not None and watch.alive
    threads = [t for t in threading.enumerate() if t.name not in before and t.name.startswith("ql-")]
    assert [t.name for t in threads] == ["ql-wakeup-receipts"] and threads[0].daemon
    root = rt.config.data_dir / "receipts"
    shard = root / "ab"
    shard.mkdir(mode=0o700, exist_ok=True)
    time.sleep(0.3)  # inotify adds the new directory's watch asynchronously
    # Noise that is not a final receipt: temp files, quarantine, other names -> no wake-up.
    (shard / ".01a22b46-155c-7b64-a128-83841c8689ab.123r00.tmp").write_bytes(b"{}")
    quarantine = root / ".quarantine" / "ab"
    quarantine.mkdir(mode=0o700, parents=True, exist_ok=True)
    time.sleep(0.3)
    (quarantine / "01a22b46-155c-7b64-a128-83841c8689ab.json").write_bytes(b"{}")
    (shard / "notes.txt").write_bytes(b"x")
    (shard / "01a22b46-155c-7b64-a128-83841c8689cd.json").write_bytes(b"{}")  # wrong shard
    time.sleep(0.6)
    assert wakes == []
    # A burst of 100 receipts is debounced into a few wake-ups.
    for i in range(100):
        (shard / f"01a22b46-155c-7b64-a128-83841c86{i:02x}ab.json").write_bytes(b"{}")
    wait_for(lambda: wakes, timeout=5)
    time.sleep(0.6)
    assert 1 <= len(wakes) <= 5, len(wakes)
    assert watch.stop()
    assert not watch.alive and thread_names() <= before


def test_a_failing_callback_does_not_kill_the_watch(make_runtime) -> None:
    rt = make_runtime(plugins=("watchfiles",))
    calls: list[int] = []

    class Exploding:
        def wake(self) -> None:
            calls.append(1)
            raise RuntimeError("boom")

    watch = rt.start_wakeups(Exploding())
    shard = rt.config.data_dir / "receipts" / "cd"
    shard.mkdir(mode=0o700, exist_ok=True)
    time.sleep(0.3)
    (shard / "01a22b46-155c-7b64-a128-83841c8689cd.json").write_bytes(b"{}")
    wait_for(lambda: calls, timeout=5)
    time.sleep(0.2)
    (shard / "01a22b46-155c-7b64-a128-83841c8690cd.json").write_bytes(b"{}")
    wait_for(lambda: len(calls) >= 2, timeout=5)
    assert watch.alive
    assert watch.stop()


def test_edge_refuses_the_watcher_unless_forced(make_runtime, monkeypatch) -> None:
    from ql_core.follow import wakeup_policy

    rt = make_runtime(profile="edge", plugins=("watchfiles",))
    assert "watchfiles" in rt.plugins.loaded
    supervisor = rt.supervisor(interval_s=30)
    assert wakeup_policy(rt) == "refused"
    assert rt.start_wakeups(supervisor) is None
    monkeypatch.setenv("QL_FILE_WATCHER", "force")
    assert wakeup_policy(rt) == "on"
    watch = rt.start_wakeups(supervisor)
    assert watch is not None
    assert watch.stop()
    monkeypatch.setenv("QL_FILE_WATCHER", "off")
    standalone = make_runtime(profile="standalone", plugins=("watchfiles",))
    assert wakeup_policy(standalone) == "off" and standalone.start_wakeups(supervisor) is None


def test_not_configured_means_no_source_at_all(runtime) -> None:
    from ql_core.follow import wakeup_policy

    assert runtime.plugins.wakeup_sources.names() == []
    assert wakeup_policy(runtime) == "none"
    assert runtime.start_wakeups(runtime.supervisor()) is None


def test_missing_watchfiles_is_refused_at_open_and_degrades_to_periodic_scans_later(make_runtime,
                                                                                   monkeypatch) -> None:
    """watchfiles not importable: a runtime that names the plugin is refused at open with the install
    hint (as every command refuses that config); one whose package disappears after it opened keeps
    running with wake-ups off — runs still complete, found by periodic scans."""
    from ql_core.errors import PluginError
    from ql_plugins.watch_wakeup.plugin import WatchfilesSource

    rt = make_runtime(plugins=("watchfiles",))  # opened while the package is there
    for name in [m for m in sys.modules if m == "watchfiles" or m.startswith("watchfiles.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "watchfiles", None)  # `import watchfiles` raises ImportError
    with pytest.raises(PluginError, match=r"pip install 'ql-runner\[watch\]'"):
        WatchfilesSource()
    with pytest.raises(PluginError, match=r"pip install 'ql-runner\[watch\]'"):
        make_runtime(plugins=("watchfiles",))
    supervisor = rt.supervisor(interval_s=0.2)
    assert rt.start_wakeups(supervisor) is None
    from ql_core.follow import follow_log

    sub = rt.submit(lines_script(5, 0.01, exit_code=2))
    assert b"".join(c.data for c in follow_log(rt, sub.run_id, follow=True)) == lines_output(5)
    reap(sub)
    assert rt.status(sub.run_id).exit_code == 2


def test_a_follower_watches_its_log_only_while_it_follows(make_runtime) -> None:
    from ql_core.follow import follow_log

    rt = make_runtime(plugins=("watchfiles",))
    before = thread_names()
    sub = rt.submit(lines_script(20, 0.05))
    during: set[str] = set()
    chunks = []
    for chunk in follow_log(rt, sub.run_id, follow=True):
        chunks.append(chunk)
        during |= thread_names() - before
    reap(sub)
    assert b"".join(c.data for c in chunks) == lines_output(20)
    assert any(name.startswith("ql-follow-") for name in during)
    wait_for(lambda: thread_names() <= before, timeout=5)
    # an abandoned follower closes its watch too. The second line waits for a go-file (not a fixed
    # sleep), so a slow first read can never see both lines at once and end the follower early.
    go = Path(rt.config.data_dir) / "go"
    sub = rt.submit(["sh", "-c", f"echo x; while [ ! -e {go} ]; do sleep 0.02; done; echo y"])
    follower = follow_log(rt, sub.run_id, follow=True)
    assert next(follower).data == b"x\n"
    release = threading.Timer(0.3, go.touch)
    release.start()
    assert next(follower).data == b"y\n"  # waited on the watch for the second line
    release.join()
    assert any(name.startswith("ql-follow-") for name in thread_names())
    follower.close()
    assert thread_names() <= before
    reap(sub)


def test_with_watchfiles_a_follower_ends_soon_after_the_receipt(make_runtime, ql_env, tmp_path) -> None:
    """No supervisor: the follower's own watch sees the receipt and settles the run at once."""
    from ql_core.follow import follow_log

    rt = make_runtime(plugins=("watchfiles",))
    run_id = _detached(ql_env, tmp_path / "ql.toml", "sh", "-c", "echo go; sleep 1; exit 6")
    data = b"".join(c.data for c in follow_log(rt, run_id, follow=True))
    assert data == b"go\n"
    view = rt.status(run_id)
    assert (view.status, view.exit_code) == ("failed", 6)
    assert _terminal_latency_ms(rt, run_id) < 10_000


def test_ql_supervise_uses_the_wakeup_and_stops_cleanly(ql_env, tmp_path, data_dir) -> None:
    import signal
    import subprocess

    from tests.logs.logs_support import write_config

    from tests.conftest import QL

    config = write_config(tmp_path, plugins=("watchfiles",), limits={"scan_interval_s": 60.0})
    env = dict(ql_env, QL_CONFIG=str(config))
    run_id = _detached(ql_env, config, "sh", "-c", "sleep 3; exit 9")
    sup = subprocess.Popen(QL + ["supervise"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        def done() -> bool:
            out = run_ql(["--json", "status", run_id], env)
            return json.loads(out.stdout)["status"] == "failed"

        wait_for(done, timeout=20, interval=0.2)
    finally:
        sup.send_signal(signal.SIGTERM)
        out, err = sup.communicate(timeout=30)
    assert sup.returncode == 0, err
    status = json.loads(run_ql(["--json", "status", run_id], env).stdout)
    assert status["exit_code"] == 9

