"""Proving that a ``starting`` attempt without a handle never started — from facts, never a timer.

The create commit records the submitting host's own identity (``host_handle``,
in its executor's handle format). Executors hold every task until core
releases it, which core does only after the task's durable handle is
committed (:meth:`~ql_core.ports.executor.Executor.release`). So for an
attempt that is still ``starting`` and has no handle:

- its host is **alive** → it may be spawning right now: leave it to its host;
- its host is **gone** → it never committed the handle, so it never released
  the task: the command never started and never will (a held launcher that
  outlived its host reads EOF and exits without running it) — proven;
- its host's identity **cannot be read** (no host handle: an attempt from
  before this rule; or an unreadable identity) → nothing is proven.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Callable

from .ports.executor import IdentityState

if TYPE_CHECKING:
    from .ports.executor import Executor
    from .records import AttemptRecord

__all__ = ["StartState", "start_state", "NEVER_STARTED_REASON"]

#: ``reason`` of an attempt whose host died before releasing it: nothing ever ran.
NEVER_STARTED_REASON = "RECOVERY_NEVER_STARTED"


class StartState(enum.StrEnum):
    HOST_ALIVE = "host_alive"
    NEVER_STARTED = "never_started"
    UNKNOWN = "unknown"


def start_state(executor_for: Callable[[str], Executor | None], attempt: AttemptRecord) -> StartState:
    """What the host identity of a ``starting``, handle-less attempt proves (see the module doc)."""
    executor = executor_for(attempt.executor)
    if executor is None or attempt.host_handle is None:
        return StartState.UNKNOWN
    state = executor.inspect(attempt.host_handle)
    if state is IdentityState.RUNNING:
        return StartState.HOST_ALIVE
    if state is IdentityState.EXITED:
        return StartState.NEVER_STARTED
    return StartState.UNKNOWN
