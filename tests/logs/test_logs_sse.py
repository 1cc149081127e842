"""The example web host: runs over HTTP, logs over Server-Sent Events, resumed with Last-Event-ID.

A real uvicorn server on 127.0.0.1 (free port, own thread), a real httpx client, real tasks.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from tests.logs.logs_support import lines_output, lines_script

from tests.web_host_support import load_web_host, serve, sse_events


@pytest.fixture
def server(make_runtime) -> Iterator[str]:
    rt = make_runtime(plugins=("watchfiles",))
    with serve(load_web_host().create_app(rt, keepalive_s=0.5)) as base:
        yield base


def test_sse_stream_resumes_with_last_event_id_without_loss_or_duplication(server: str) -> None:
    import httpx

    n = 120
    with httpx.Client(base_url=server, timeout=30) as client:
        created = client.post("/runs", json={"argv": lines_script(n, 0.01, exit_code=7)})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]

        text = ""
        last_id = None
        # First connection: take a few events, then drop the connection mid-run.
        with client.stream("GET", f"/runs/{run_id}/log") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for event in sse_events(response):
                assert "event" not in event
                text += json.loads(event["data"])["text"]
                assert int(event["id"]) == len(text.encode())  # id = byte offset after the event
                last_id = event["id"]
                if len(text) >= 300:
                    break
        assert last_id is not None
        assert client.get(f"/runs/{run_id}").json()["status"] == "running"

        # Reconnect as a browser does: Last-Event-ID = the last id received.
        end = None
        with client.stream("GET", f"/runs/{run_id}/log", headers={"Last-Event-ID": last_id}) as response:
            for event in sse_events(response):
                if event.get("event") == "end":
                    end = event
                    break
                text += json.loads(event["data"])["text"]
                assert int(event["id"]) == len(text.encode())
        assert text.encode() == lines_output(n)
        assert end is not None and int(end["id"]) == len(lines_output(n))
        assert json.loads(end["data"]) == {"status": "failed", "exit_code": 7, "reason": None}

        # After the end: a reconnect from the final id gets the end event only.
        with client.stream("GET", f"/runs/{run_id}/log", headers={"Last-Event-ID": end["id"]}) as response:
            events = list(sse_events(response))
        assert [e.get("event") for e in events] == ["end"]


def test_sse_keeps_utf8_characters_whole_and_sends_keepalives(server: str) -> None:
    import httpx

    # A 3-byte character split across two writes, with a pause between them.
    code = ("import os, time\nos.write(1, 'é€'.encode()[:3]); time.sleep(1.2)\n"
            "os.write(1, 'é€'.encode()[3:] + b'\\r\\n')\n")
    with httpx.Client(base_url=server, timeout=30) as client:
        run_id = client.post("/runs", json={"argv": ["python3", "-c", code]}).json()["run_id"]
        raw = []
        with client.stream("GET", f"/runs/{run_id}/log") as response:
            for line in response.iter_lines():
                raw.append(line)
                if line.startswith("event: end"):
                    break
    events = [json.loads(line[len("data: "):]) for line in raw if line.startswith("data: ")]
    texts = [e["text"] for e in events if "text" in e]
    assert texts == ["é", "€\r\n"]  # never half a character; \r survives the framing
    assert ": keep-alive" in raw
    ids = [int(line[len("id: "):]) for line in raw if line.startswith("id: ")]
    assert ids[:2] == [2, 7]


def test_bad_requests_are_refused(server: str) -> None:
    import httpx

    with httpx.Client(base_url=server, timeout=30) as client:
        assert client.post("/runs", json={"argv": []}).status_code == 400
        assert client.post("/runs", json={"argv": "ls"}).status_code == 400
        assert client.post("/runs", content=b"{nope").status_code == 400
        missing = "01a22b46-155c-7d09-872b-21304a383465"
        assert client.get(f"/runs/{missing}/log").status_code == 404
        run_id = client.post("/runs", json={"argv": ["true"]}).json()["run_id"]
        assert client.get(f"/runs/{run_id}/log", headers={"Last-Event-ID": "-3"}).status_code == 400
        assert client.get(f"/runs/{run_id}/log", headers={"Last-Event-ID": "x"}).status_code == 400


def test_utf8_prefix_helper() -> None:
    web = load_web_host()
    euro = "€".encode()
    assert web.utf8_complete_prefix(b"ab") == 2
    assert web.utf8_complete_prefix(b"ab" + euro[:1]) == 2
    assert web.utf8_complete_prefix(b"ab" + euro[:2]) == 2
    assert web.utf8_complete_prefix(b"ab" + euro) == 5
    assert web.utf8_complete_prefix(b"\xff") == 1  # invalid byte: sent (as U+FFFD), never held back
