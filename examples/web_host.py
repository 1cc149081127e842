"""A small web host embedding ql: submit runs over HTTP, stream their logs as Server-Sent Events.

    pip install 'ql-runner[watch]' starlette uvicorn
    python examples/web_host.py --data-dir /tmp/ql-web --port 8000
    curl -s -XPOST localhost:8000/runs -d '{"argv": ["sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done"]}'
    curl -N localhost:8000/runs/RUN_ID/log            # or open http://localhost:8000/ in a browser

Endpoints
- ``POST /runs`` with ``{"argv": ["cmd", "arg", ...], "timeout_s": 60, "name": "x"}`` (the last two
  optional) → ``201 {"run_id", "attempt_id", "log"}``.
- ``GET /runs/{run_id}`` → the run's status.
- ``GET /runs/{run_id}/log`` → ``text/event-stream``. Each log event carries ``id: <byte offset after
  it>`` and ``data: {"text": "..."}`` (JSON, so carriage returns and newlines survive SSE framing).
  A reconnecting browser sends the last id back as ``Last-Event-ID`` (``?offset=N`` works too) and the
  stream resumes exactly there: nothing lost, nothing repeated. Events never split a UTF-8 character
  (an incomplete tail waits for the next event, and the id counts only the bytes sent). The stream
  ends with ``event: end`` and ``data: {"status", "exit_code", "reason"}`` once the run is terminal
  and its log drained; a client should then close its EventSource (it would otherwise reconnect and
  get the same ``end`` again). A ``: keep-alive`` comment is sent after 15 s of silence.

On a cluster-control profile (``--config control.toml``) the same endpoints work: ``POST /runs``
queues the run for a worker, and ``/runs/{run_id}/log`` streams the chunks the worker ships to the
artifact store (``ql_core.follow.follow_run_log``), with the same byte offsets as ids. No local
supervisor is started there (the control profile runs no tasks; ``ql control`` sweeps).

What it shows about ql
- The task writes its log file itself: a slow or stalled browser never slows it, and nothing runs
  for a log nobody watches (each stream is one follower generator, driven only while connected).
- Killing this host does not stop the tasks; after a restart the supervisor (plus the ``watchfiles``
  wake-up when configured) settles every run that ended meanwhile, with its real exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from typing import Any, AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# The SSE framing and the log stream are ql_core.web's own (the same ones `ql web` serves): an embedding
# host reuses them rather than copying them. sse_event and utf8_complete_prefix stay importable from here.
from ql_core.config import Config, load_config
from ql_core.errors import NotFoundError, QlError
from ql_core.runtime import Runtime
from ql_core.web.app import sse_log_stream
from ql_core.web.sse import parse_offset, sse_event, utf8_complete_prefix

__all__ = ["create_app", "sse_event", "utf8_complete_prefix", "main"]

KEEPALIVE_S = 15.0
MAX_ARGV = 256


def create_app(runtime: Runtime | None = None, *, config: Config | None = None, supervise: bool = True,
               keepalive_s: float = KEEPALIVE_S) -> Starlette:
    """The app. Pass an open ``runtime`` (you close it), or a ``config`` (the app opens and closes one)."""
    state: dict[str, Any] = {"rt": runtime}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        owned = state["rt"] is None
        if owned:
            chosen = config or load_config(environ=os.environ, cwd=os.getcwd())  # QL_* and ./ql.toml
            state["rt"] = await anyio.to_thread.run_sync(Runtime.open, chosen)
        rt: Runtime = state["rt"]
        supervisor = watch = None
        if supervise and rt.config.profile.runs_tasks:  # a cluster-control node has no local tasks
            supervisor = rt.supervisor()
            watch = rt.start_wakeups(supervisor)  # None unless the "watchfiles" plugin is configured
            supervisor.start()
        try:
            yield
        finally:
            if watch is not None:
                watch.stop()
            if supervisor is not None:
                await anyio.to_thread.run_sync(supervisor.stop)
            if owned:
                rt.close()

    def rt_() -> Runtime:
        return state["rt"]

    async def submit(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        argv = body.get("argv") if isinstance(body, dict) else None
        if (not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV
                or not all(isinstance(a, str) and a for a in argv)):
            return JSONResponse({"error": 'give {"argv": ["cmd", "arg", ...]}: non-empty strings'},
                                status_code=400)
        timeout_s = body.get("timeout_s")
        name = body.get("name")
        rt = rt_()
        try:
            sub = await anyio.to_thread.run_sync(
                lambda: rt.submit(argv, timeout_s=timeout_s, name=name if isinstance(name, str) else None))
        except QlError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400 if exc.exit_code == 2 else 500)
        # The fast path: we are the launcher's parent, so we reap it and complete with its exact status.
        # If this host dies, the task goes on and the supervisor settles it after the restart.
        threading.Thread(target=_wait_quietly, args=(rt, sub), name=f"ql-wait-{sub.run_id[-8:]}",
                         daemon=True).start()
        return JSONResponse({"run_id": sub.run_id, "attempt_id": sub.attempt_id,
                             "log": f"/runs/{sub.run_id}/log"}, status_code=201)

    async def status(request: Request) -> Response:
        try:
            view = await anyio.to_thread.run_sync(rt_().status, request.path_params["run_id"])
        except NotFoundError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return JSONResponse(view.as_dict())

    async def log(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            offset = parse_offset(request.headers.get("last-event-id") or request.query_params.get("offset"))
        except ValueError:
            return JSONResponse({"error": "Last-Event-ID / offset must be a byte offset"}, status_code=400)
        rt = rt_()
        try:
            await anyio.to_thread.run_sync(rt.status, run_id)
        except NotFoundError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return StreamingResponse(sse_log_stream(rt, run_id, offset, keepalive_s), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def index(_request: Request) -> Response:
        return HTMLResponse(_INDEX)

    routes = [Route("/", index), Route("/runs", submit, methods=["POST"]),
              Route("/runs/{run_id}", status), Route("/runs/{run_id}/log", log)]
    return Starlette(routes=routes, lifespan=lifespan)


def _wait_quietly(rt: Runtime, sub: Any) -> None:
    try:
        rt.wait(sub)
    except Exception:  # noqa: BLE001 - the supervisor settles the run instead
        pass


_INDEX = """<!doctype html><meta charset=utf-8><title>ql web host</title>
<form id=f><input id=argv size=60 value='["sh","-c","for i in 1 2 3 4 5; do echo tick $i; sleep 1; done"]'>
<button>run</button></form><pre id=out></pre><script>
const out = document.getElementById('out');
document.getElementById('f').onsubmit = async (e) => {
  e.preventDefault(); out.textContent = '';
  const r = await fetch('/runs', {method: 'POST', body: JSON.stringify({argv: JSON.parse(argv.value)})});
  const run = await r.json();
  const es = new EventSource(run.log);   // reconnects by itself, sending Last-Event-ID
  es.onmessage = (m) => { out.textContent += JSON.parse(m.data).text; };
  es.addEventListener('end', (m) => { out.textContent += '\\n[' + m.data + ']\\n'; es.close(); });
};
</script>"""


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="ql example web host (Starlette + SSE)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--data-dir", help="ql data dir (default: QL_DATA_DIR or the config's)")
    parser.add_argument("--config", help="ql.toml (e.g. with plugins = [\"watchfiles\"])")
    args = parser.parse_args(argv)
    # Like the ql command: options, then QL_* variables, then the file (--config or ./ql.toml).
    config = load_config(config_path=args.config, data_dir=args.data_dir, environ=os.environ, cwd=os.getcwd())
    uvicorn.run(create_app(config=config), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
