"""The four deployment profiles and their bounded numbers (DESIGN.md §4, ADR-0007 §5).

A profile is a frozen set of limits. Config files override single numbers;
:data:`LIMIT_RANGES` is the allowed range of each, enforced on load so that no
override can make a scan, a page or a retention window unbounded.
"""

from __future__ import annotations

from typing import Any

from .value_class import value_class

__all__ = ["Profile", "PROFILES", "LIMIT_RANGES", "SHIPPED_LOG_LIMITS", "profile_named"]


@value_class()  # as @dataclass(frozen=True, slots=True), without its import-time code generation
class Profile:
    """Limits and switches of one deployment profile."""

    __slots__ = ('name', 'database', 'runs_tasks', 'default_plugins', 'default_executor', 'default_receipt_store',
                 'default_journal', 'scan_interval_s', 'page_size', 'pages_per_round', 'publish_grace_ms',
                 'terminal_journal_retention_s', 'quarantine_retention_s', 'file_watcher', 'cancel_grace_s',
                 'cancel_lease_s', 'cancel_backoff_cap_s', 'log_max_bytes', 'log_retention_s',
                 'log_total_max_bytes', 'completion_retries', 'busy_timeout_ms', 'stop_drain_s',
                 'history_retention_s', 'history_max_runs', 'retention_budget_ms', 'default_artifact_store',
                 'log_follow_unfinalized_s')

    name: str
    #: Which run database stack the profile accepts: "sqlite" or "postgresql".
    database: str
    #: Does this node run tasks itself (an executor and a receipt store)?
    runs_tasks: bool
    #: Plugins enabled when the config names none.
    default_plugins: tuple[str, ...]
    #: The seams' default selections (config keys executor, receipt_store, journal).
    default_executor: str | None
    default_receipt_store: str | None
    default_journal: str
    #: Seconds between supervisor rounds (0 = no periodic local scan).
    scan_interval_s: float
    page_size: int
    pages_per_round: int
    publish_grace_ms: int
    #: How long a terminal journal row whose receipt is gone is kept.
    terminal_journal_retention_s: float
    #: How long a quarantined receipt is kept before it is purged.
    quarantine_retention_s: float
    #: "never" | "optional": may the watchfiles wake-up be enabled.
    file_watcher: str
    #: Grace between TERM and KILL when a run is cancelled or timed out.
    cancel_grace_s: float
    #: Lease on a cancellation dispatch record.
    cancel_lease_s: float
    #: Cap of the retry backoff of a cancellation dispatch.
    cancel_backoff_cap_s: float
    #: Per-attempt log size past which output is dropped (bytes).
    log_max_bytes: int
    #: Log artifacts older than this are deleted by retention (seconds).
    log_retention_s: float
    #: Total size of all log artifacts past which the oldest are deleted (bytes).
    log_total_max_bytes: int
    #: Compare-and-set conflicts or busy errors retried before giving up.
    completion_retries: int
    #: SQLite busy timeout (milliseconds).
    busy_timeout_ms: int
    #: Time cap of the supervisor's drain on stop().
    stop_drain_s: float
    #: Terminal runs (with their attempts, events and logs) older than this are forgotten (seconds).
    history_retention_s: float
    #: At most this many runs are kept; the oldest terminal ones beyond it are forgotten.
    history_max_runs: int
    #: Time one round may spend on retention (sizing ended logs left unsized by a crash, then
    #: purging history), in pages of ``page_size * pages_per_round`` — a budget of wall-clock time, not a
    #: count of runs. A round that stops at the budget with work left asks for the next round after a
    #: pause as long as the budget (retention may use at most half the time while a backlog drains).
    retention_budget_ms: int
    # -- cluster logs (docs/logs.md "Cluster logs"; the cluster's own numbers are the cluster-fenced
    # plugin's, in [plugin.cluster-fenced]) --
    #: The artifact store workers ship logs to and ``ql logs`` reads from (None: local files only).
    default_artifact_store: str | None
    #: ``ql logs -f`` of a run that ended but whose worker has not finalized its shipped log stops
    #: after this long without new bytes (the worker is gone; it finishes shipping when it returns).
    log_follow_unfinalized_s: float

    def __init__(self, name: str, database: str, runs_tasks: bool, default_plugins: tuple[str, ...],
                 default_executor: str | None, default_receipt_store: str | None, default_journal: str,
                 scan_interval_s: float, page_size: int, pages_per_round: int, publish_grace_ms: int,
                 terminal_journal_retention_s: float, quarantine_retention_s: float, file_watcher: str,
                 cancel_grace_s: float = 10.0, cancel_lease_s: float = 30.0, cancel_backoff_cap_s: float = 60.0,
                 log_max_bytes: int = 64 * 1024 * 1024, log_retention_s: float = 7 * 24 * 3600.0,
                 log_total_max_bytes: int = 1024 * 1024 * 1024, completion_retries: int = 5,
                 busy_timeout_ms: int = 5000, stop_drain_s: float = 5.0,
                 history_retention_s: float = 30 * 24 * 3600.0, history_max_runs: int = 100_000,
                 retention_budget_ms: int = 500, default_artifact_store: str | None = None,
                 log_follow_unfinalized_s: float = 120.0) -> None:
        _set = object.__setattr__
        _set(self, "name", name)
        _set(self, "database", database)
        _set(self, "runs_tasks", runs_tasks)
        _set(self, "default_plugins", default_plugins)
        _set(self, "default_executor", default_executor)
        _set(self, "default_receipt_store", default_receipt_store)
        _set(self, "default_journal", default_journal)
        _set(self, "scan_interval_s", scan_interval_s)
        _set(self, "page_size", page_size)
        _set(self, "pages_per_round", pages_per_round)
        _set(self, "publish_grace_ms", publish_grace_ms)
        _set(self, "terminal_journal_retention_s", terminal_journal_retention_s)
        _set(self, "quarantine_retention_s", quarantine_retention_s)
        _set(self, "file_watcher", file_watcher)
        _set(self, "cancel_grace_s", cancel_grace_s)
        _set(self, "cancel_lease_s", cancel_lease_s)
        _set(self, "cancel_backoff_cap_s", cancel_backoff_cap_s)
        _set(self, "log_max_bytes", log_max_bytes)
        _set(self, "log_retention_s", log_retention_s)
        _set(self, "log_total_max_bytes", log_total_max_bytes)
        _set(self, "completion_retries", completion_retries)
        _set(self, "busy_timeout_ms", busy_timeout_ms)
        _set(self, "stop_drain_s", stop_drain_s)
        _set(self, "history_retention_s", history_retention_s)
        _set(self, "history_max_runs", history_max_runs)
        _set(self, "retention_budget_ms", retention_budget_ms)
        _set(self, "default_artifact_store", default_artifact_store)
        _set(self, "log_follow_unfinalized_s", log_follow_unfinalized_s)

    def with_overrides(self, overrides: dict[str, Any]) -> Profile:
        """Return a copy with validated numeric overrides applied."""
        return Profile(**{**{name: getattr(self, name) for name in Profile.__slots__}, **overrides})

    @classmethod
    def limit_names(cls) -> tuple[str, ...]:
        """Names of the numbers a config file may override."""
        return tuple(name for name in cls.__slots__ if name in LIMIT_RANGES)

    def limits_in_force(self) -> tuple[str, ...]:
        """The limits this profile uses (what ``ql doctor`` shows): those of shipped logs
        (:data:`SHIPPED_LOG_LIMITS`) only on the profiles that have an artifact store."""
        shipped = self.default_artifact_store is not None
        return tuple(n for n in self.limit_names() if shipped or n not in SHIPPED_LOG_LIMITS)


