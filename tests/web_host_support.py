"""What the tests of examples/web_host.py share: loading the example, serving an app on a free
port with a real uvicorn in its own thread, and parsing its Server-Sent Events."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "web_host.py"


def load_web_host(module_name: str = "ql_example_web_host") -> Any:
    """examples/web_host.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) until the block ends; yields its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="none", timeout_graceful_shutdown=5)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not srv.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive()


def sse_events(response: Any) -> Iterator[dict[str, str]]:
    """Parse an SSE stream into events ({"event", "id", "data"}), skipping comments and retry."""
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "data" in event:
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            event["data"] = event["data"] + "\n" + value if "data" in event else value
        elif field in ("event", "id"):
            event[field] = value
