"""examples/web_host.py against a cluster-control profile: a run submitted over HTTP is queued, a
worker runs it, and its log streams as Server-Sent Events from the shipped chunks (the same follow
API as `ql logs -f`), resumable with Last-Event-ID."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.cluster.log_support import assert_shipped_equals_local, writer_command
from tests.cluster.worker_support import Harness, wait_for

pytestmark = pytest.mark.postgres

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "web_host.py"


def _serve(app: Any) -> tuple[Any, threading.Thread, socket.socket, str]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", ws="none",
                                        timeout_graceful_shutdown=5))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: srv.started, timeout=20, what="uvicorn to start")
    return srv, thread, sock, f"http://127.0.0.1:{port}"


def _events(response: Any) -> Iterator[dict[str, str]]:
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "data" in event:
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key in ("data", "event", "id"):
            event[key] = value


def test_the_web_host_streams_a_worker_run_from_the_control_profile(harness: Harness) -> None:
    import httpx

    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    spec = importlib.util.spec_from_file_location("ql_example_web_host_cluster", EXAMPLE)
    assert spec is not None and spec.loader is not None
    web = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(web)
    harness.start_control()
    harness.start_worker("a")
    rt = Runtime.open(load_config(config_path=harness.control_config(), environ={}, cwd=harness.root))
    srv, thread, sock, base = _serve(web.create_app(rt, keepalive_s=0.5))
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            created = client.post("/runs", json={"argv": writer_command(4000, pause_every=500, pause_s=0.1)})
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            text, last_id, cut = "", "0", None
            with client.stream("GET", f"/runs/{run_id}/log") as response:
                for event in _events(response):
                    assert event.get("event") != "end"
                    text += json.loads(event["data"])["text"]
                    last_id = event["id"]
                    if len(text) > 50_000:
                        cut = last_id
                        break  # the browser went away mid-stream
            assert cut is not None and int(cut) == len(text.encode())
            end: dict[str, Any] = {}
            with client.stream("GET", f"/runs/{run_id}/log", headers={"Last-Event-ID": cut}) as response:
                for event in _events(response):
                    if event.get("event") == "end":
                        end = json.loads(event["data"])
                        break
                    text += json.loads(event["data"])["text"]
            assert end.get("status") == "succeeded", end
    finally:
        srv.should_exit = True
        thread.join(20)
        sock.close()
        rt.close()
    local = assert_shipped_equals_local(harness, "a", harness.attempts(run_id)[0]["id"])
    assert text.encode() == local
