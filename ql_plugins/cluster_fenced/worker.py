"""``ql worker``: claim, run, renew and complete attempts of the control plane (DESIGN.md §9).

:class:`Worker` is the assembly; each thread's job has its own module, handed what it uses (the
session, the fence guard — which keeps the held attempts —, the runner, the outbox sender), never
the ``Worker``:

- :mod:`.held_attempts` — the attempts this worker holds, under one lock;
- :mod:`.control_session` — the one control connection, the session, its flags and the process's
  stop/done/wake signals;
- :mod:`.control_loop` — the **control loop** (the thread that called :meth:`Worker.run`: register,
  claim, start, running, outbox, release) and the **queue listener** (``LISTEN ql_queue``: a
  notification only wakes the loop early);
- :mod:`.lease_keeper` — the **lease keeper** thread: heartbeats and renewals on their own control
  connection, so a busy control loop (or machine) never delays them;
- :mod:`.runner` — claims and starts, and one **runner** thread per attempt (spawns it through the
  node's own two steps, then waits for it locally; never calls the control database);
- :mod:`.fence_guard` — lease renewal, and the **fence guard** thread (never touches the network:
  past an attempt's own lease deadline on the monotonic clock it stops the attempt itself);
- :mod:`.outbox_sender` — every local terminal transition of a claimed attempt is in the outbox
  (:class:`~.worker_store.WorkerJournal`); it is submitted with the attempt's fence until a final
  answer, and only then marked answered;
- :mod:`.drain` — restart (settle and submit what the previous process left, then fence what of it
  still runs) and drain;
- the **log shipper** (:mod:`.log_shipper`): ships each claimed attempt's local log to the artifact
  store on its own connection; it never holds a lock the others need;
- the node's own **supervisor** (local reconciliation rounds): settles attempts whose runner is
  gone (e.g. after a restart) from their receipts or process identity.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ql_core.errors import QlError
from ql_core.log import logger
from ql_core.supervisor import Supervisor

from .control_loop import ControlLoop
from .control_session import ControlSession
from .drain import Drain, Restart
from .fence_guard import FenceGuard
from .held_attempts import HeldAttempts
from .lease_keeper import LeaseKeeper
from .outbox_sender import OutboxSender
from .runner import Runner, spawn_claimed

if TYPE_CHECKING:
    from ql_core.node import Node

    from .log_shipper import LogShipper
    from .worker_ports import WorkerStore

__all__ = ["Worker", "spawn_claimed", "WORKER_LOCK"]

WORKER_LOCK = "worker.lock"


class Worker:
    """One ``ql worker`` process (see the module docstring)."""

    def __init__(self, node: Node, journal: WorkerStore, stop: threading.Event) -> None:
        self.node = node
        self.journal = journal
        session = self.session = ControlSession(control_url=journal.control_url, clock=journal.clock,
                                                settings=journal.settings, profile=journal.profile, stop=stop)
        held = HeldAttempts(journal.leases)
        self.guard = FenceGuard(node, held, session)
        self.outbox = OutboxSender(held, session)
        self.outbox.before_complete = self.guard.report_spawned
        self.runner = Runner(node, journal, session, self.guard)
        self.loop = ControlLoop(session, guard=self.guard, runner=self.runner, outbox=self.outbox)
        self.keeper = LeaseKeeper(session, self.guard)
        self.restart = Restart(node, journal, session, guard=self.guard, outbox=self.outbox)
        self.drain = Drain(session, guard=self.guard, runner=self.runner, tick=lambda: self.loop.tick(claiming=False))
        self.drain.before_deregister = self.keeper.stop  # no heartbeat may follow the deregistration
        self.shipper: LogShipper | None = None
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------------
    def run(self) -> int:
        session = self.session
        # The spec key first: a worker that could not open what it claims must not claim at all.
        self.runner.ring = session.settings.key_ring()
        self._lock_data_dir()
        self.journal.on_outbox = self.outbox.on_outbox
        supervisor = None
        try:
            self._thread(self._stop_watch, "ql-worker-stop")
            self._prepare_shipper()
            self.restart.recover_previous()
            if not self.loop.register():
                return 0  # stopped before the control plane ever answered
            self.keeper.start()
            self.restart.fence_previous()
            if self.shipper is not None:
                self.shipper.start()
            self._thread(self.guard.run, "ql-worker-fence-guard")
            self._thread(self.loop.listen, "ql-worker-queue")
            supervisor = Supervisor(self.node)
            supervisor.start()
            logger.info("ql worker {} (generation {}): {} slots, run lease {:g}s", session.worker_id,
                        session.worker.generation if session.worker else "?", session.settings.slots,
                        session.ttl_s)
            while not session.stop.is_set() and not session.taken_over:
                self.loop.tick(claiming=True)
                self.loop.sleep()
            status = self.drain.drain()
            if session.taken_over:
                raise QlError(f"worker id {session.worker_id!r} was registered by another process: this one stopped "
                              f"its attempts and exits (give every worker its own worker_id)")
            return status
        finally:
            session.done.set()
            session.wake.set()
            self.guard.wake.set()
            self.keeper.stop()
            stats = session.lease_latency_summary()
            if stats["calls"]:
                logger.info("leases: {} renewals; the last {} lease calls took p50 {}ms p99 {}ms max {}ms",
                            session.counts.get("renewed", 0), stats["calls"], stats["p50_ms"], stats["p99_ms"],
                            stats["max_ms"])
            if supervisor is not None:
                supervisor.stop()
            self.runner.threads.stop()
            if self.shipper is not None:
                self.shipper.stop()
                self.shipper.table.close()
            self.journal.on_outbox = None
            session.close()
            self._unlock_data_dir()

    def _prepare_shipper(self) -> None:
        """Create the log shipper (when an artifact store is configured) and make sure every attempt
        this data dir still holds a token for is tracked — before the recovery of the previous
        process answers (and so erases) any token: a crash between recording a claim and tracking it
        leaves no log behind. Started after registering (its proof needs the live session)."""
        name = self.node.config.artifact_store
        if not name:
            return
        from .log_shipper import LogShipper
        from .ship_table import open_ship_table

        profile = self.session.profile
        table = open_ship_table(self.node.config.data_dir, int(profile.busy_timeout_ms))
        self.shipper = LogShipper(self.node, table, lambda: self.node.plugins.artifact_stores.create(name, self.node.context),
                                  worker_id=self.session.worker_id, profile=profile, fence=self.session.live_fence)
        self.runner.shipper = self.outbox.shipper = self.drain.shipper = self.shipper
        missing = []
        for row in self.journal.leases.unanswered():
            attempt = self.node.journal.attempt(row.attempt_id)
            if row.lease_token and attempt is not None and table.get(row.attempt_id) is None:
                missing.append((row.attempt_id, row.run_id, attempt.log_artifact_id, row.lease_generation,
                                row.lease_token))
        if missing:
            table.track(missing)

    def _thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _stop_watch(self) -> None:
        session = self.session
        while not session.done.is_set():
            if session.stop.wait(0.5):
                session.wake.set()
                return

    def _lock_data_dir(self) -> None:
        path = Path(self.node.config.data_dir) / WORKER_LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise QlError(f"another ql worker runs on {self.node.config.data_dir} ({WORKER_LOCK} is locked); "
                          f"stop it first, or give this worker its own --data-dir") from None
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
