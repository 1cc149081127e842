"""The **control loop** and the **queue listener** of ``ql worker``.

The control loop (the thread that called :meth:`~.worker.Worker.run`) makes the worker's control
calls but the lease ones: register, claim, start, running, outbox submissions, release. Heartbeats
and renewals are the lease keeper's (:mod:`.lease_keeper`: its own thread and connection), so they
never wait behind these. The queue listener (``LISTEN ql_queue`` and ``ql_intent`` on its own
connection) only wakes the loop (or the keeper, for an intent) early: both poll anyway.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ql_core.log import logger

from .control_db import ControlDBError, TransientError
from .fence_guard import IDLE_S, RUNNING_REPORT_WITHIN_S
from .round_report import RoundReport

if TYPE_CHECKING:
    from .control_session import ControlSession
    from .fence_guard import FenceGuard
    from .held_attempts import HeldAttempts
    from .outbox_sender import OutboxSender
    from .runner import Runner

__all__ = ["ControlLoop"]


class ControlLoop:
    """One round after another: claims, then starts, spawned reports and outbox (one statement), purge."""

    def __init__(self, session: ControlSession, *, guard: FenceGuard, runner: Runner, outbox: OutboxSender) -> None:
        self.session = session
        self.guard = guard
        self.runner = runner
        self.outbox = outbox
        #: The attempts this worker holds (the guard's).
        self.held: HeldAttempts = guard.held
        self.report = RoundReport(session, guard=guard, runner=runner, outbox=outbox)

    # -- one round -----------------------------------------------------------------------------------------
    def tick(self, *, claiming: bool) -> None:
        try:
            # The claim first: a slot freed by a task that just ended is taken again before this
            # round reports anything (its completion is in the outbox, durable; a few ms later
            # changes nothing but the control plane's view) — the refill waits for one round trip,
            # not for the running reports and the completions before it.
            if claiming:
                self.runner.claim()
            # The claim's starts, the running reports and the completions: one transaction.
            self.report.report()
            self.outbox.purge()
        except ControlDBError as exc:  # a final error of one call (a bug or a schema mismatch)
            logger.error("control call failed: {}", exc)
            self.session.stop.wait(1.0)
        except Exception as exc:  # noqa: BLE001 - e.g. the local disk: the loop (and its leases) go on
            # Type only: a traceback's variables could hold a token or a spec.
            logger.error("worker round failed ({}); retried in 1s", type(exc).__name__)
            self.session.stop.wait(1.0)

    def sleep(self) -> None:
        """Until the next thing due (a start, a running report, an outbox try, a claim, the purge), or woken."""
        now = time.monotonic()
        due = [self.outbox.purge_due]
        spawned_since = self.guard.spawned_since
        if spawned_since is not None:
            due.append(spawned_since + RUNNING_REPORT_WITHIN_S)  # its running report (FenceGuard.spawned)
        for held in self.held.select():
            if held.state == "claimed":
                due.append(held.start_retry)
            elif held.state in ("started", "launching"):
                due.append(now + RUNNING_REPORT_WITHIN_S)  # about to spawn: a report follows, wakes nobody
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
                                self.guard.renew_wake.set()
                            else:
                                self.runner.queue_woken = True
                            self.session.wake.set()
            except Exception:  # noqa: BLE001 - a wake-up only: the control loop polls anyway
                done.wait(delay)
                delay = min(delay * 2, 30.0)
