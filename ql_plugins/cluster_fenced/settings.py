"""``[plugin.cluster-fenced]``: the plugin's own settings, validated with one-line ConfigErrors.

```toml
[plugin.cluster-fenced]
worker_id = "build-03"     # default: this node's id (the data dir's node_id)
slots = 4                  # attempts this worker runs at once
drain = "finish"           # on SIGTERM: "finish" running attempts, or "hand_back" (stop them, lost)
drain_timeout_s = 60       # finish at most this long, then hand back what still runs
spec_key_file = "/etc/ql/spec.key"            # seals (control) / opens (worker) task specs; required
                                              # to submit or to run cluster runs (docs/cluster.md)
spec_previous_key_file = "/etc/ql/spec.key.old"  # opens only, during a key rotation
run_lease_s = 30           # the cluster's numbers (NUMBER_RANGES): leases, heartbeats, claims,
fence_margin_s = 5         # sweeps, log shipping; each within its hard range
```

The cluster's numbers live here, not in the core profile: :class:`ClusterProfile` is what the
plugin's parts read as ``profile`` — the node's core :class:`~ql_core.profiles.Profile` plus these
numbers, each with a hard range (:data:`NUMBER_RANGES`) and their relations checked
(:func:`check_profile`). An older config's ``[limits]`` may still hold them (the plugin claims those
keys through ``ql_limit_names``); the same key in ``[plugin.cluster-fenced]`` wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ql_core.errors import ConfigError, unknown_setting

__all__ = ["ClusterSettings", "ClusterProfile", "parse_settings", "cluster_profile", "profile_of", "check_profile",
           "NUMBER_RANGES", "WORKER_ID_PATTERN", "DRAIN_MODES", "PLUGIN_NAME"]

PLUGIN_NAME = "cluster-fenced"
#: What the control database accepts as a worker id.
WORKER_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
DRAIN_MODES = ("finish", "hand_back")
_SETTING_KEYS = ("worker_id", "slots", "drain", "drain_timeout_s", "spec_key_file", "spec_previous_key_file")

#: name -> (type, minimum, maximum): every cluster number, with its hard cap. The database enforces
#: 1 s..1 h for both leases and 64 for the claim batch (8 before revision 0015) and the sweep page.
NUMBER_RANGES: dict[str, tuple[type, float, float]] = {
    "heartbeat_interval_s": (float, 0.1, 600.0),
    "session_lease_s": (float, 1.0, 3600.0),
    "run_lease_s": (float, 1.0, 3600.0),
    "fence_margin_s": (float, 0.05, 600.0),
    "claim_batch": (int, 1, 64),
    "claim_interval_s": (float, 0.01, 60.0),
    "claim_ahead": (int, 0, 64),
    "claim_ahead_wait_s": (float, 0.01, 60.0),
    "sweep_page": (int, 1, 64),
    "sweep_pages_per_round": (int, 1, 64),
    "sweep_interval_s": (float, 0.05, 600.0),
    "lease_retention_s": (float, 0.0, 30 * 24 * 3600.0),
    "control_call_timeout_s": (float, 0.2, 300.0),
    "outbox_backoff_cap_s": (float, 0.1, 3600.0),
    "ship_interval_s": (float, 0.05, 60.0),
    "ship_batch_bytes": (int, 4096, 1024 * 1024),
    "shipped_log_keep_s": (float, 0.0, 3650 * 24 * 3600.0),
    "artifact_sweep_page": (int, 1, 4096),
}
_KEYS = _SETTING_KEYS + tuple(NUMBER_RANGES)


@dataclass(frozen=True, slots=True)
class ClusterProfile:
    """The node's core profile plus the cluster's numbers: what the plugin's parts read as ``profile``.

    A core limit (``cancel_grace_s``, ``busy_timeout_ms``, ``log_max_bytes``, …) is read through
    from :attr:`base`; the cluster numbers are this plugin's own. The defaults are the same on both
    cluster profiles (and on a standalone node whose journal is ``cluster-fenced``).
    """

    #: The node's core profile (ql_core.profiles.Profile).
    base: Any
    #: Seconds between a worker's heartbeats (renewals of its session lease).
    heartbeat_interval_s: float = 10.0
    #: The worker session lease: a worker not heard of for this long may not claim.
    session_lease_s: float = 45.0
    #: The run lease of one attempt (the only authority to run it), renewed at half life.
    run_lease_s: float = 30.0
    #: A worker fences itself this long before its own estimate of its run lease's expiry.
    fence_margin_s: float = 5.0
    #: Runs claimed per call at most (never more than free slots; the database hands out at most 64,
    #: 8 before revision 0015). Each call has a fixed cost on the server (~0.27 ms of its CPU,
    #: docs/cluster.md): a worker with many free slots fills them in one call.
    claim_batch: int = 32
    #: Seconds between a worker's claims while the queue is empty.
    claim_interval_s: float = 1.0
    #: Runs a worker claims (and starts) beyond its free slots while its tasks are short, so a slot
    #: that frees takes its next run at once instead of after a claim's and a start's round trips
    #: (0: claim for free slots only). Docs/cluster.md, "Claiming ahead".
    claim_ahead: int = 4
    #: A run claimed ahead that found no free slot within this long goes back to the queue (no retry
    #: used), and the worker claims ahead again only after a task that ran shorter than this.
    claim_ahead_wait_s: float = 1.0
    #: Rows per step of one sweeper call (``ql control``; the database caps it at 64).
    sweep_page: int = 16
    #: Sweeper calls per round at most (a round stops early when a call found nothing to do).
    sweep_pages_per_round: int = 4
    #: Seconds between sweeper rounds.
    sweep_interval_s: float = 1.0
    #: How long ended run leases are kept (exact completion replays are recognised while they are).
    lease_retention_s: float = 3600.0
    #: Cap of one control-database call: a worker that has no answer by then treats it as lost.
    control_call_timeout_s: float = 5.0
    #: Cap of the worker outbox's retry backoff.
    outbox_backoff_cap_s: float = 30.0
    #: A worker ships a running attempt's new log bytes at least this often (seconds) ...
    ship_interval_s: float = 1.0
    #: ... or as soon as this many new bytes are waiting (chunks are at most 1 MiB).
    ship_batch_bytes: int = 256 * 1024
    #: After the store acknowledged a finalized log, the worker keeps its local copy this long.
    shipped_log_keep_s: float = 3600.0
    #: Chunks deleted per retention call of ``ql control`` (shipped logs older than ``log_retention_s``).
    artifact_sweep_page: int = 256

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: the core profile's limits.
        if name == "base" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def numbers(self) -> dict[str, float | int]:
        """The cluster numbers in force, by name (what ``ql doctor`` shows)."""
        return {name: getattr(self, name) for name in NUMBER_RANGES}


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    worker_id: str
    slots: int = 4
    drain: str = "finish"
    drain_timeout_s: float = 60.0
    #: The task-spec key file (sealing.py); None: this node can neither submit nor run cluster runs.
    spec_key_file: str | None = None
    spec_previous_key_file: str | None = None

    def key_ring(self) -> Any:
        """The spec key ring (read now, checked); a one-line ConfigError naming the fix otherwise."""
        from .sealing import SpecKeyRing

        return SpecKeyRing.from_settings(self.spec_key_file, self.spec_previous_key_file)


def _error(key: str, what: str) -> ConfigError:
    return ConfigError(f"[plugin.{PLUGIN_NAME}] {key} {what}")


def _check_number(where: str, key: str, value: object) -> float | int:
    kind, low, high = NUMBER_RANGES[key]
    ok = isinstance(value, int) and not isinstance(value, bool)  # `true` is a mistake, not 1
    if kind is float:
        ok = ok or isinstance(value, float)
    if not ok:
        raise ConfigError(f"{where}{key} must be {'a number' if kind is float else 'an integer'} "
                          f"between {low:g} and {high:g}, got {type(value).__name__}")
    if not low <= value <= high:  # type: ignore[operator]
        raise ConfigError(f"{where}{key} = {value} is out of range; allowed {low:g} to {high:g}")
    return kind(value)  # type: ignore[no-any-return]


def cluster_profile(base: Any, table: Mapping[str, Any], legacy: Mapping[str, Any] | None = None) -> ClusterProfile:
    """The cluster numbers of ``[plugin.cluster-fenced]`` (``table``) over those an older config
    still sets in ``[limits]`` (``legacy``), over the defaults; every value range-checked, their
    relations too (:func:`check_profile`). One-line ConfigErrors naming where the key was."""
    numbers: dict[str, float | int] = {}
    for key, value in (legacy or {}).items():
        if key in NUMBER_RANGES:
            numbers[key] = _check_number("limits.", key, value)
    for key, value in table.items():
        if key in NUMBER_RANGES:
            numbers[key] = _check_number(f"[plugin.{PLUGIN_NAME}] ", key, value)
    profile = ClusterProfile(base, **numbers)  # type: ignore[arg-type]
    check_profile(profile)
    return profile


def profile_of(config: Any) -> ClusterProfile:
    """The cluster profile of a loaded :class:`~ql_core.config.Config`."""
    return cluster_profile(config.profile, config.plugin_settings.get(PLUGIN_NAME, {}), config.extra_limits)


def parse_settings(table: Mapping[str, Any], *, node_id: str) -> ClusterSettings:
    """Validate the plugin's table; every problem is one line naming the key and the fix."""
    bad = unknown_setting(f"plugin.{PLUGIN_NAME}", table, _KEYS)
    if bad is not None:
        raise bad
    worker_id = table.get("worker_id", node_id)
    if not isinstance(worker_id, str) or not WORKER_ID_PATTERN.fullmatch(worker_id):
        raise _error("worker_id", "must be 1 to 64 characters of letters, digits and . _ : - "
                                  '(e.g. worker_id = "build-03")')
    slots = table.get("slots", 4)
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 4096:
        raise _error("slots", "must be an integer between 1 and 4096 (attempts run at once)")
    drain = table.get("drain", "finish")
    if drain not in DRAIN_MODES:
        raise _error("drain", f'must be "finish" or "hand_back", got {drain!r}'[:120])
    timeout = table.get("drain_timeout_s", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 86_400:
        raise _error("drain_timeout_s", "must be a number of seconds between 0 and 86400")
    keys = {}
    for key in ("spec_key_file", "spec_previous_key_file"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.startswith("/") or "\0" in value
                                  or len(value) > 4096):
            raise _error(key, 'must be an absolute path to a key file (e.g. "/etc/ql/spec.key")')
        keys[key] = value
    return ClusterSettings(worker_id=worker_id, slots=slots, drain=drain, drain_timeout_s=float(timeout), **keys)


def check_profile(profile: ClusterProfile) -> None:
    """The relations between the cluster numbers (each one alone is range-checked by :func:`cluster_profile`)."""
    where = f"[plugin.{PLUGIN_NAME}]"
    if profile.heartbeat_interval_s >= profile.session_lease_s:
        raise ConfigError(f"{where} heartbeat_interval_s ({profile.heartbeat_interval_s:g}) must be shorter than "
                          f"session_lease_s ({profile.session_lease_s:g}), or the worker's session lapses "
                          f"between heartbeats")
    if profile.fence_margin_s * 2 >= profile.run_lease_s:
        raise ConfigError(f"{where} fence_margin_s ({profile.fence_margin_s:g}) must be less than half of "
                          f"run_lease_s ({profile.run_lease_s:g}): leases are renewed at half life")