#: name -> (type, minimum, maximum). Every overridable number, with its hard cap.
LIMIT_RANGES: dict[str, tuple[type, float, float]] = {
    "log_follow_unfinalized_s": (float, 0.0, 24 * 3600.0),
    "scan_interval_s": (float, 0.05, 3600.0),
    "page_size": (int, 1, 256),
    "pages_per_round": (int, 1, 64),
    "publish_grace_ms": (int, 0, 10_000),
    "terminal_journal_retention_s": (float, 0.0, 30 * 24 * 3600.0),
    "quarantine_retention_s": (float, 0.0, 30 * 24 * 3600.0),
    "cancel_grace_s": (float, 0.0, 3600.0),
    "cancel_lease_s": (float, 1.0, 3600.0),
    "cancel_backoff_cap_s": (float, 1.0, 3600.0),
    "log_max_bytes": (int, 1024, 1 << 40),
    "log_retention_s": (float, 60.0, 3650 * 24 * 3600.0),
    "log_total_max_bytes": (int, 1 << 20, 1 << 44),
    "completion_retries": (int, 1, 50),
    "busy_timeout_ms": (int, 100, 600_000),
    "stop_drain_s": (float, 0.1, 300.0),
    "history_retention_s": (float, 60.0, 3650 * 24 * 3600.0),
    "history_max_runs": (int, 10, 10_000_000),
    "retention_budget_ms": (int, 10, 60_000),
}

