"""Metrics of `ql supervise` and of an embedding host: real processes, real scrapes, real runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.support import free_port, ql, ql_env, sample, scrape, spawn, stop, wait_for


def _run_id(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[0])["run_id"]


def test_supervise_counts_a_failed_run_once_and_its_recovery_path(tmp_path: Path) -> None:
    env = ql_env(tmp_path)
    data = str(tmp_path / "data")
    port = free_port()
    log = tmp_path / "supervise.log"
    sup = spawn(["--data-dir", data, "supervise", "--interval", "0.2", "--metrics-listen", f"127.0.0.1:{port}"],
                env=env, log=log)
    try:
        first = wait_for(lambda: scrape(port), what="the metrics endpoint", diagnose=log.read_text)
        assert sample(first, "ql_runs_ended_total", status="failed") == 0
        # Detached: the submitting process is gone when the task ends, so the supervisor's round
        # ends the run from its receipt — in the process we scrape.
        failed = _run_id(ql(["--data-dir", data, "--json", "run", "--detach", "--name", "hunter2-name", "--",
                             "sh", "-c", "echo secret-output; sleep 0.3; exit 3"], env=env))
        # (The round's own counts are added when the round ends, just after its commits.)
        text = wait_for(lambda: (t := scrape(port)) and sample(t, "ql_runs_ended_total", status="failed")
                        and sum(sample(t, "ql_attempts_recovered_total", path=p) for p in ("waited", "receipt", "lost"))
                        and t, what="the failed counter and the recovery path", diagnose=log.read_text)
        assert sample(text, "ql_runs_ended_total", status="failed") == 1
        assert sample(text, "ql_attempts_recovered_total", path="receipt") == 1
        assert sample(text, "ql_exit_to_terminal_seconds_count") == 1
        assert sample(text, "ql_log_bytes_written_total") == len(b"secret-output\n")
        rounds = sample(text, "ql_supervisor_round_seconds_count")
        # (A round may end between the two series of one scrape: they differ by at most that round.)
        assert rounds >= 1 and abs(sample(text, "ql_supervisor_round_work_count") - rounds) <= 1
        # More rounds, and a run that succeeds: the failed counter stays at exactly one.
        ok = _run_id(ql(["--data-dir", data, "--json", "run", "--detach", "--", "sh", "-c", "exit 0"], env=env))
        later = wait_for(lambda: (t := scrape(port)) and sample(t, "ql_runs_ended_total", status="succeeded")
                         and sample(t, "ql_attempts_recovered_total", path="receipt") >= 2 and sample(t, "ql_supervisor_round_seconds_count") >= rounds + 3 and t,
                         what="the succeeded counter and three more rounds", diagnose=log.read_text)
        assert sample(later, "ql_runs_ended_total", status="failed") == 1
        assert sample(later, "ql_runs_ended_total", status="succeeded") == 1
        assert sample(later, "ql_attempts_recovered_total", path="receipt") == 2
        # Labels never carry ids, names, commands or output.
        for secret in (failed, ok, "hunter2", "secret-output", "sh -c"):
            assert secret not in later
        shown = ql(["--data-dir", data, "--json", "status", failed], env=env)
        assert json.loads(shown.stdout)["status"] == "failed" and json.loads(shown.stdout)["exit_code"] == 3
    finally:
        assert stop(sup) == 0, log.read_text()


def test_nothing_is_served_or_imported_when_the_option_is_off(tmp_path: Path) -> None:
    import psutil

    env = ql_env(tmp_path)
    data = str(tmp_path / "data")
    log = tmp_path / "supervise.log"
    sup = spawn(["--data-dir", data, "supervise", "--interval", "0.2"], env=env, log=log)
    try:
        wait_for(lambda: "supervising" in log.read_text(), what="the supervisor to start", diagnose=log.read_text)
        done = ql(["--data-dir", data, "run", "--", "sh", "-c", "exit 3"], env=env)
        assert done.returncode == 3
        assert [c for c in psutil.Process(sup.pid).net_connections(kind="inet")] == []
    finally:
        assert stop(sup) == 0
    # In process: a runtime, a supervisor round and a run import no metrics library at all.
    script = (
        "import sys\n"
        "from ql_core.config import load_config\n"
        "from ql_core.runtime import Runtime\n"
        f"with Runtime.open(load_config(data_dir={str(tmp_path / 'inproc')!r})) as rt:\n"
        "    rt.wait(rt.submit(['sh', '-c', 'exit 0']))\n"
        "    rt.supervisor().run_round()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('prometheus_client', 'starlette', 'uvicorn'))))\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_embedding_host_mounts_the_registry(tmp_path: Path) -> None:
    import anyio
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from ql_core import metrics
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    m = metrics.enable()
    try:
        with Runtime.open(load_config(data_dir=tmp_path / "data", environ={})) as rt:
            m.attach(rt)
            view = rt.wait(rt.submit(["sh", "-c", "exit 7"]))
            assert view.status == "failed"
            rt.wait(rt.submit(["sh", "-c", "exit 0"]))
            app = Starlette(routes=[Mount("/metrics", app=m.asgi_app())])

            async def get() -> str:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://host") as c:
                    return (await c.get("/metrics/")).text

            text = anyio.run(get)
        assert sample(text, "ql_runs_submitted_total") == 2
        assert sample(text, "ql_runs_ended_total", status="failed") == 1
        assert sample(text, "ql_runs_ended_total", status="succeeded") == 1
        assert sample(text, "ql_attempts_recovered_total", path="waited") == 2
        assert sample(text, "ql_submit_to_exec_seconds_count") == 2
    finally:
        metrics.disable()
    assert metrics.active() is None


def test_reason_labels_are_bounded() -> None:
    from ql_core import metrics

    m = metrics.enable()
    try:
        assert m.reason_label("LEASE_EXPIRED") == "LEASE_EXPIRED"
        assert m.reason_label("a reason with spaces and $ecrets") == "other"
        assert m.reason_label("") == ""
        kept = [m.reason_label(f"R{i}") for i in range(metrics.MAX_REASONS + 5)]
        assert kept.count("other") >= 5
    finally:
        metrics.disable()


@pytest.mark.parametrize("bad", ["9464", "host:", ":80", "h:99999", "h:x"])
def test_a_bad_listen_address_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    done = ql(["--data-dir", str(tmp_path / "d"), "supervise", "--metrics-listen", bad], env=ql_env(tmp_path))
    assert done.returncode == 2 and "HOST:PORT" in done.stderr and "Traceback" not in done.stderr
