"""What a cluster's operator sees: `ql worker` / `ql control` metrics scraped while a task runs,
is fenced and expires; `ql workers`; the web page of workers and queue. Real PostgreSQL, real
processes, real SIGSTOP/SIGCONT."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.cluster.worker_support import Harness
from tests.ops.support import free_port, sample, scrape, wait_for

pytestmark = pytest.mark.postgres

#: Leases for a worker that must hold its attempt through a loaded machine's stalls.
_ROOMY = {"run_lease_s": 15.0, "fence_margin_s": 3.0, "session_lease_s": 10.0, "control_call_timeout_s": 3.0}

#: Sleeps a minute: it is still running when the worker is stopped and fenced.
SLOW = ["sh", "-c", "echo started; sleep 60; exit 0"]


def _worker_with_metrics(h: Harness, name: str, port: int):  # type: ignore[no-untyped-def]
    d = h.worker_dir(name)
    # Roomy leases: the first renewal must not be missed on a loaded machine (a self-fence there
    # would make this a different test); the SIGSTOP below still outlasts them.
    config = h.write_config(h.root / f"{name}.toml", profile="cluster-worker", data_dir=d, limits=_ROOMY,
                            plugin={"worker_id": name, "slots": 2, "drain": "finish", "drain_timeout_s": 10.0})
    return h._spawn(name, ["worker", "--metrics-listen", f"127.0.0.1:{port}"], config, data_dir=d)


def _workers(h: Harness) -> tuple[list[dict], dict]:
    done = h.ql("--json", "workers")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return [r for r in rows if r["type"] == "worker"], next(r for r in rows if r["type"] == "queue")


def test_metrics_workers_and_queue_through_a_fenced_completion(harness: Harness) -> None:
    h = harness
    cport, wport = free_port(), free_port()
    h._spawn("control", ["control", "--metrics-listen", f"127.0.0.1:{cport}"], h.control_config())
    wait_for(lambda: scrape(cport), what="the control's metrics", diagnose=h.logs)

    # Queued before any worker exists: the queue gauges see it.
    run_id = h.submit(SLOW)
    text = wait_for(lambda: (t := scrape(cport)) and sample(t, "ql_cluster_queue_depth") == 1 and t,
                    what="queue depth 1", diagnose=h.logs)
    assert sample(text, "ql_cluster_scrape_ok") == 1
    assert sample(text, "ql_cluster_workers", state="alive") == 0
    workers, queue = _workers(h)
    assert workers == [] and queue["queue_depth"] == 1 and queue["oldest_queued_age_s"] >= 0

    a = _worker_with_metrics(h, "a", wport)
    first = h.wait_attempt(run_id, ("running",))
    wtext = wait_for(lambda: (t := scrape(wport)) and sample(t, "ql_cluster_renewals_total") >= 1 and t,
                     what="a renewal", diagnose=h.logs)
    assert sample(wtext, "ql_cluster_claims_total") == 1
    assert sample(wtext, "ql_cluster_fenced_completions_total") == 0
    text = wait_for(lambda: (t := scrape(cport)) and sample(t, "ql_cluster_queue_depth") == 0
                    and sample(t, "ql_cluster_workers", state="alive") == 1 and t, what="one alive worker")
    assert sample(text, "ql_cluster_oldest_queued_age_seconds") == 0
    (row,), queue = _workers(h)
    assert (row["worker_id"], row["state"], row["held"], row["slots"]) == ("a", "alive", 1, 2)
    assert row["generation"] >= 1 and 0 <= row["heartbeat_age_s"] < 30 and queue["queue_depth"] == 0

    # Stopped past its lease: the sweeper expires it (lost), the worker's late completion is fenced.
    a.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: h.attempts(run_id)[0]["status"] == "lost", what="the sweeper to end the attempt")
        text = wait_for(lambda: (t := scrape(cport)) and sample(t, "ql_cluster_lease_expiries_total",
                                                                 outcome="lost") == 1 and t,
                        what="the lease expiry counted", diagnose=h.logs)
        assert sample(text, "ql_cluster_workers", state="alive") + sample(text, "ql_cluster_workers",
                                                                          state="expired") == 1
        assert sample(text, "ql_cluster_worker_heartbeat_age_max_seconds") >= 0
    finally:
        a.signal(signal.SIGCONT)
    wait_for(lambda: any(r["answer"] == "fenced" for r in h.lease_rows("a")), what="the fenced answer",
             diagnose=h.logs)
    wtext = wait_for(lambda: (t := scrape(wport)) and sample(t, "ql_cluster_fenced_completions_total") and t,
                     what="the fenced counter", diagnose=h.logs)
    assert sample(wtext, "ql_cluster_fenced_completions_total") == 1
    assert sample(wtext, "ql_cluster_completions_total", answer="fenced") == 1
    assert sample(wtext, "ql_cluster_self_fenced_total") == 1
    assert h.status(run_id) == "lost" and first["id"] not in wtext and run_id not in wtext

    # The web page of workers and queue, over the control runtime.
    import anyio
    import httpx

    from ql_core.web import create_app

    app = create_app(h.control)

    async def get(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            return await c.get(path)

    page = anyio.run(get, "/workers")
    assert page.status_code == 200 and "<table id=workers>" in page.text and ">a</td>" in page.text
    runs = anyio.run(get, "/")
    assert run_id in runs.text and "workers and queue" in runs.text
    assert "sleep 60" not in anyio.run(get, f"/runs/{run_id}").text


def test_workers_on_an_edge_profile_names_the_fix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.ops.support import ql, ql_env

    env = ql_env(tmp_path)
    data = str(tmp_path / "d")
    assert ql(["--data-dir", data, "run", "--", "sh", "-c", "exit 0"], env=env).returncode == 0
    done = ql(["--data-dir", data, "workers"], env=env)
    assert done.returncode == 2 and "cluster-control" in done.stderr


def test_ql_web_on_the_control_profile_in_a_real_browser(harness: Harness, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The workers-and-queue page and a cluster run's shipped log, from a real `ql web` process."""
    from tests.ops.browser import Browser
    from tests.ops.support import ql_env, stop
    from tests.ops.test_web import _require_chromium, _start_web

    binary = _require_chromium()
    h = harness
    control = h.start_control()
    worker = h.start_worker("a")
    run_id = h.submit(["sh", "-c", "echo started; echo still going; sleep 60"])
    h.wait_attempt(run_id, ("running",))
    # Without --metrics-listen neither role listens on any port.
    import psutil

    for proc in (control, worker):
        assert [c for c in psutil.Process(proc.pid).net_connections(kind="inet") if c.status == "LISTEN"] == []
    env = ql_env(h.root, QL_CONFIG=str(h.control_config()))
    web, url = _start_web([], env, tmp_path / "web.log")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    browser = Browser(binary, profile)
    try:
        browser.goto(f"{url}workers")
        workers = browser.evaluate("document.getElementById('workers').innerText")
        assert "a\t" in workers and "alive" in workers
        assert browser.evaluate("document.getElementById('queue').innerText").startswith("queued runs\t0")
        browser.screenshot(tmp_path / "workers.png")
        browser.goto(url)
        assert run_id in browser.evaluate("document.getElementById('runs').innerText")
        browser.goto(f"{url}runs/{run_id}")
        wait_for(lambda: "still going\n" in (browser.evaluate("document.getElementById('log').textContent") or ""),
                 what="the shipped log in the page", timeout=60)
        assert "sleep 60" not in browser.evaluate("document.documentElement.outerHTML")
        browser.screenshot(tmp_path / "cluster-run.png")
    finally:
        browser.close()
        assert stop(web) == 0
    assert (tmp_path / "workers.png").read_bytes()[:4] == b"\x89PNG"


