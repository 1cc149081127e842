"""The cluster-fenced plugin as a plugin: entry point, import cost, selection by profile, settings,
the install hint, and the lifecycle of `ql control` / `ql worker` under signals."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ql_core.config import load_config
from ql_core.errors import ConfigError
from tests.cluster.worker_support import Harness, wait_for

pytestmark = pytest.mark.postgres


def test_the_entry_point_is_declared_and_importing_it_loads_no_driver() -> None:
    from ql_core.plugins import installed_plugins

    assert "cluster-fenced" in {p.name for p in installed_plugins()}
    code = ("import sys, ql_plugins.cluster_fenced.plugin; "
            "print(sorted(m for m in ('psycopg', 'sqlite3', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_psycopg_the_error_names_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from ql_plugins.cluster_fenced.pg_connections import psycopg_module\n"
            "try:\n    psycopg_module()\nexcept Exception as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'ql-runner[cluster]'" in out.stdout


def _config(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "ql.toml"
    path.write_text(body)
    return load_config(config_path=path, environ={}, cwd=tmp_path)


def test_the_factory_chooses_by_profile(tmp_path: Path, cluster_dsn: str) -> None:
    from ql_core.runtime import Runtime
    from ql_plugins.cluster_fenced.pg_store import PostgresJournal
    from ql_plugins.cluster_fenced.worker_store import WorkerJournal

    control = _config(tmp_path, f'profile = "cluster-control"\ndata_dir = "c"\ndatabase_url = "{cluster_dsn}"\n')
    with Runtime.open(control) as rt:
        assert isinstance(rt.journal, PostgresJournal) and rt.executor is None
    (tmp_path / "w").mkdir(mode=0o700)
    worker = _config(tmp_path, f'profile = "cluster-worker"\ndata_dir = "w"\ndatabase_url = "{cluster_dsn}"\n')
    with Runtime.open(worker) as rt:
        assert isinstance(rt.journal, WorkerJournal) and rt.executor is not None
        assert rt.journal.settings.worker_id == rt.node_id  # the default worker id: the node id
    standalone = _config(tmp_path, f'profile = "standalone"\njournal = "cluster-fenced"\ndata_dir = "s"\n'
                                   f'database_url = "{cluster_dsn}"\n')
    with Runtime.open(standalone) as rt:
        assert isinstance(rt.journal, PostgresJournal) and rt.executor is not None


_WORKER = 'profile = "cluster-worker"\ndata_dir = "w"\ndatabase_url = "postgresql+psycopg://u@h/db"\n'


def test_the_cluster_numbers_are_the_plugins_own_and_an_older_configs_limits_still_count(tmp_path: Path) -> None:
    from ql_core.plugins import check_config_plugins
    from ql_plugins.cluster_fenced.settings import profile_of

    config = _config(tmp_path, _WORKER + '[limits]\nrun_lease_s = 20\nclaim_batch = 3\ncancel_grace_s = 2\n'
                                         '[plugin.cluster-fenced]\nrun_lease_s = 40\n')
    check_config_plugins(config, {})  # the plugin claims the [limits] keys it moved
    profile = profile_of(config)
    assert (profile.run_lease_s, profile.claim_batch, profile.session_lease_s) == (40.0, 3, 45.0)  # table wins
    assert profile.cancel_grace_s == 2.0 and profile.busy_timeout_ms == config.profile.busy_timeout_ms  # core's
    assert not hasattr(config.profile, "run_lease_s")  # not a core limit any more
    # A shared config setting a cluster number on an edge node is still accepted (nothing uses it there).
    check_config_plugins(_config(tmp_path, '[limits]\nclaim_batch = 3\n'), {})


def test_every_cluster_number_is_documented_with_its_default_as_the_code_has_it() -> None:
    from ql_plugins.cluster_fenced.settings import NUMBER_RANGES, ClusterProfile

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "cluster.md").read_text() + (root / "docs" / "logs.md").read_text()
    assert [k for k in NUMBER_RANGES if f"`{k}`" not in docs] == []
    defaults = ClusterProfile(base=None).numbers()
    for key, value in defaults.items():  # each default within its own hard range
        _kind, low, high = NUMBER_RANGES[key]
        assert low <= value <= high, key


@pytest.mark.parametrize("body, says", [
    ('[plugin.cluster-fenced]\nrun_lease_s = 0.5\n',
     "[plugin.cluster-fenced] run_lease_s = 0.5 is out of range; allowed 1 to 3600"),
    ('[limits]\nclaim_batch = 65\n', "limits.claim_batch = 65 is out of range; allowed 1 to 64"),
    ('[plugin.cluster-fenced]\nclaim_batch = true\n', "[plugin.cluster-fenced] claim_batch must be an integer"),
    ('[plugin.cluster-fenced]\nrun_lease_s = 4\nfence_margin_s = 2\n', "fence_margin_s (2) must be less than half"),
    ('[limits]\nheartbeat_interval_s = 50\n', "heartbeat_interval_s (50) must be shorter than session_lease_s"),
    ('[limits]\nrun_lease = 4\n', "unknown key limits.run_lease in"),
])
def test_every_command_refuses_a_cluster_number_out_of_range_or_out_of_relation(tmp_path: Path, body: str,
                                                                                says: str) -> None:
    from ql_core.plugins import check_config_plugins

    with pytest.raises(ConfigError) as info:
        check_config_plugins(_config(tmp_path, _WORKER + body), {})
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_sqlite_url_with_the_cluster_journal_is_a_one_line_error(tmp_path: Path) -> None:
    from ql_core.runtime import Runtime

    config = _config(tmp_path, 'profile = "standalone"\njournal = "cluster-fenced"\n')
    with pytest.raises(ConfigError, match="needs database_url") as info:
        Runtime.open(config)
    assert "\n" not in str(info.value)


def test_a_worker_refuses_a_data_dir_others_can_read(tmp_path: Path, cluster_dsn: str) -> None:
    from ql_core.runtime import Runtime

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    d.chmod(0o755)
    config = _config(tmp_path, f'profile = "cluster-worker"\ndata_dir = "w"\ndatabase_url = "{cluster_dsn}"\n')
    with pytest.raises(ConfigError, match="chmod 700"):
        Runtime.open(config)


def test_ql_control_and_an_idle_ql_worker_stop_promptly_on_sigterm_and_sigint(harness: Harness) -> None:
    control = harness.start_control()
    worker = harness.start_worker("a")
    wait_for(lambda: "sweeping" in control.log.read_text() and "slots" in worker.log.read_text(),
             what="both to start", diagnose=harness.logs)
    control.signal(signal.SIGTERM)
    worker.signal(signal.SIGINT)
    assert control.wait(10) == 0 and worker.wait(15) == 0, harness.logs()
    row = harness.sql.execute("SELECT status FROM ql_worker WHERE id = 'a'").fetchone()
    assert row["status"] == "stopped"  # deregistered after its drain


def _catches(pid: int, signum: int) -> bool:
    """Has the process installed a handler for ``signum`` (``SigCgt`` in /proc/PID/status)?"""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


@pytest.mark.parametrize("after_s", [0.0, 0.2, 0.8])
def test_a_worker_sigtermed_in_its_first_moments_stops_cleanly(harness: Harness, after_s: float) -> None:
    """The worker's stop handler is its first instruction: a TERM as soon as the process can catch one
    (the interpreter's own start-up aside), or while it imports, opens its store or registers, stops
    it with exit 0 — never death by the signal (143 / -15)."""
    import time

    worker = harness.start_worker("early")
    wait_for(lambda: _catches(worker.pid, signal.SIGTERM) or not worker.alive(), every=0.001,
             what="the worker to install its SIGTERM handler", diagnose=harness.logs)
    time.sleep(after_s)  # a point in its start-up, not a wait for anything
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, harness.logs()
    row = harness.sql.execute("SELECT status FROM ql_worker WHERE id = 'early'").fetchone()
    assert row is None or row["status"] == "stopped", row  # never registered, or deregistered


def test_the_worker_store_never_forgets_a_run_whose_outbox_is_not_answered(tmp_path: Path) -> None:
    from ql_core.ids import new_id
    from ql_core.ports.journal import EventSpec, HistoryRetention, Transition
    from ql_core.profiles import PROFILES
    from ql_core.testing.journal import new_run
    from ql_plugins.cluster_fenced.outbox import Payload
    from ql_plugins.cluster_fenced.results import LeaseFence
    from ql_plugins.cluster_fenced.settings import ClusterSettings
    from ql_plugins.cluster_fenced.worker_store import WorkerJournal

    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    store = WorkerJournal(d, control_url="postgresql://unused/db", settings=ClusterSettings(worker_id="w"),
                          profile=PROFILES["cluster-worker"])
    try:
        assert isinstance(store, HistoryRetention)
        runs = [new_run(created_at_ms=1_000 + i) for i in range(2)]
        store.leases.insert_claimed([(LeaseFence("w", 1, "s", r.attempt_id, i + 1, new_id()), r.run_id)
                                     for i, r in enumerate(runs)])
        for r in runs:
            store.create(r)
            store.transition(r.attempt_id, lambda snap: (None, Transition(
                attempt={"status": "failed", "exit_code": 3, "finished_at_ms": 2_000},
                run={"status": "failed", "exit_code": 3, "finished_at_ms": 2_000},
                events=(EventSpec("attempt.failed"), EventSpec("run.failed")), terminal=True)))
        # Both ended locally and went to the outbox; one got its final answer.
        assert [store.leases.get(r.attempt_id).state for r in runs] == ["outbox", "outbox"]
        store.leases.mark_answered(runs[0].attempt_id, "applied")
        for r in runs:  # no receipt can exist any more: the journal rows may go
            store.resolve([r.attempt_id])
        found = store.history_candidates(runs[0].runtime_owner, finished_before_ms=10**13, keep_newest=10**6,
                                         limit=10)
        assert list(found) == [runs[0].run_id]
        assert store.outbox_direct(new_id(), Payload("released")) is False  # no row: nothing to send
    finally:
        store.close()
