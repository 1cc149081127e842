"""The **control loop** and the **queue listener** of ``ql worker``.

The control loop (the thread that called :meth:`~.worker.Worker.run`) is the only one that calls
the control database: register, heartbeat, claim, start, running, renew, outbox submissions,
release. The queue listener (``LISTEN ql_queue`` and ``ql_intent`` on its own connection) only
wakes the loop early: it polls anyway.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ql_core.log import logger

from .control_db import ControlDBError, TransientError
from .fence_guard import IDLE_S
from .results import LeaseAnswer

if TYPE_CHECKING:
    from .control_session import ControlSession
    from .fence_guard import FenceGuard
    from .held_attempts import HeldAttempts
    from .outbox_sender import OutboxSender
    from .runner import Runner

__all__ = ["ControlLoop"]


class ControlLoop:
    """One round after another: events, heartbeat, renewals, starts, outbox, claims, purge."""

    def __init__(self, session: ControlSession, *, guard: FenceGuard, runner: Runner, outbox: OutboxSender) -> None:
        self.session = session
        self.guard = guard
        self.runner = runner
        self.outbox = outbox
        #: The attempts this worker holds (the guard's).
        self.held: HeldAttempts = guard.held

    # -- one round -----------------------------------------------------------------------------------------
    def tick(self, *, claiming: bool) -> None:
        try:
            self.guard.report_spawned()
            self._heartbeat()
            self.guard.renew()
            self.runner.start_pending()
            self.outbox.submit_due()
            if claiming:
                self.runner.claim()
            self.outbox.purge()
        except ControlDBError as exc:  # a final error of one call (a bug or a schema mismatch)
            logger.error("control call failed: {}", exc)
            self.session.stop.wait(1.0)
        except Exception as exc:  # noqa: BLE001 - e.g. the local disk: the loop (and its leases) go on
            # Type only: a traceback's variables could hold a token or a spec.
            logger.error("worker round failed ({}); retried in 1s", type(exc).__name__)
            self.session.stop.wait(1.0)

    def sleep(self) -> None:
        """Until the next thing due (a heartbeat, a renewal, a start, an outbox try, a claim), or woken."""
        now = time.monotonic()
        due = [self.session.heartbeat_due, self.outbox.purge_due]
        for held in self.held.select():
            if not held.previous and held.stop_reason is None:
                due.append(held.renew_due)
            if held.state == "claimed":
                due.append(held.start_retry)
        due += list(self.held.outbox_next.values())
        if self.runner.may_claim():
            due.append(self.runner.claim_due)
        timeout = max(0.0, min(min(due) - now, IDLE_S)) if due else IDLE_S
        if timeout > 0:
            self.session.wake.wait(timeout)
        self.session.wake.clear()

    # -- the worker session --------------------------------------------------------------------------------
    def register(self) -> bool:
        """Register this worker (waits for a schema or a grant); False: stopped before any answer."""
        session = self.session
        profile, stop = session.profile, session.stop
        delay = 0.1
        while not stop.is_set():
            try:
                reg, _sent = session.call(lambda db: db.register(session.worker_id, session.session,
                                                                 slots=session.settings.slots,
                                                                 ql_version=session.version,
                                                                 ttl_ms=int(profile.session_lease_s * 1000)))
            except TransientError as exc:
                logger.warning("register: no answer ({}); retried in {:.1f}s", exc.kind, delay)
                stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            except ControlDBError as exc:
                if exc.sqlstate == "42501":
                    # Connected as a worker role that was not granted (yet, or not since the last
                    # upgrade): the admin's grant makes this call work; wait for it.
                    logger.warning("this worker's database role may not call the worker functions: run `ql db "
                                   "grant-worker ROLE` as the control database's admin (again after every "
                                   "`ql db upgrade`); retried in {:.1f}s", delay)
                    stop.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if exc.sqlstate not in ("42883", "42P01"):  # anything but "no such function / table"
                    raise
                # The control database has no (current) schema yet: `ql control` or `ql db upgrade`
                # creates it. A worker never migrates the control plane; it waits.
                logger.warning("the control database has no ql schema yet (start `ql control` or run "
                               "`ql db upgrade` with the control profile); retried in {:.1f}s", delay)
                stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            session.worker = reg.worker
            session.heartbeat_due = time.monotonic() + profile.heartbeat_interval_s
            return True
        return False

    def _heartbeat(self) -> None:
        session = self.session
        if session.worker is None or time.monotonic() < session.heartbeat_due:
            return
        worker, profile = session.worker, session.profile
        try:
            res, sent = session.call(lambda db: db.heartbeat(worker, ttl_ms=int(profile.session_lease_s * 1000)))
        except TransientError:
            session.heartbeat_due = time.monotonic() + 1.0
            return
        if res.answer is LeaseAnswer.OK:
            session.heartbeat_due = sent + profile.heartbeat_interval_s
            if session.claim_paused:
                logger.info("worker session confirmed: claiming again")
            session.claim_paused = False
            return
        # Another process registered this worker id: every lease of ours is fenced.
        logger.error("worker id {} was registered by another process: fencing every attempt", session.worker_id)
        session.taken_over = True
        for held in self.held.select():
            self.guard.self_fence(held, by_database=True)

    # -- the queue listener (its own thread) -----------------------------------------------------------------
    def listen(self) -> None:
        from .pg_connections import conninfo_of

        try:
            import psycopg
        except ImportError:  # pragma: no cover
            return
        done = self.session.done
        delay = 1.0
        while not done.is_set():
            try:
                with psycopg.connect(conninfo_of(self.session.control_url), autocommit=True, connect_timeout=5,
                                     application_name="ql-worker-queue") as conn:
                    conn.execute("LISTEN ql_queue")
                    conn.execute("LISTEN ql_intent")
                    delay = 1.0
                    while not done.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            if note.channel == "ql_intent":
                                with self.held.lock:
                                    held = self.held.get(note.payload)
                                    if held is not None:
                                        held.renew_due = 0.0  # learn the intent from a renew, now
                            else:
                                self.runner.queue_woken = True
                            self.session.wake.set()
            except Exception:  # noqa: BLE001 - a wake-up only: the control loop polls anyway
                done.wait(delay)
                delay = min(delay * 2, 30.0)