def test_a_worker_that_got_sigterm_shows_draining_until_it_stops(harness: Harness) -> None:
    """SIGTERM with a task still running: `ql workers --json`, the workers gauge and the workers page
    say `draining` for as long as the drain lasts; then `stopped`, and the task ended `succeeded`."""
    from tests.cluster.worker_support import trigger_command

    h = harness
    cport = free_port()
    h._spawn("control", ["control", "--metrics-listen", f"127.0.0.1:{cport}"], h.control_config())
    trigger = h.root / "finish-now"
    # drain = "finish" with a long drain timeout: the drain lasts exactly as long as the task does.
    # Leases roomier than the harness's few seconds: this test is about what operators see, and a
    # loaded machine must not turn it into a self-fence test.
    worker = h.start_worker("d", drain="finish", drain_timeout_s=120.0, limits=_ROOMY)
    run_id = h.submit(trigger_command(trigger, 0, max_s=240))
    h.wait_attempt(run_id, ("running",))
    (row,), _queue = _workers(h)
    assert (row["worker_id"], row["state"], row["held"]) == ("d", "alive", 1)

    worker.signal(signal.SIGTERM)
    row = wait_for(lambda: (rows := _workers(h)[0]) and rows[0]["state"] == "draining" and rows[0],
                   what="`ql workers` to show the worker draining", diagnose=h.logs)
    assert row["held"] == 1 and row["lease_expires_in_s"] > 0
    text = wait_for(lambda: (t := scrape(cport)) and sample(t, "ql_cluster_workers", state="draining") == 1 and t,
                    what="the workers gauge to count it draining", diagnose=h.logs)
    assert sample(text, "ql_cluster_workers", state="alive") == 0

    import anyio
    import httpx

    from ql_core.web import create_app

    app = create_app(h.control)

    async def get(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            return await c.get(path)

    page = anyio.run(get, "/workers")
    assert page.status_code == 200 and "<td class=draining>draining</td>" in page.text

    # It keeps heartbeating while it drains: still draining (its session lease live) longer than one
    # whole session lease after SIGTERM, for as long as its task runs.
    first_registered = row["registered_at_ms"]
    since = time.monotonic()
    while time.monotonic() - since < _ROOMY["session_lease_s"] * 1.5:
        time.sleep(2.0)
        (row,), _queue = _workers(h)
        assert worker.alive() and row["state"] == "draining" and row["held"] == 1, h.logs()
        assert row["lease_expires_in_s"] > 0
    assert row["registered_at_ms"] == first_registered

    trigger.touch()
    assert worker.wait(120) == 0, h.logs()
    (row,), _queue = _workers(h)
    assert (row["state"], row["held"]) == ("stopped", 0)
    assert h.wait_status(run_id)["status"] == "succeeded"
    assert "could not mark this worker draining" not in worker.log.read_text(errors="replace")
