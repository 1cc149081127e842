"""ql-nice-executor passes ql's executor contract suite and shows its limits in the task itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    from ql_nice.executor import NiceExecutor, NiceSettings, settings_from
except ImportError:  # pragma: no cover - the example is not installed
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("ql-nice-executor is not installed: pip install -e examples/ql-nice-executor",
                allow_module_level=True)

from ql_core.config import load_config
from ql_core.errors import ConfigError
from ql_core.runtime import Runtime
from ql_core.testing import ExecutorContract


class TestNiceExecutorContract(ExecutorContract):
    @pytest.fixture
    def make_executor(self):
        return lambda: NiceExecutor(NiceSettings(niceness=7))

    @pytest.fixture
    def executor_name(self) -> str:
        return "nice"


def _runtime(tmp_path: Path, table: str = "") -> Runtime:
    toml = tmp_path / "ql.toml"
    toml.write_text('executor = "nice"\n' + table)
    return Runtime.open(load_config(config_path=toml, data_dir=tmp_path / "data", environ={}, cwd=tmp_path))


def test_the_task_runs_at_the_configured_niceness(tmp_path: Path) -> None:
    with _runtime(tmp_path, "[plugin.nice]\nniceness = 13\nmax_open_files = 64\n") as rt:
        sub = rt.submit(["sh", "-c", "nice; ulimit -n"])
        view = rt.wait(sub)
        assert view.status == "succeeded" and view.attempts[0].executor == "nice"
        assert rt.log_path(sub.run_id).read_text().split() == ["13", "64"]


def test_shell_mode_is_limited_as_a_whole(tmp_path: Path) -> None:
    with _runtime(tmp_path) as rt:
        sub = rt.submit(["nice"], shell=True)
        assert rt.wait(sub).status == "succeeded"
        assert rt.log_path(sub.run_id).read_text().strip() == "10"


@pytest.mark.parametrize("table, fragment", [
    ({"niceness": 42}, "niceness must be an integer from 0 to 19"),
    ({"io_class": "fast"}, "io_class must be"),
    ({"speed": 1}, "has no setting 'speed'"),
])
def test_bad_settings_are_one_line_errors(table: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        settings_from(table)


def test_host_sigkill_then_reconcile_recovers_a_nice_run(tmp_path: Path) -> None:
    """A user's `ql run` with executor = "nice" is SIGKILLed; the task finishes; `ql reconcile` ends it."""
    import json
    import signal
    import subprocess
    import sys
    import time

    toml = tmp_path / "ql.toml"
    toml.write_text('executor = "nice"\n')
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update(QL_CONFIG=str(toml), QL_DATA_DIR=str(tmp_path / "data"), HOME=str(tmp_path))
    ql = [sys.executable, "-m", "ql_core.cli.main"]
    host = subprocess.Popen(ql + ["--json", "run", "--", "sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; '
                                  "exit 9"], env=env, stdout=subprocess.PIPE, text=True)
    started = json.loads(host.stdout.readline())  # type: ignore[union-attr]
    host.send_signal(signal.SIGKILL)
    host.wait(30)
    host.stdout.close()  # type: ignore[union-attr]
    go.touch()  # the task outlived its host; now it ends

    deadline = time.monotonic() + 30
    while True:
        subprocess.run(ql + ["reconcile"], env=env, capture_output=True, check=True, timeout=60)
        status = json.loads(subprocess.run(ql + ["--json", "status", started["run_id"]], env=env, check=True,
                                           capture_output=True, text=True, timeout=60).stdout)
        if status["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
    assert (status["status"], status["exit_code"]) == ("failed", 9)
    assert [a["executor"] for a in status["attempts"]] == ["nice"]
