"""Restart and drain: what a worker does before it registers, and before it exits.

Restart (same data dir, so the same ``worker_id``): before registering — which bumps the generation
and fences every lease of the previous process — :meth:`Restart.recover_previous` settles what
ended while the worker was down (one local reconciliation pass), releases attempts that provably
never spawned, and submits the outbox with the *old* fences. After registering,
:meth:`Restart.fence_previous` stops every attempt of the previous process that still runs (its
lease is gone): nothing launched before is ever spawned again.

Drain (:meth:`Drain.drain`): stop claiming, finish (or hand back) what runs, bounded; submit the
outbox; deregister.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Callable

from ql_core.clock import now_ms
from ql_core.log import logger
from ql_core.reconciler import Reconciler
from ql_core.states import RUN_TERMINAL

from .control_db import ControlDBError
from .held_attempts import Held
from .outbox import DRAINED, FENCED, NEVER_STARTED, Payload
from .results import LeaseAnswer, WorkerFence

if TYPE_CHECKING:
    from ql_core.node import Node

    from .control_session import ControlSession
    from .fence_guard import FenceGuard
    from .held_attempts import HeldAttempts
    from .log_shipper import LogShipper
    from .outbox_sender import OutboxSender
    from .runner import Runner
    from .worker_ports import WorkerStore
    from .worker_tables import LeaseRow

__all__ = ["Restart", "Drain"]


class Restart:
    """The previous process's attempts: settled and submitted before registering, stopped after."""

    def __init__(self, node: Node, store: WorkerStore, session: ControlSession, *, guard: FenceGuard,
                 outbox: OutboxSender) -> None:
        self.node = node
        self.store = store
        self.session = session
        self.guard = guard
        self.outbox = outbox
        self.leases = store.leases
        #: The attempts this worker holds (the guard's).
        self.held: HeldAttempts = guard.held

    # -- restart -------------------------------------------------------------------------------------------
    def recover_previous(self) -> None:
        """Before registering: settle, release and submit what the previous process left (old fences)."""
        rows = self.leases.unanswered()
        if not rows:
            return
        logger.info("recovering {} attempts of the previous worker process", len(rows))
        old, session = rows[0], self.session
        with contextlib.suppress(ControlDBError):
            # Measures the database clock (the outbox states its times in it); the old session's
            # heartbeat changes nothing that matters: registering next replaces it.
            session.call(lambda db: db.heartbeat(WorkerFence(old.worker_id, old.worker_generation, old.session),
                                                 ttl_ms=int(session.profile.session_lease_s * 1000)))
        # What ended while no worker ran: receipts, process identities (one bounded local pass).
        with contextlib.suppress(Exception):
            Reconciler(self.node).full_pass()
        for row in rows:
            self._recover_row(row)
        self.store.rebuild_outbox()
        deadline = time.monotonic() + session.ttl_s
        while time.monotonic() < deadline and not session.stop.is_set():
            pending = [r for r in self.leases.by_state("outbox") if r.stop_reason != FENCED]
            if not pending:
                break
            self.outbox.submit_due(pre_register=True)
            if any(self.held.outbox_next.get(r.attempt_id, 0) > time.monotonic() for r in pending):
                session.stop.wait(0.2)

    def _recover_row(self, row: LeaseRow) -> None:
        from ql_core.never_started import StartState, start_state

        if row.state == "claimed":
            # Never launched (launching is written before any spawn): back to the queue.
            self.store.outbox_direct(row.attempt_id, Payload("released"))
            return
        if row.state != "launching":
            return
        attempt = self.node.journal.attempt(row.attempt_id)
        if attempt is None:
            self.store.outbox_direct(row.attempt_id, Payload("released"))  # crashed before the local create
            return
        if attempt.status == "starting" and attempt.handle is None \
                and start_state(self.node.executor_for, attempt) is StartState.NEVER_STARTED:
            # Its host (the previous worker process) is gone and never committed the handle, so it
            # never released the held task: the command never started (ql_core.never_started).
            self.node.completion.end_without_receipt(attempt.id, status="lost", reason=NEVER_STARTED)

    def fence_previous(self) -> None:
        """After registering: every attempt of the previous process still running lost its lease."""
        worker = self.session.worker
        assert worker is not None
        for row in self.leases.unanswered():
            if row.state != "launching" or (row.worker_generation, row.session) == (worker.generation, worker.session):
                continue
            fence = row.fence()
            held = Held(fence=fence, run_id=row.run_id, state="spawned", previous=True, last_ok=0.0)
            attempt = self.node.journal.attempt(row.attempt_id)
            if attempt is None or attempt.status in RUN_TERMINAL:
                continue
            if attempt.handle is None:
                # Spawned (maybe) but its handle never saved: nothing can verify or signal it. Its lease
                # is fenced; if a receipt comes, the supervisor settles it and the outbox reports it.
                self.leases.mark_stopped(row.attempt_id, FENCED, stopped_at_ms=now_ms(), not_before_ms=None)
                logger.warning("attempt {} of the previous process has no durable handle: it cannot be "
                               "stopped; its lease is fenced", row.attempt_id)
                continue
            self.held.add(held)
            logger.warning("attempt {} of the previous process still runs without a lease: stopping it",
                           row.attempt_id)
            self.guard.self_fence(held, by_database=True)



