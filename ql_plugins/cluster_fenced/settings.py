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
```

The timing numbers (heartbeat, leases, claim batch, sweep page, …) are profile limits
(``[limits]``, see :mod:`ql_core.profiles`), each with a hard range; their relations are checked
here (:func:`check_profile`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ql_core.errors import ConfigError, unknown_setting

__all__ = ["ClusterSettings", "parse_settings", "check_profile", "WORKER_ID_PATTERN", "DRAIN_MODES",
           "PLUGIN_NAME"]

PLUGIN_NAME = "cluster-fenced"
#: What the control database accepts as a worker id.
WORKER_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
DRAIN_MODES = ("finish", "hand_back")
_KEYS = ("worker_id", "slots", "drain", "drain_timeout_s", "spec_key_file", "spec_previous_key_file")


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


def check_profile(profile: Any) -> None:
    """The relations between the cluster numbers (each one alone is range-checked on load)."""
    if profile.heartbeat_interval_s >= profile.session_lease_s:
        raise ConfigError(f"limits.heartbeat_interval_s ({profile.heartbeat_interval_s:g}) must be shorter than "
                          f"limits.session_lease_s ({profile.session_lease_s:g}), or the worker's session lapses "
                          f"between heartbeats")
    if profile.fence_margin_s * 2 >= profile.run_lease_s:
        raise ConfigError(f"limits.fence_margin_s ({profile.fence_margin_s:g}) must be less than half of "
                          f"limits.run_lease_s ({profile.run_lease_s:g}): leases are renewed at half life")
