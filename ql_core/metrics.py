"""Prometheus metrics of one ql process: what it did (counters, histograms) and, at scrape time,
what the store holds (queue depth, workers). Optional: ``pip install 'ql-runner[metrics]'``.

Off by default and free when off: this module imports nothing but the standard library until
:func:`enable` is called, and every facade call (:func:`observe_round`, :func:`count`) is one
``None`` check. ``prometheus_client`` is imported by :func:`enable` only.

- ``ql supervise``, ``ql worker`` and ``ql control`` enable it with ``--metrics-listen HOST:PORT``
  (:func:`serve`), which also attaches the runtime they open;
- an embedding host calls ``m = enable()``, ``m.attach(runtime)`` and mounts ``m.asgi_app()`` (or
  reads ``m.registry``, a ``prometheus_client.CollectorRegistry``) in its own app.

Labels are bounded by construction: statuses and answers come from fixed sets, a reason is kept only
when it looks like a code (``[A-Za-z0-9_.-]{1,40}``) and only the first :data:`MAX_REASONS` distinct
ones; everything else is ``other``. No run id, attempt id, name, command or output is ever a label.
The names and their meaning: docs/operations.md.
"""

from __future__ import annotations

import re
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .node import Node
    from .ports import RunEventInfo

__all__ = ["QlMetrics", "enable", "active", "disable", "serve", "parse_listen", "attach_active", "round_scope",
           "observe_round", "count", "MAX_REASONS", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'ql-runner[metrics]'"
#: Distinct ``reason`` label values kept per process; later ones are counted as ``other``.
MAX_REASONS = 32
_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
_REASON_SHAPE = re.compile(r"[A-Za-z0-9_.-]{1,40}")
#: Latencies from milliseconds to minutes (a loaded edge box may take seconds to notice an exit).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, float("inf"))
_WORK_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, float("inf"))
#: Worker counter keys (ql_plugins.cluster_fenced.worker ``_count``) -> the counter's attribute.
_WORKER_KEYS = {"claimed": "claims", "renewed": "renewals", "self_fenced": "self_fenced"}
#: Sweeper round keys (ql_plugins.cluster_fenced.control) that are expired leases, by what became of them.
_EXPIRY_KEYS = ("requeued", "lost", "retried")
_COMPLETION_ANSWERS = frozenset({"applied", "already_completed", "already_terminal", "fenced"})

_lock = threading.Lock()
_active: QlMetrics | None = None
_round = threading.local()


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        from .errors import ConfigError

        raise ConfigError(f"metrics need the prometheus_client package, which is not installed: {INSTALL_HINT}") from None
    return prometheus_client


