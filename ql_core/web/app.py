"""The ``ql web`` application (Starlette): read-only pages over one runtime, the log over SSE.

Routes: ``/`` runs (``?status=``, ``?name=``, ``?limit=``), ``/runs/{id}`` a run with its attempts,
events and live log (``?offset=N``), ``/runs/{id}/log`` the SSE stream (``Last-Event-ID`` or
``?offset=N``), ``/workers`` the cluster's workers and queue, ``/login`` the token form (only when a
token is configured), ``/static/run.js``. Every call into the runtime runs in a worker thread.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator
from urllib.parse import parse_qs

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from ql_core.errors import NotFoundError
from ql_core.follow import follow_run_log

from . import pages
from .auth import COOKIE, TokenGate
from .sse import parse_offset, sse_event, utf8_complete_prefix

__all__ = ["create_app", "sse_log_stream", "KEEPALIVE_S", "MAX_LIMIT"]

KEEPALIVE_S = 15.0
MAX_LIMIT = 500
_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
                                       "connect-src 'self'; img-src 'self'; form-action 'self'; "
                                       "frame-ancestors 'none'; base-uri 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def _html(body: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status_code, headers=_HEADERS)


def create_app(runtime: Any, *, token: str | None = None, keepalive_s: float = KEEPALIVE_S) -> Any:
    """The ASGI app over an open ``runtime`` (the caller closes it); with ``token``, every page but
    ``/login`` requires it."""
    rt = runtime
    cluster = getattr(rt.journal, "ops_snapshot", None) is not None

    async def runs(request: Request) -> Response:
        q = request.query_params
        status = q.get("status") or None
        if status is not None and status not in pages.RUN_STATES:
            return _html(pages.layout("bad request", "<p>status must be a run state.</p>", cluster=cluster), 400)
        try:
            limit = min(MAX_LIMIT, max(1, int(q.get("limit") or "50")))
        except ValueError:
            return _html(pages.layout("bad request", "<p>limit must be a number.</p>", cluster=cluster), 400)
        name = (q.get("name") or "")[:200]

        def load() -> list[Any]:
            from ql_core.cli.common import settle_shown

            return settle_shown(rt, rt.list_runs(status=status, limit=limit), limit=rt.profile.page_size)

        views = await anyio.to_thread.run_sync(load)
        if name:
            views = [v for v in views if v.name and name in v.name]
        return _html(pages.runs_page(views, status=status, name=name, limit=limit, cluster=cluster))

    async def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            offset = parse_offset(request.query_params.get("offset"))
        except ValueError:
            return _html(pages.layout("bad request", "<p>offset must be a byte offset.</p>", cluster=cluster), 400)
        try:
            view, events = await anyio.to_thread.run_sync(lambda: (rt.status(run_id), rt.events(run_id)))
        except NotFoundError:
            return _html(pages.layout("not found", "<p>No such run.</p>", cluster=cluster), 404)
        return _html(pages.run_page(view, events, offset=offset, cluster=cluster))

    async def log(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            offset = parse_offset(request.headers.get("last-event-id") or request.query_params.get("offset"))
        except ValueError:
            return PlainTextResponse("Last-Event-ID / offset must be a byte offset", status_code=400)
        try:
            await anyio.to_thread.run_sync(rt.status, run_id)
        except NotFoundError:
            return PlainTextResponse("no such run", status_code=404)
        return StreamingResponse(sse_log_stream(rt, run_id, offset, keepalive_s), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def workers(_request: Request) -> Response:
        snap = None
        if cluster:
            snap = await anyio.to_thread.run_sync(rt.journal.ops_snapshot)
        return _html(pages.workers_page(snap, cluster=cluster))

    async def script(_request: Request) -> Response:
        return Response(pages.RUN_JS, media_type="text/javascript", headers={"Cache-Control": "no-cache",
                                                                             "X-Content-Type-Options": "nosniff"})

    async def login(request: Request) -> Response:
        if token is None:
            return RedirectResponse("/", status_code=303)
        if request.method == "GET":
            return _html(pages.login_page(failed=False))
        body = await request.body()
        given = parse_qs(body[:8192].decode("utf-8", "replace")).get("token", [""])[0].strip()
        gate = TokenGate(lambda *a: None, token)  # type: ignore[arg-type,return-value]
        if not gate.allowed({"authorization": f"Bearer {given}"}):
            return _html(pages.login_page(failed=True), 401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, given, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https" or
                            request.headers.get("x-forwarded-proto") == "https")
        return response

    routes = [Route("/", runs), Route("/runs/{run_id}", run), Route("/runs/{run_id}/log", log),
              Route("/workers", workers), Route("/static/run.js", script),
              Route("/login", login, methods=["GET", "POST"])]
    app: Any = Starlette(routes=routes)
    if token is not None:
        app = TokenGate(app, token)
    return app


async def sse_log_stream(rt: Any, run_id: str, offset: int, keepalive_s: float) -> AsyncIterator[bytes]:
    """The SSE body of a run's log from byte ``offset``: one follower generator, advanced in a worker
    thread one chunk at a time (also what examples/web_host.py streams, so an embedding host need not
    copy it)."""
    follower = follow_run_log(rt, run_id, offset=offset, follow=True, heartbeat_s=keepalive_s)
    pending = b""   # an incomplete UTF-8 tail, not sent yet
    sent = offset   # bytes of the log delivered so far = the id of the last event
    try:
        yield b"retry: 2000\n\n"
        while True:
            # Not cancellable mid-call (anyio waits for the thread), so close() below is always safe.
            chunk = await anyio.to_thread.run_sync(next, follower, None)
            if chunk is None:
                break
            if not chunk.data:
                yield b": keep-alive\n\n"
                continue
            data = pending + chunk.data
            cut = utf8_complete_prefix(data)
            if cut:
                sent += cut
                yield sse_event(id=sent, data=json.dumps({"text": data[:cut].decode("utf-8", "replace")}))
            pending = data[cut:]
        if pending:
            sent += len(pending)
            yield sse_event(id=sent, data=json.dumps({"text": pending.decode("utf-8", "replace")}))
        view = await anyio.to_thread.run_sync(rt.status, run_id)
        yield sse_event(event="end", id=sent, data=json.dumps(
            {"status": view.status, "exit_code": view.exit_code, "reason": view.reason}))
    finally:
        follower.close()  # ends the follower (and its wake-up watch, if any) when the client leaves