#: The core numbers only the profiles with shipped logs use (``ql logs -f`` of a worker's run).
SHIPPED_LOG_LIMITS = frozenset({"log_follow_unfinalized_s"})

_MIN = 60.0
_H = 3600.0

PROFILES: dict[str, Profile] = {
    "edge": Profile(
        name="edge", database="sqlite", runs_tasks=True,
        default_plugins=("local", "file", "edge-sqlite"),
        default_executor="local", default_receipt_store="file", default_journal="edge-sqlite",
        scan_interval_s=30.0, page_size=8, pages_per_round=2, publish_grace_ms=50,
        terminal_journal_retention_s=2 * _MIN, quarantine_retention_s=5 * _MIN,
        file_watcher="never", history_retention_s=7 * 24 * _H, history_max_runs=10_000,
        retention_budget_ms=250,
    ),
    "standalone": Profile(
        name="standalone", database="sqlite", runs_tasks=True,
        default_plugins=("local", "file", "edge-sqlite"),
        default_executor="local", default_receipt_store="file", default_journal="edge-sqlite",
        scan_interval_s=5.0, page_size=32, pages_per_round=4, publish_grace_ms=100,
        terminal_journal_retention_s=1 * _MIN, quarantine_retention_s=1 * _H,
        file_watcher="optional",
    ),
    "cluster-control": Profile(
        name="cluster-control", database="postgresql", runs_tasks=False,
        default_plugins=("cluster-fenced",),
        default_executor=None, default_receipt_store=None, default_journal="cluster-fenced",
        default_artifact_store="postgres",
        scan_interval_s=5.0, page_size=32, pages_per_round=4, publish_grace_ms=0,
        terminal_journal_retention_s=1 * _MIN, quarantine_retention_s=1 * _H,
        file_watcher="never",
    ),
    "cluster-worker": Profile(
        name="cluster-worker", database="postgresql", runs_tasks=True,
        default_plugins=("local", "file", "cluster-fenced"),
        default_executor="local", default_receipt_store="file", default_journal="cluster-fenced",
        default_artifact_store="postgres",
        scan_interval_s=5.0, page_size=32, pages_per_round=4, publish_grace_ms=100,
        terminal_journal_retention_s=1 * _MIN, quarantine_retention_s=1 * _H,
        file_watcher="optional",
    ),
}


def profile_named(name: str) -> Profile:
    """The built-in profile called ``name``; KeyError lists the valid names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