class QlMetrics:
    """The metrics of this process in their own ``CollectorRegistry`` (never the global default one)."""

    def __init__(self, registry: Any = None) -> None:
        pc = _prometheus()
        self._pc = pc
        self.registry = registry if registry is not None else pc.CollectorRegistry(auto_describe=False)
        r = self.registry
        self.runs_submitted = pc.Counter("ql_runs_submitted", "Runs created by this process", registry=r)
        self.runs_ended = pc.Counter("ql_runs_ended", "Runs that reached a terminal state in a commit of this "
                                     "process", ["status", "reason"], registry=r)
        self.attempts_recovered = pc.Counter("ql_attempts_recovered", "Attempts ended, by the path that ended them "
                                             "(waited, receipt, lost)", ["path"], registry=r)
        self.receipts_quarantined = pc.Counter("ql_receipts_quarantined", "Receipts set aside by a supervisor round",
                                               registry=r)
        self.submit_to_exec = pc.Histogram("ql_submit_to_exec_seconds", "From run creation to its attempt's process "
                                           "start", buckets=_LATENCY_BUCKETS, registry=r)
        self.exit_to_terminal = pc.Histogram("ql_exit_to_terminal_seconds", "From an attempt's process exit to the "
                                             "commit of its terminal state", buckets=_LATENCY_BUCKETS, registry=r)
        self.round_seconds = pc.Histogram("ql_supervisor_round_seconds", "Duration of one supervisor round",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.round_work = pc.Histogram("ql_supervisor_round_work", "Attempts and journal rows one round looked at",
                                       buckets=_WORK_BUCKETS, registry=r)
        self.round_failures = pc.Counter("ql_supervisor_round_failures", "Supervisor rounds that raised", registry=r)
        self.log_bytes = pc.Counter("ql_log_bytes_written", "Bytes of logs of runs that ended in this process",
                                    registry=r)
        self.logs_truncated = pc.Counter("ql_logs_truncated", "Logs cut at log_max_bytes", registry=r)
        # cluster: the worker and the sweeper report through count()
        self.claims = pc.Counter("ql_cluster_claims", "Attempts claimed by this worker", registry=r)
        self.renewals = pc.Counter("ql_cluster_renewals", "Run leases renewed by this worker", registry=r)
        self.self_fenced = pc.Counter("ql_cluster_self_fenced", "Attempts this worker stopped because their lease "
                                      "was gone or might be (own deadline passed, or answered fenced)", registry=r)
        self.completions = pc.Counter("ql_cluster_completions", "Completion submissions answered, by answer",
                                      ["answer"], registry=r)
        self.fenced_completions = pc.Counter("ql_cluster_fenced_completions", "Completions the control plane "
                                             "refused because the lease was no longer this worker's", registry=r)
        self.lease_expiries = pc.Counter("ql_cluster_lease_expiries", "Expired run leases the sweeper ended, by "
                                         "outcome (requeued, lost, retried)", ["outcome"], registry=r)
        self._reasons: set[str] = set()
        self._reasons_lock = threading.Lock()
        self._attached: list[tuple[Any, Any, Any]] = []  # (node, observer, collector)
        self._server: Any = None

    # -- the runtime --------------------------------------------------------------------------------
    def attach(self, runtime: Any) -> None:
        """Observe the committed events of ``runtime`` (a Runtime, or a Node) and export its store's
        gauges at scrape time."""
        from .node import node_of

        node = node_of(runtime)
        observer = _Observer(self, node)
        node.plugins.pm.register(observer, name=f"ql-metrics-{id(observer):x}")
        collector = _StoreCollector(node)
        self.registry.register(collector)
        self._attached.append((node, observer, collector))

    def detach_all(self) -> None:
        for node, observer, collector in self._attached:
            try:
                node.plugins.pm.unregister(observer)
            except ValueError:
                pass
            self.registry.unregister(collector)
        self._attached.clear()

    # -- exposition ---------------------------------------------------------------------------------
    def text(self) -> bytes:
        """The Prometheus text format of everything in :attr:`registry`."""
        return self._pc.generate_latest(self.registry)

    def asgi_app(self) -> Any:
        """An ASGI app serving :attr:`registry` (mount it at ``/metrics`` in a Starlette/FastAPI host)."""
        return self._pc.make_asgi_app(registry=self.registry)

    def listen(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the bound address."""
        server, _thread = self._pc.start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server.server_address[0], server.server_address[1]

    def close(self) -> None:
        self.detach_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- helpers for the facade ------------------------------------------------------------------------
    def reason_label(self, reason: str | None) -> str:
        if not reason:
            return ""
        if not _REASON_SHAPE.fullmatch(reason):
            return "other"
        with self._reasons_lock:
            if reason in self._reasons:
                return reason
            if len(self._reasons) >= MAX_REASONS:
                return "other"
            self._reasons.add(reason)
            return reason


class _Observer:
    """A ``ql_run_event`` observer registered on one node's plugin manager."""

    def __init__(self, metrics: QlMetrics, node: Node) -> None:
        self.m = metrics
        self.node = node

    @hookimpl
    def ql_run_event(self, event: RunEventInfo) -> None:
        m = self.m
        kind, _, what = event.type.partition(".")
        if event.type == "run.created":
            m.runs_submitted.inc()
        elif event.type == "attempt.spawned" and event.attempt_id:
            self._submit_latency(event)
        elif event.type == "log.truncated":
            m.logs_truncated.inc()
        elif kind == "run" and what in _TERMINAL:
            m.runs_ended.labels(status=what, reason=m.reason_label(event.reason)).inc()
            self._log_bytes(event)
        elif kind == "attempt" and what in _TERMINAL and event.attempt_id:
            # Inside a supervisor round the round's report counts receipts and lost attempts;
            # outside one the attempt was ended by whoever waited for it (the host, a reader).
            if not getattr(_round, "inside", False):
                m.attempts_recovered.labels(path="waited").inc()
            self._exit_latency(event)

    def _submit_latency(self, event: RunEventInfo) -> None:
        run = self.node.journal.run(event.run_id)
        attempt = self.node.journal.attempt(event.attempt_id or "")
        if run is not None and attempt is not None and attempt.started_at_ms is not None:
            self.m.submit_to_exec.observe(max(0.0, (attempt.started_at_ms - run.created_at_ms) / 1000))

    def _exit_latency(self, event: RunEventInfo) -> None:
        attempt = self.node.journal.attempt(event.attempt_id or "")
        if attempt is not None and attempt.finished_at_ms is not None:
            self.m.exit_to_terminal.observe(max(0.0, time.time() - attempt.finished_at_ms / 1000))

    def _log_bytes(self, event: RunEventInfo) -> None:
        attempt = self.node.journal.attempt(event.attempt_id or "") if event.attempt_id else None
        if attempt is None:
            return
        facts = self.node.journal.log_facts(attempt.log_artifact_id)
        size = facts.size_bytes if facts is not None else None
        if size is None:
            try:
                from .paths import log_path

                size = log_path(self.node.config.data_dir, attempt.log_artifact_id).stat().st_size
            except Exception:  # noqa: BLE001 - no local log (a cluster run's is elsewhere): nothing to count
                return
        self.m.log_bytes.inc(max(0, int(size)))


class _StoreCollector:
    """Gauges read from the store at scrape time, with bounded indexed queries (cluster stores only)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def describe(self) -> list[Any]:
        return []  # no query at registration time

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        snapshot = _cluster_snapshot(self.node)
        if snapshot is None:
            return
        ok = GaugeMetricFamily("ql_cluster_scrape_ok", "1 when the control database answered this scrape")
        ok.add_metric([], 0 if snapshot.get("error") else 1)
        yield ok
        if snapshot.get("error"):
            return
        depth = GaugeMetricFamily("ql_cluster_queue_depth", "Queued runs (counted up to 100000)")
        depth.add_metric([], snapshot["queue_depth"])
        yield depth
        oldest = GaugeMetricFamily("ql_cluster_oldest_queued_age_seconds", "Age of the oldest queued run (0: none)")
        oldest.add_metric([], snapshot["oldest_queued_age_s"])
        yield oldest
        workers = GaugeMetricFamily("ql_cluster_workers", "Workers by state", labels=["state"])
        for state, n in sorted(snapshot["workers"].items()):
            workers.add_metric([state], n)
        yield workers
        hb = GaugeMetricFamily("ql_cluster_worker_heartbeat_age_max_seconds",
                               "Largest heartbeat age among workers that are not stopped")
        hb.add_metric([], snapshot["max_heartbeat_age_s"])
        yield hb
        lag = GaugeMetricFamily("ql_cluster_shipping_lag_seconds", "Age of the oldest open shipped log not "
                                "updated since (0: none open)")
        lag.add_metric([], snapshot["shipping_lag_s"])
        yield lag


def _cluster_snapshot(node: Node) -> dict[str, Any] | None:
    """Queue, workers and shipping facts from the control database (``ops_snapshot`` of the cluster
    journal backend); None for a store that has none (edge, standalone, a worker's local store)."""
    snapshot = getattr(node.journal, "ops_snapshot", None)
    if snapshot is None:
        return None
    try:
        return dict(snapshot())
    except Exception as exc:  # noqa: BLE001 - a scrape must answer even when the database does not
        return {"error": type(exc).__name__}


# -- the process-wide facade -----------------------------------------------------------------------
def enable(registry: Any = None) -> QlMetrics:
    """The process's metrics (created on first call; imports prometheus_client)."""
    global _active
    with _lock:
        if _active is None:
            _active = QlMetrics(registry)
        return _active


def active() -> QlMetrics | None:
    return _active


def disable() -> None:
    """Forget the process's metrics (tests; an embedding host shutting down)."""
    global _active
    with _lock:
        if _active is not None:
            _active.close()
        _active = None


def parse_listen(value: str, option: str = "--metrics-listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); a usage error names the fix."""
    from .errors import UsageError

    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"{option} wants HOST:PORT (e.g. 127.0.0.1:9464), got {value[:80]!r}")
    return host, int(port_text)


def serve(listen: str | None) -> QlMetrics | None:
    """``--metrics-listen``: None (off) or enable metrics and serve them on ``listen``."""
    if not listen:
        return None
    host, port = parse_listen(listen)
    metrics = enable()
    try:
        bound = metrics.listen(host, port)
    except OSError as exc:
        from .errors import QlError

        raise QlError(f"cannot serve metrics on {listen[:80]}: {exc.strerror or exc}; choose a free port or "
                      f"another --metrics-listen address") from None
    from .log import logger

    logger.info("metrics on http://{}:{}/metrics", bound[0], bound[1])
    return metrics


def attach_active(runtime: Any) -> None:
    """Attach ``runtime`` to the process's metrics when they are on (a no-op otherwise)."""
    if _active is not None:
        _active.attach(runtime)


class _RoundScope:
    __slots__ = ("started",)

    def __enter__(self) -> _RoundScope:
        _round.inside = True
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        _round.inside = False
        if exc[0] is not None and _active is not None:
            _active.round_failures.inc()


def round_scope() -> _RoundScope:
    """Wrap one supervisor round: events inside it are not counted as ``waited``."""
    return _RoundScope()


def observe_round(scope: _RoundScope, report: Any) -> None:
    """A supervisor round ended: its duration, work, receipts applied, lost attempts, quarantines."""
    m = _active
    if m is None:
        return
    m.round_seconds.observe(max(0.0, time.monotonic() - scope.started))
    m.round_work.observe(int(getattr(report, "attempts_touched", 0)) + int(getattr(report, "journal_touched", 0)))
    counts: Mapping[str, int] = getattr(report, "counts", {})
    if counts.get("applied"):
        m.attempts_recovered.labels(path="receipt").inc(counts["applied"])
    if counts.get("lost"):
        m.attempts_recovered.labels(path="lost").inc(counts["lost"])
    if counts.get("quarantined"):
        m.receipts_quarantined.inc(counts["quarantined"])


def count(key: str, n: int = 1) -> None:
    """A cluster worker's or sweeper's count (claims, renewals, completion answers, expired leases)."""
    m = _active
    if m is None or n <= 0:
        return
    if key in _WORKER_KEYS:
        getattr(m, _WORKER_KEYS[key]).inc(n)
    elif key.startswith("answer_") and key[7:] in _COMPLETION_ANSWERS:
        m.completions.labels(answer=key[7:]).inc(n)
        if key == "answer_fenced":
            m.fenced_completions.inc(n)
    elif key in _EXPIRY_KEYS:
        m.lease_expiries.labels(outcome=key).inc(n)
