"""The worker's local run store: the edge store, with the lease row's steps in the same commits.

A claimed attempt's lease row (:mod:`.worker_tables`, same ``worker.db`` file) moves with the
attempt's local life. Each of its two steps that follows a local commit is written *inside* that
commit (the kernel's ``_create_also`` / ``_terminal_also``), not in a commit of its own — two
fsync'd commits fewer per task, and no crash window between the pair:

- ``claimed`` → ``launching`` in the local **create** commit. SIGKILL before it: the row is
  ``claimed`` and no local run exists → the restart releases it (never launched), as it released
  a ``launching`` row without a local run before. After it: ``launching`` with the local attempt
  ``starting`` and no handle → the launcher is held until its handle commits, so its host being
  gone proves it never started (``RECOVERY_NEVER_STARTED``) → released. Both as before. With a
  standby launcher (:func:`~.runner.spawn_claimed`) the create commit holds its handle and the
  attempt ``running``: a SIGKILL after it and before the hand-over leaves an idle standby that exits
  unrun, which nothing proves afterwards → the attempt ends ``lost`` (no receipt, process gone).
- the **outbox** payload in the local **terminal** commit. SIGKILL before it: neither committed;
  the receipt (consumed only after the terminal commit) or the process identity is still there,
  and the restart's reconciliation pass commits the terminal state — with the outbox row. After
  it: both are durable, the receipt may go. The restart's outbox rebuild
  (:meth:`~.worker_store.WorkerJournal.rebuild_outbox`) stays for data dirs of earlier releases.

The payload is the same pure function of the same rows (:func:`~.outbox.build_payload`): the
attempt as the terminal change leaves it and the dispatch's signal, both known to the transition
(it read them to decide, and applied the change), so nothing is read again.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ql_core.crashpoints import crashpoint
from ql_core.log import logger
from ql_plugins.edge_sqlite.store import SqliteJournal

from .outbox import build_payload
from .worker_tables import lease_row_in, mark_launching_in, to_outbox_in

if TYPE_CHECKING:
    from ql_core.ports.journal import Snapshot, Transition
    from ql_core.records import NewRun

    from .outbox import DbClock

__all__ = ["WorkerLocalStore"]


class WorkerLocalStore(SqliteJournal):
    """``worker.db``'s run store (see the module docstring)."""

    def __init__(self, url: str, *, clock: DbClock, busy_timeout_ms: int = 5000, create: bool = True,
                 refuse_fresh: bool = False) -> None:
        super().__init__(url, busy_timeout_ms=busy_timeout_ms, create=create, refuse_fresh=refuse_fresh)
        self.clock = clock
        self._outboxed: set[str] = set()
        self._outboxed_lock = threading.Lock()

    def take_outboxed(self, attempt_id: str) -> bool:
        """Did a committed terminal transition put this attempt into the outbox (told once)?"""
        with self._outboxed_lock:
            if attempt_id in self._outboxed:
                self._outboxed.discard(attempt_id)
                return True
            return False

    def _create_also(self, c: Any, new: NewRun) -> None:
        # claimed -> launching in the create commit (module docstring: what a SIGKILL leaves). A row
        # in another state (a replayed create) is left as it is, as the separate commit did.
        mark_launching_in(c, new.attempt_id)

    def _terminal_also(self, c: Any, snap: Snapshot, change: Transition) -> None:
        super()._terminal_also(c, snap, change)  # the edge store's own: an offered log size
        attempt_id = snap.attempt.id
        row = lease_row_in(c, attempt_id)
        if row is None or row.state not in ("claimed", "launching"):
            return  # not a claimed attempt, or its payload is fixed already
        try:
            # The attempt as this commit leaves it, and whether ql signalled it for an intent, from
            # what the transition read and applied: the same rows a read here would return (the
            # payload needs the attempt's own columns and the dispatch's signal, which the decision
            # read already), two statements fewer per task.
            ended = snap.attempt._replace(**change.attempt)
            payload = build_payload(ended, snap.signalled, row, self.clock)
        except Exception as exc:  # noqa: BLE001 - never blocks the terminal commit: fixed after it
            logger.warning("outbox row of attempt {} deferred: {}", attempt_id, type(exc).__name__)
            return
        crashpoint("worker.outbox.before_insert")
        if to_outbox_in(c, attempt_id, payload):
            with self._outboxed_lock:
                self._outboxed.add(attempt_id)
