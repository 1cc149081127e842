"""examples/web_host.py against a cluster-control profile: a run submitted over HTTP is queued, a
worker runs it, and its log streams as Server-Sent Events from the shipped chunks (the same follow
API as `ql logs -f`), resumable with Last-Event-ID."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.log_support import assert_shipped_equals_local, writer_command
from tests.cluster.worker_support import Harness
from tests.web_host_support import load_web_host, serve, sse_events

pytestmark = pytest.mark.postgres


def test_the_web_host_streams_a_worker_run_from_the_control_profile(harness: Harness) -> None:
    import httpx

    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    web = load_web_host("ql_example_web_host_cluster")
    harness.start_control()
    harness.start_worker("a")
    rt = Runtime.open(load_config(config_path=harness.control_config(), environ={}, cwd=harness.root))
    try:
        with serve(web.create_app(rt, keepalive_s=0.5)) as base, httpx.Client(base_url=base, timeout=60) as client:
            created = client.post("/runs", json={"argv": writer_command(4000, pause_every=500, pause_s=0.1)})
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            text, last_id, cut = "", "0", None
            with client.stream("GET", f"/runs/{run_id}/log") as response:
                for event in sse_events(response):
                    assert event.get("event") != "end"
                    text += json.loads(event["data"])["text"]
                    last_id = event["id"]
                    if len(text) > 50_000:
                        cut = last_id
                        break  # the browser went away mid-stream
            assert cut is not None and int(cut) == len(text.encode())
            end: dict[str, Any] = {}
            with client.stream("GET", f"/runs/{run_id}/log", headers={"Last-Event-ID": cut}) as response:
                for event in sse_events(response):
                    if event.get("event") == "end":
                        end = json.loads(event["data"])
                        break
                    text += json.loads(event["data"])["text"]
            assert end.get("status") == "succeeded", end
    finally:
        rt.close()
    local = assert_shipped_equals_local(harness, "a", harness.attempts(run_id)[0]["id"])
    assert text.encode() == local
