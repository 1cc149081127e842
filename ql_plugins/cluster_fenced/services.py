"""The two long-lived roles a cluster run store serves: ``ql worker`` and ``ql control``.

Capabilities of the cluster's journal backends (not of core's journal port): the commands check
``isinstance(rt.journal, WorkerService)`` before they start, so a wrong profile is a one-line
usage error naming the profile to use.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

__all__ = ["WorkerService", "ControlService"]


@runtime_checkable
class WorkerService(Protocol):
    """A run store that can serve as a cluster worker (``ql worker``)."""

    def run_worker(self, runtime: object, stop: threading.Event) -> int:
        """Claim, run, renew and complete attempts with ``runtime``'s executor until ``stop`` is set,
        then drain (bounded); return the process exit status."""
        ...


@runtime_checkable
class ControlService(Protocol):
    """A run store that can run the control plane's sweeper (``ql control``)."""

    def run_control(self, runtime: object, stop: threading.Event) -> int:
        """Sweep leases, deadlines and retention in bounded pages until ``stop`` is set; exit status."""
        ...
