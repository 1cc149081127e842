"""The HTML of ``ql web``: server-rendered, escaped, no JS build step (one small script, served from
``/static/run.js`` so the Content-Security-Policy can forbid inline scripts).

Shows only what ``ql status`` / ``ql list`` / ``ql events`` already print (ids, name, states, exit
codes, reasons, times) plus the log, which ``ql logs`` prints; never a command, argv, environment,
token or handle — the records these pages get carry none.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any, Iterable, Mapping
from urllib.parse import quote, urlencode

__all__ = ["layout", "runs_page", "run_page", "workers_page", "login_page", "RUN_JS", "RUN_STATES"]

RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost")

_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
th{background:#f3f3f3}nav a{margin-right:1em}pre{background:#111;color:#ddd;padding:.6em;max-height:60vh;
overflow:auto;white-space:pre-wrap}.succeeded{color:#1a7f37}.failed,.lost,.timed_out{color:#cf222e}
.cancelled{color:#9a6700}.running,.queued{color:#0969da}form{margin:.5em 0}small{color:#666}"""


def _t(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _cell(value: Any) -> str:
    return f"<td>{escape('' if value is None else str(value))}</td>"


def layout(title: str, body: str, *, cluster: bool) -> str:
    nav = '<nav><a href="/">runs</a>' + ('<a href="/workers">workers and queue</a>' if cluster else "") + "</nav>"
    return (f"<!doctype html><html lang=en><meta charset=utf-8><meta name=viewport content='width=device-width'>"
            f"<title>{escape(title)} · ql</title><style>{_CSS}</style>{nav}<h1>{escape(title)}</h1>{body}</html>")


def runs_page(views: Iterable[Any], *, status: str | None, name: str, limit: int, cluster: bool) -> str:
    options = "".join(f"<option{' selected' if s == status else ''}>{s}</option>" for s in RUN_STATES)
    form = (f"<form method=get><label>status <select name=status><option value=''>any</option>{options}"
            f"</select></label> <label>name contains <input name=name value='{escape(name, quote=True)}'></label> "
            f"<label>limit <input name=limit size=4 value={limit}></label> <button>filter</button></form>")
    rows = []
    for v in views:
        link = f"/runs/{quote(v.run_id, safe='')}"
        rows.append(f"<tr><td><a href='{escape(link, quote=True)}'>{escape(v.run_id)}</a></td>"
                    f"<td class={escape(v.status)}>{escape(v.status)}</td>{_cell(v.exit_code)}{_cell(v.reason)}"
                    f"{_cell(v.name)}{_cell(_t(v.created_at_ms))}{_cell(_t(v.finished_at_ms))}</tr>")
    table = ("<table id=runs><tr><th>run</th><th>status</th><th>exit</th><th>reason</th><th>name</th>"
             "<th>created</th><th>finished</th></tr>" + "".join(rows) + "</table>") if rows else "<p>No runs.</p>"
    return layout("runs", form + table + "<p><small>Newest first. The name filter applies to the runs "
                  "fetched (at most the limit).</small></p>", cluster=cluster)


def run_page(view: Any, events: Iterable[Any], *, offset: int, cluster: bool) -> str:
    head = (f"<table><tr><th>status</th><td class={escape(view.status)} id=status>{escape(view.status)}</td></tr>"
            f"<tr><th>exit code</th>{_cell(view.exit_code)}</tr><tr><th>reason</th>{_cell(view.reason)}</tr>"
            f"<tr><th>name</th>{_cell(view.name)}</tr><tr><th>created</th>{_cell(_t(view.created_at_ms))}</tr>"
            f"<tr><th>finished</th>{_cell(_t(view.finished_at_ms))}</tr>"
            f"<tr><th>deadline</th>{_cell(_t(view.deadline_at_ms))}</tr>"
            f"<tr><th>cancel</th>{_cell(view.cancel_reason)}</tr></table>")
    attempts = "".join(
        f"<tr>{_cell(a.attempt_no)}{_cell(a.attempt_id)}<td class={escape(a.status)}>{escape(a.status)}</td>"
        f"{_cell(a.exit_code)}{_cell(a.reason)}{_cell(a.executor)}{_cell(_t(a.started_at_ms))}"
        f"{_cell(_t(a.finished_at_ms))}</tr>" for a in view.attempts)
    attempts_table = ("<h2>attempts</h2><table id=attempts><tr><th>#</th><th>attempt</th><th>status</th>"
                      "<th>exit</th><th>reason</th><th>executor</th><th>started</th><th>finished</th></tr>"
                      + attempts + "</table>")
    event_rows = "".join(
        f"<tr>{_cell(e.seq)}{_cell(e.type)}{_cell(e.status)}{_cell(e.exit_code)}{_cell(e.reason)}"
        f"{_cell(_t(e.at_ms))}</tr>" for e in events)
    events_table = ("<h2>events</h2><table id=events><tr><th>seq</th><th>type</th><th>status</th><th>exit</th>"
                    "<th>reason</th><th>at</th></tr>" + event_rows + "</table>")
    src = f"/runs/{quote(view.run_id, safe='')}/log?{urlencode({'offset': offset})}"
    log = (f"<h2>log <small id=logstate>connecting…</small></h2>"
           f"<p><small>From byte {offset} (add <code>?offset=N</code> to start elsewhere); live while the run "
           f"goes on.</small></p><pre id=log data-src='{escape(src, quote=True)}'></pre>"
           f"<script src=/static/run.js></script>")
    return layout(f"run {view.run_id}", head + attempts_table + events_table + log, cluster=cluster)


def workers_page(snap: Mapping[str, Any] | None, *, cluster: bool) -> str:
    if snap is None:
        return layout("workers and queue", "<p>This profile has no cluster control database: no workers or "
                      "queue to show.</p>", cluster=cluster)
    queue = (f"<table id=queue><tr><th>queued runs</th>{_cell(snap['queue_depth'])}</tr>"
             f"<tr><th>oldest queued (s)</th>{_cell(snap['oldest_queued_age_s'])}</tr>"
             f"<tr><th>ended runs with logs still shipping</th>{_cell(snap['unshipped_ended_logs'])}</tr>"
             f"<tr><th>shipping lag (s)</th>{_cell(snap['shipping_lag_s'])}</tr></table>")
    rows = "".join(
        f"<tr>{_cell(w['worker_id'])}{_cell(w['generation'])}<td class={escape(w['state'])}>{escape(w['state'])}</td>"
        f"{_cell(w['slots'])}{_cell(w['held'])}{_cell(w['held_by_older_generations'])}{_cell(w['heartbeat_age_s'])}"
        f"{_cell(w['lease_expires_in_s'])}</tr>" for w in snap["worker_rows"])
    workers = ("<h2>workers</h2><table id=workers><tr><th>worker</th><th>generation</th><th>state</th><th>slots</th>"
               "<th>held</th><th>held by older generations</th><th>heartbeat age (s)</th>"
               "<th>session lease left (s)</th></tr>" + rows + "</table>") if rows else "<p>No workers registered.</p>"
    return layout("workers and queue", "<h2>queue</h2>" + queue + workers, cluster=cluster)


def login_page(*, failed: bool) -> str:
    note = "<p class=failed>Wrong token.</p>" if failed else ""
    return layout("log in", note + "<form method=post action=/login><label>token <input type=password name=token "
                  "autocomplete=off></label> <button>log in</button></form>", cluster=False)


#: The run page's script: append the SSE log stream; stop at its ``end`` event.
RUN_JS = """(function(){
var pre=document.getElementById('log'),state=document.getElementById('logstate');
if(!pre)return;var es=new EventSource(pre.dataset.src);
es.onopen=function(){state.textContent='live';};
es.onmessage=function(m){var d=JSON.parse(m.data);var stick=pre.scrollTop+pre.clientHeight>=pre.scrollHeight-4;
pre.appendChild(document.createTextNode(d.text));if(stick)pre.scrollTop=pre.scrollHeight;};
es.addEventListener('end',function(m){var d=JSON.parse(m.data);state.textContent='ended: '+d.status+
(d.exit_code===null?'':' (exit '+d.exit_code+')');document.getElementById('status').textContent=d.status;es.close();});
es.onerror=function(){state.textContent='reconnecting…';};
})();
"""