class Drain:
    """Stop claiming; finish (or hand back) what runs, bounded; submit the outbox; deregister."""

    def __init__(self, session: ControlSession, *, guard: FenceGuard, runner: Runner,
                 tick: Callable[[], None]) -> None:
        self.session = session
        self.guard = guard
        self.runner = runner
        #: One round of the control loop without claiming.
        self.tick = tick
        self.held: HeldAttempts = guard.held
        self.shipper: LogShipper | None = None
        #: Called right before deregistering (the worker stops its lease keeper there).
        self.before_deregister: Callable[[], None] = lambda: None

    def drain(self) -> int:
        """Stop claiming; finish (or hand back) what runs, bounded; submit the outbox; deregister."""
        session, leases = self.session, self.held.leases
        settings, profile = session.settings, session.profile
        session.draining = True
        logger.info("draining ({}, at most {:g}s)", settings.drain, settings.drain_timeout_s)
        unstarted = self.held.select(lambda h: h.state in ("claimed", "started") and not h.ended
                                     and h.stop_reason is None and not h.previous)
        for held in unstarted:
            with self.held.lock:
                if held.state not in ("claimed", "started"):
                    continue
                held.stop_reason = DRAINED  # a runner that has not begun will not spawn it
            self.runner.release(held)
        if settings.drain == "hand_back" or session.taken_over:
            self.hand_back_all()
        finish_by = time.monotonic() + settings.drain_timeout_s
        handed_back = settings.drain == "hand_back" or session.taken_over
        hard_stop = finish_by + float(profile.cancel_grace_s) + session.call_timeout_s * 2 + 2.0
        announced = False
        while time.monotonic() < hard_stop:
            if not handed_back and time.monotonic() >= finish_by:
                self.hand_back_all()
                handed_back = True
                hard_stop = time.monotonic() + float(profile.cancel_grace_s) + session.call_timeout_s * 2 + 2.0
            self.tick()
            if not announced:
                # After the first round, not before: the announcement is for operators and must
                # never delay a start or an outbox submission (renewals have their own thread).
                announced = True
                self._announce_drain()
            open_ = self.held.select(lambda h: not (h.previous and h.ended))
            if not open_ and not leases.by_state("outbox"):
                break
            session.wake.wait(0.1)
            session.wake.clear()
        if self.shipper is not None and session.worker is not None and not session.taken_over:
            # Deregistering ends the session that proves this worker to the artifact store: finalize
            # the logs of ended attempts first (bounded; a later start finishes whatever is left).
            if not self.shipper.flush(min(10.0, max(1.0, settings.drain_timeout_s))):
                logger.info("some logs are not finalized yet; the next start of this worker ships them")
        worker = session.worker
        self.before_deregister()
        if worker is not None and not session.taken_over:
            with contextlib.suppress(ControlDBError):
                session.call(lambda db: db.deregister(worker))
        current = (worker.generation, worker.session) if worker is not None else None
        pending = waiting = 0
        for row in leases.unanswered():
            if row.state == "outbox" or (row.worker_generation, row.session) == current:
                pending += 1
            else:
                # An attempt of an earlier process that never ended locally (e.g. spawned, handle never
                # saved: blocked). Its lease is fenced; its row waits for a receipt that may yet come.
                waiting += 1
        if waiting:
            logger.info("{} attempts of earlier processes wait for a receipt (their leases are fenced)", waiting)
        if pending:
            logger.warning("drain ended with {} attempts not answered yet; a restart submits them", pending)
            return 1
        return 0

    def _announce_drain(self) -> None:
        """Mark this worker ``draining`` in the control database (``ql workers``; revision 0008).

        For operators only: nothing fences on it, so it is one bounded call (``call_timeout_s``) and a
        failure — no answer, a role not granted ``ql_drain`` yet, a control plane not upgraded — only
        logs and the drain goes on. A crash right after leaves the row ``draining`` until the session
        lease passes (then ``expired``) or the next start registers ``active`` again.
        """
        worker = self.session.worker
        if worker is None or self.session.taken_over:
            return
        try:
            answer, _sent = self.session.call(lambda db: db.drain(worker))
        except ControlDBError as exc:
            hint = (" (run `ql db grant-worker ROLE` again after `ql db upgrade`)" if exc.sqlstate == "42501"
                    else " (the control database is older than this worker: run `ql db upgrade`)"
                    if exc.sqlstate == "42883" else "")
            logger.warning("could not mark this worker draining in the control database ({}){}; draining anyway",
                           exc.kind, hint)
            return
        if answer is LeaseAnswer.FENCED:
            logger.info("the control database answered fenced to draining: another process holds this worker id")

    def hand_back_all(self) -> None:
        """Stop every running attempt (``drained``: TERM now, KILL after ``cancel_grace_s``)."""
        running = self.held.select(lambda h: not h.ended and h.stop_reason is None and h.sub is not None)
        for held in running:
            with self.held.lock:
                if held.stop_reason is not None:
                    continue
                held.stop_reason = DRAINED
            self.guard.stop(held, DRAINED, grace_s=float(self.session.profile.cancel_grace_s))
        self.guard.wake.set()
