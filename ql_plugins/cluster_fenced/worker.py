"""``ql worker``: claim, run, renew and complete attempts of the control plane (DESIGN.md §9).

Threads, and who may talk to whom:

- the **control loop** (the thread that called :meth:`Worker.run`) is the only one that calls the
  control database (one connection, every call capped by ``control_call_timeout_s``): heartbeat,
  claim, start, running, renew, outbox submissions, release;
- one **runner** thread per attempt: writes ``launching`` locally, mirrors the attempt into the local
  store and spawns it through the node's own two steps (``ql_core.submit.create`` with the claim's
  ids, then ``start``: log artifact, receipt location, executor, durable handle), then blocks in
  ``ql_core.wait.wait`` — the local live path, which also dispatches the local cancel intents (TERM,
  KILL after the grace) — until the attempt ends locally;
- the **fence guard**: never touches the network. Past an attempt's own lease deadline on the
  monotonic clock (renew *sent* + TTL − ``fence_margin_s``, always before the database can expire
  the lease) it fences the attempt itself: stops its process group (verified identity: TERM, KILL
  after half the margin), keeps receipt and log, records ``SELF_FENCED`` locally, stops claiming;
- the **queue listener**: ``LISTEN ql_queue`` on its own connection; a notification only wakes the
  control loop early (it polls anyway);
- the **log shipper** (:mod:`.log_shipper`): ships each claimed attempt's local log to the artifact
  store on its own connection, resumes from the store's committed offset, finalizes after the
  attempt ended; it never holds a lock the others need, so it never delays a task or a completion;
- the node's own **supervisor** (local reconciliation rounds): settles attempts whose runner is
  gone (e.g. after a restart) from their receipts or process identity.

Every local terminal transition of a claimed attempt puts its payload into the outbox
(:class:`~.worker_store.WorkerJournal`); the control loop submits it with the attempt's fence until a
final answer (``applied``, ``already_completed``, ``already_terminal``, ``fenced``; anything else is
retried with capped backoff), and only then marks the row answered.

Restart (same data dir, so the same ``worker_id``): before registering — which bumps the generation
and fences every lease of the previous process — the worker settles what ended while it was down
(one local reconciliation pass), releases attempts that provably never spawned, and submits its
outbox with the *old* fences. Then it registers, and stops every attempt of the previous process
that still runs (its lease is gone): nothing launched before is ever spawned again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ql_core.clock import now_ms
from ql_core.crashpoints import crashpoint
from ql_core.errors import QlError
from ql_core import metrics
from ql_core.log import logger
from ql_core.reconciler import Reconciler
from ql_core.states import RUN_TERMINAL
from ql_core.supervisor import Supervisor
from ql_core.wait import wait as wait_locally

from .control_db import ControlDB, ControlDBError, TransientError
from .outbox import DRAINED, FENCED, NEVER_STARTED, SELF_FENCED, Payload
from .results import EndAnswer, EndStatus, LeaseAnswer, LeaseFence, WorkerFence

if TYPE_CHECKING:
    from ql_core.node import Node
    from ql_core.submit import Submission

    from .log_shipper import LogShipper
    from .worker_store import WorkerJournal
    from .worker_tables import LeaseRow

__all__ = ["Worker", "spawn_claimed", "WORKER_LOCK"]

WORKER_LOCK = "worker.lock"
#: Held-attempt steps. ``claimed``: claim answered; ``started``: ``start`` answered ok (spawn allowed);
#: ``launching``: runner is spawning; ``spawned``: handle stored locally; ``running``: control knows.
_LIVE = ("claimed", "started", "launching", "spawned", "running")
_PROCESS = ("launching", "spawned", "running")
#: How long the control loop sleeps at most between looks (it is woken earlier by every event).
_IDLE_S = 0.5
_FINAL_COMPLETION = {"applied", "already_completed", "already_terminal", "fenced"}


@dataclass(eq=False)
class Held:
    """One attempt whose lease this worker holds (or held): in memory, mirrored in ql_worker_lease."""

    fence: LeaseFence
    run_id: str
    log_id: str = ""
    #: The attempt's sealed spec (sealing.SealedCopy) until the runner opens it; never logged.
    spec: Any = field(default=None, repr=False)
    timeout_ms: int | None = None
    state: str = "claimed"
    #: Monotonic: past this the worker fences itself (renew sent + TTL − margin).
    own_deadline: float = 0.0
    renew_due: float = 0.0
    #: Monotonic time of the last answer that extended the lease (its latest possible expiry + TTL).
    last_ok: float = 0.0
    start_retry: float = 0.0
    deadline_mono: float | None = None
    intent: str | None = None
    sub: Submission | None = field(default=None, repr=False)
    stop_reason: str | None = None
    kill_due: float | None = None
    #: The attempt ended locally (its process is gone; its outbox row exists).
    ended: bool = False
    #: The attempt of a previous process (adopted on restart): never renewed, only stopped.
    previous: bool = False

    @property
    def attempt_id(self) -> str:
        return self.fence.attempt_id


def spawn_claimed(node: Node, *, run_id: str, attempt_id: str, log_id: str, token: str,
                  command: tuple[str, ...], shell: bool, cwd: str | None, env: dict[str, str] | None,
                  before_spawn: Callable[[], None] | None = None) -> Submission:
    """Mirror a claimed attempt into the local store (same ids, the lease token as callback token)
    and spawn it through the node's own path (:func:`ql_core.submit.create`, then
    :func:`~ql_core.submit.start`: log, receipt location, executor, handle). The returned
    submission's ``run_id`` is the *local* run id (see below)."""
    from ql_core.ids import new_id
    from ql_core.submit import RunIds, create, start

    if node.journal.run(run_id) is not None:
        # A later attempt of a run this worker ran before (retried here): the local store holds one
        # current attempt per run, so this attempt gets a local run of its own. The control plane
        # never sees the local run id (every fenced call names the attempt).
        run_id = new_id()
    # No local deadline: the control plane's lease and the worker's own timers bound the attempt.
    sub = create(node, ids=RunIds(run_id, attempt_id, log_id, token))
    if before_spawn is not None:
        before_spawn()
    return start(node, sub, command, shell=shell, cwd=cwd, env=env)


def _task_spec(spec: Any) -> tuple[tuple[str, ...], bool, str | None, dict[str, str] | None] | None:
    """The run's spec as the executor takes it; None when it is malformed (never logged)."""
    if not isinstance(spec, dict):
        return None
    command, shell, cwd, env = spec.get("command"), spec.get("shell", False), spec.get("cwd"), spec.get("env")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        return None
    if not isinstance(shell, bool) or (shell and len(command) != 1):
        return None
    if cwd is not None and not isinstance(cwd, str):
        return None
    if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                              for k, v in env.items())):
        return None
    return tuple(command), shell, cwd, (dict(env) if env else None)


class Worker:
    """One ``ql worker`` process (see the module docstring)."""

    def __init__(self, node: Node, journal: WorkerJournal, stop: threading.Event) -> None:
        from ql_core import __version__

        self.node = node
        self.journal = journal
        self.leases = journal.leases
        self.stop = stop
        self.settings = journal.settings
        self.profile = journal.profile
        self.version = __version__[:32]
        self.worker_id = self.settings.worker_id
        self.session = str(uuid.uuid4())
        self.worker: WorkerFence | None = None
        self.ttl_s = float(self.profile.run_lease_s)
        self.ttl_ms = int(self.ttl_s * 1000)
        self.margin_s = float(self.profile.fence_margin_s)
        self.kill_grace_s = self.margin_s / 2
        self.call_timeout_s = min(float(self.profile.control_call_timeout_s), self.ttl_s / 3)
        self.held: dict[str, Held] = {}
        self.lock = threading.RLock()
        self.events: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.guard_wake = threading.Event()
        self.done = threading.Event()
        self.claim_paused = False
        self.claim_due = 0.0
        self.queue_woken = False
        self.heartbeat_due = 0.0
        self.draining = False
        self.taken_over = False
        self.outbox_next: dict[str, float] = {}
        self.purge_due = 0.0
        self._db: ControlDB | None = None
        self._lock_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self.counts: dict[str, int] = {}
        #: The spec key ring (sealing.SpecKeyRing), read when the worker starts.
        self.ring: Any = None
        self.shipper: LogShipper | None = None

    # -- the control database -----------------------------------------------------------------------
    def db(self) -> ControlDB:
        if self._db is None:
            self._db = ControlDB.connect(self.journal.control_url, lazy=True,
                                         connect_timeout_s=max(2, int(self.call_timeout_s + 0.999)),
                                         statement_timeout_ms=int(max(1.0, self.call_timeout_s) * 1000),
                                         call_timeout_s=self.call_timeout_s)
        return self._db

    def call(self, fn: Callable[[ControlDB], Any]) -> tuple[Any, float]:
        """One control call; measures the database clock. Returns (result, monotonic send time)."""
        sent_mono, sent_wall = time.monotonic(), now_ms()
        result = fn(self.db())
        self.journal.clock.observe(sent_wall, now_ms(), getattr(result, "db_now_ms", None))
        return result, sent_mono

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n
        metrics.count(key, n)  # a no-op unless --metrics-listen (ql_core.metrics)

    # -- lifecycle -------------------------------------------------------------------------------------
    def run(self) -> int:
        # The spec key first: a worker that could not open what it claims must not claim at all.
        self.ring = self.settings.key_ring()
        self._lock_data_dir()
        self.journal.on_outbox = self._on_outbox
        supervisor = None
        try:
            self._thread(self._stop_watch, "ql-worker-stop")
            self._prepare_shipper()
            self._recover_previous()
            if not self._register():
                return 0  # stopped before the control plane ever answered
            self._fence_previous()
            if self.shipper is not None:
                self.shipper.start()
            self._thread(self._guard_loop, "ql-worker-fence-guard")
            self._thread(self._listen_loop, "ql-worker-queue")
            supervisor = Supervisor(self.node)
            supervisor.start()
            logger.info("ql worker {} (generation {}): {} slots, run lease {:g}s", self.worker_id,
                        self.worker.generation if self.worker else "?", self.settings.slots, self.ttl_s)
            while not self.stop.is_set() and not self.taken_over:
                self._tick(claiming=True)
                self._sleep()
            status = self._drain()
            if self.taken_over:
                raise QlError(f"worker id {self.worker_id!r} was registered by another process: this one stopped "
                              f"its attempts and exits (give every worker its own worker_id)")
            return status
        finally:
            self.done.set()
            self.wake.set()
            self.guard_wake.set()
            if supervisor is not None:
                supervisor.stop()
            if self.shipper is not None:
                self.shipper.stop()
                self.shipper.table.close()
            self.journal.on_outbox = None
            if self._db is not None:
                self._db.close()
            self._unlock_data_dir()

    def _prepare_shipper(self) -> None:
        """Create the log shipper (when an artifact store is configured) and make sure every attempt
        this data dir still holds a token for is tracked — before the recovery of the previous
        process answers (and so erases) any token: a crash between recording a claim and tracking it
        leaves no log behind. Started after registering (its proof needs the live session)."""
        name = self.node.config.artifact_store
        if not name:
            return
        from .log_shipper import LogShipper, open_ship_table

        table = open_ship_table(self.node.config.data_dir, int(self.profile.busy_timeout_ms))
        self.shipper = LogShipper(self.node, table, lambda: self.node.plugins.artifact_stores.create(name, self.node.context),
                                  worker_id=self.worker_id, profile=self.profile,
                                  fence=lambda: None if self.taken_over else self.worker)
        missing = []
        for row in self.leases.unanswered():
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
        while not self.done.is_set():
            if self.stop.wait(0.5):
                self.wake.set()
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

    def _sleep(self) -> None:
        now = time.monotonic()
        due = [self.heartbeat_due, self.purge_due]
        with self.lock:
            for held in self.held.values():
                if not held.previous and held.stop_reason is None:
                    due.append(held.renew_due)
                if held.state == "claimed":
                    due.append(held.start_retry)
        due += list(self.outbox_next.values())
        if self._may_claim():
            due.append(self.claim_due)
        timeout = max(0.0, min(min(due) - now, _IDLE_S)) if due else _IDLE_S
        if timeout > 0:
            self.wake.wait(timeout)
        self.wake.clear()

    # -- one round of the control loop -------------------------------------------------------------------
    def _tick(self, *, claiming: bool) -> None:
        try:
            self._events()
            self._heartbeat()
            self._renew()
            self._start_pending()
            self._submit_outbox()
            if claiming:
                self._claim()
            self._purge()
        except ControlDBError as exc:  # a final error of one call (a bug or a schema mismatch)
            logger.error("control call failed: {}", exc)
            self.stop.wait(1.0)
        except Exception as exc:  # noqa: BLE001 - e.g. the local disk: the loop (and its leases) go on
            # Type only: a traceback's variables could hold a token or a spec.
            logger.error("worker round failed ({}); retried in 1s", type(exc).__name__)
            self.stop.wait(1.0)

    def _events(self) -> None:
        while True:
            try:
                kind, attempt_id = self.events.get_nowait()
            except queue.Empty:
                return
            with self.lock:
                held = self.held.get(attempt_id)
            if held is not None and kind == "spawned":
                self._report_running(held)

    # -- the worker session ------------------------------------------------------------------------------
    def _register(self) -> bool:
        delay = 0.1
        while not self.stop.is_set():
            try:
                reg, _sent = self.call(lambda db: db.register(self.worker_id, self.session, slots=self.settings.slots,
                                                              ql_version=self.version,
                                                              ttl_ms=int(self.profile.session_lease_s * 1000)))
            except TransientError as exc:
                logger.warning("register: no answer ({}); retried in {:.1f}s", exc.kind, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            except ControlDBError as exc:
                if exc.sqlstate == "42501":
                    # Connected as a worker role that was not granted (yet, or not since the last
                    # upgrade): the admin's grant makes this call work; wait for it.
                    logger.warning("this worker's database role may not call the worker functions: run `ql db "
                                   "grant-worker ROLE` as the control database's admin (again after every "
                                   "`ql db upgrade`); retried in {:.1f}s", delay)
                    self.stop.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if exc.sqlstate not in ("42883", "42P01"):  # anything but "no such function / table"
                    raise
                # The control database has no (current) schema yet: `ql control` or `ql db upgrade`
                # creates it. A worker never migrates the control plane; it waits.
                logger.warning("the control database has no ql schema yet (start `ql control` or run "
                               "`ql db upgrade` with the control profile); retried in {:.1f}s", delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.worker = reg.worker
            self.heartbeat_due = time.monotonic() + self.profile.heartbeat_interval_s
            return True
        return False

    def _heartbeat(self) -> None:
        if self.worker is None or time.monotonic() < self.heartbeat_due:
            return
        worker = self.worker
        try:
            res, sent = self.call(lambda db: db.heartbeat(worker, ttl_ms=int(self.profile.session_lease_s * 1000)))
        except TransientError:
            self.heartbeat_due = time.monotonic() + 1.0
            return
        if res.answer is LeaseAnswer.OK:
            self.heartbeat_due = sent + self.profile.heartbeat_interval_s
            if self.claim_paused:
                logger.info("worker session confirmed: claiming again")
            self.claim_paused = False
            return
        # Another process registered this worker id: every lease of ours is fenced.
        logger.error("worker id {} was registered by another process: fencing every attempt", self.worker_id)
        self.taken_over = True
        with self.lock:
            helds = list(self.held.values())
        for held in helds:
            self._self_fence(held, by_database=True)

    # -- claim and start ------------------------------------------------------------------------------------
    def _live_processes(self) -> int:
        with self.lock:
            return sum(1 for h in self.held.values() if not h.ended and (h.state in _LIVE))

    def _may_claim(self) -> bool:
        return (self.worker is not None and not self.draining and not self.claim_paused and not self.taken_over
                and not self.stop.is_set() and self._live_processes() < self.settings.slots)

    def _claim(self) -> None:
        if not self._may_claim():
            return
        now = time.monotonic()
        if now < self.claim_due and not self.queue_woken:
            return
        self.queue_woken = False
        from ql_core.ids import new_id

        free = self.settings.slots - self._live_processes()
        n = min(free, int(self.profile.claim_batch))
        worker = self.worker
        assert worker is not None
        ids = [new_id() for _ in range(n)]
        logs = [new_id() for _ in range(n)]
        executor = self.node.config.executor
        try:
            result, sent = self.call(lambda db: db.claim(worker, max_n=n, free_slots=free, executor=executor,
                                                         attempt_ids=ids, log_ids=logs, lease_ttl_ms=self.ttl_ms))
        except TransientError:
            # Never replayed: claims whose answer was lost stay 'claimed' and the sweeper requeues them.
            self.claim_due = time.monotonic() + 1.0
            return
        crashpoint("worker.claim.after_answer")
        if result.answer is LeaseAnswer.FENCED:
            logger.warning("claim fenced (session lapsed or taken over): claiming paused until a heartbeat answers")
            self.claim_paused = True
            self.heartbeat_due = 0.0
            return
        if not result.attempts:
            self.claim_due = time.monotonic() + self.profile.claim_interval_s
            return
        fences = [(a.fence(worker), a.run_id) for a in result.attempts]
        try:
            self.leases.insert_claimed(fences)
        except Exception as exc:  # noqa: BLE001 - not recorded: never started; the sweeper requeues them
            logger.error("claimed {} attempts but could not record them locally ({}); they are not started",
                         len(fences), type(exc).__name__)
            self.claim_due = time.monotonic() + 1.0
            return
        self._count("claimed", len(result.attempts))
        log_of = dict(zip(ids, logs))  # the control plane keeps the log id this worker chose
        if self.shipper is not None:
            try:  # before anything spawns: every byte of these logs is shipped
                self.shipper.track([(f.attempt_id, run_id, log_of[f.attempt_id], f.lease_generation, f.lease_token)
                                    for f, run_id in fences])
            except Exception as exc:  # noqa: BLE001 - the next start tracks them from ql_worker_lease
                logger.error("claimed attempts not tracked for log shipping ({})", type(exc).__name__)
        for claimed, (fence, _run_id) in zip(result.attempts, fences):
            held = Held(fence=fence, run_id=claimed.run_id, log_id=log_of[claimed.attempt_id], spec=claimed.sealed_spec,
                        timeout_ms=claimed.timeout_ms,
                        own_deadline=sent + self.ttl_s - self.margin_s, renew_due=sent + self.ttl_s / 2,
                        last_ok=time.monotonic())
            with self.lock:
                self.held[fence.attempt_id] = held
            self._start(held)
        self.claim_due = time.monotonic() if len(result.attempts) == n else (
            time.monotonic() + self.profile.claim_interval_s)

    def _start_pending(self) -> None:
        now = time.monotonic()
        with self.lock:
            pending = [h for h in self.held.values() if h.state == "claimed" and h.stop_reason is None
                       and h.start_retry <= now and not h.previous]
        for held in pending:
            self._start(held)

    def _start(self, held: Held) -> None:
        try:
            res, sent = self.call(lambda db: db.start(held.fence))
        except TransientError:
            held.start_retry = time.monotonic() + 1.0
            return
        if res.answer is not LeaseAnswer.OK:
            # Gone before it started (cancelled while claimed, expired, another generation): never spawned.
            logger.info("attempt {} fenced before start ({})", held.attempt_id, res.reason)
            self._forget(held, "fenced")
            return
        crashpoint("worker.start.after_answer")
        self._lease_ok(held, res, sent)
        if res.intents.cancel_reason is not None:
            self._release(held)  # a cancel before the spawn: nothing runs, the intent ends it
            return
        held.state = "started"
        runner = threading.Thread(target=self._run_attempt, args=(held,), name=f"ql-attempt-{held.attempt_id[-6:]}",
                                  daemon=True)
        runner.start()

    def _release(self, held: Held) -> None:
        """Hand a never-spawned attempt back (its outbox row: ``released``)."""
        held.spec = None
        if self.journal.outbox_direct(held.attempt_id, Payload("released")):
            held.ended = True

    def _forget(self, held: Held, answer: str) -> None:
        self.leases.mark_answered(held.attempt_id, answer)
        with self.lock:
            self.held.pop(held.attempt_id, None)
        self.outbox_next.pop(held.attempt_id, None)

    # -- the runner: spawn and wait (its own thread; never calls the control database) ---------------------
    def _run_attempt(self, held: Held) -> None:
        attempt_id = held.attempt_id
        with self.lock:
            if held.stop_reason is not None or held.intent is not None:
                abandon = True
            else:
                abandon = False
                held.state = "launching"
        if abandon:
            if held.stop_reason is None:
                self._release(held)
            return
        try:
            sealed, held.spec = held.spec, None
            spec, problem = self._open_spec(held.run_id, sealed)
            del sealed
            self.leases.set_state(attempt_id, "launching", expected="claimed")
            if spec is None:
                # Never spawned: the attempt ends lost with a reason that says why (the run fails
                # clearly instead of waiting for a key that may never come).
                logger.error("attempt {}: {}; it is not run", attempt_id, problem)
                reason = "SPEC_INVALID" if problem == "the run's task spec is malformed" else "SPEC_UNREADABLE"
                self.journal.outbox_direct(attempt_id, Payload("lost", reason=reason))
                return
            command, shell, cwd, env = spec
            sub = spawn_claimed(self.node, run_id=held.run_id, attempt_id=attempt_id, log_id=held.log_id,
                                token=held.fence.lease_token, command=command, shell=shell, cwd=cwd, env=env,
                                before_spawn=lambda: crashpoint("worker.launch.before_spawn"))
        except QlError as exc:
            # Nothing runs (spawn failed, handle not saved): the local terminal state is in the outbox.
            logger.warning("attempt {} did not start: {}", attempt_id, exc)
            return
        except Exception as exc:  # noqa: BLE001 - the supervisor settles whatever was created
            logger.error("attempt {} launch failed: {}", attempt_id, type(exc).__name__)
            return
        with self.lock:
            held.sub = sub
            held.state = "spawned"
            stop_now = held.stop_reason is not None
            intent = held.intent
        if stop_now:
            self._signal(held, signal.SIGTERM)
        elif intent is not None:
            self._apply_intent_locally(held, intent)
        self.events.put(("spawned", attempt_id))
        self.wake.set()
        try:
            wait_locally(self.node, sub)
        except Exception as exc:  # noqa: BLE001 - the supervisor settles it from its receipt or identity
            logger.warning("waiting for attempt {} failed: {}", attempt_id, type(exc).__name__)

    def _open_spec(self, run_id: str, sealed: Any) -> tuple[Any, str]:
        """The attempt's task spec, opened in memory: (spec, "") or (None, why — never a spec byte)."""
        from .sealing import SpecUnreadable

        if sealed is None:
            return None, "the control database had no sealed spec for this attempt"
        try:
            opened = self.ring.open(run_id, sealed)
        except SpecUnreadable as exc:
            return None, f"its task spec cannot be opened: {exc}"
        spec = _task_spec(opened)
        del opened
        return (spec, "") if spec is not None else (None, "the run's task spec is malformed")

    # -- lease calls -----------------------------------------------------------------------------------------
    def _lease_ok(self, held: Held, res: Any, sent: float) -> None:
        """An answer that extended (or confirmed) the lease: move the own deadline, learn the intents."""
        now = time.monotonic()
        if res.lease_expires_at_ms is not None and res.db_now_ms is not None:
            # The database's expiry, seen from here: never later than sent + (expiry − db now).
            remaining = (res.lease_expires_at_ms - res.db_now_ms) / 1000
            held.own_deadline = max(held.own_deadline, sent + remaining - self.margin_s)
        held.last_ok = now
        deadline = res.intents.deadline_at_ms
        if deadline is not None and res.db_now_ms is not None:
            held.deadline_mono = now + (deadline - res.db_now_ms) / 1000
        held.renew_due = self._next_renew(held, sent)
        reason = res.intents.cancel_reason
        if reason is not None and held.intent is None:
            held.intent = reason
            with self.lock:
                spawned = held.sub is not None
            if spawned:
                self._apply_intent_locally(held, reason)
        self.guard_wake.set()

    def _next_renew(self, held: Held, sent: float) -> float:
        # Half a lease after this call, but never later than half way to the own deadline: an answer
        # that did not extend the lease (``running`` keeps the claim's expiry) must not push the
        # renewal past the point where the guard fences the attempt itself.
        due = min(sent + self.ttl_s / 2, sent + max(0.0, held.own_deadline - sent) / 2)
        if held.deadline_mono is not None and held.intent is None:
            # Past the deadline the sweeper commits the timeout intent: learn it promptly.
            now = time.monotonic()
            poll = max(0.2, min(1.0, float(self.profile.sweep_interval_s)))
            due = min(due, max(held.deadline_mono + 0.05, now + poll))
        return due

    def _apply_intent_locally(self, held: Held, reason: str) -> None:
        """The control plane's cancel/timeout intent: commit it locally and signal (TERM now, KILL later)."""
        try:
            local_run = held.sub.run_id if held.sub is not None else held.run_id
            self.node.canceller.request(local_run, reason)
            self.node.canceller.dispatch_one(local_run)
        except Exception as exc:  # noqa: BLE001 - the runner's wait loop dispatches again
            logger.warning("intent of attempt {} not dispatched yet: {}", held.attempt_id, type(exc).__name__)

    def _report_running(self, held: Held) -> None:
        sub = held.sub
        if sub is None or held.stop_reason is not None:
            return
        started = self.journal.clock.to_db(sub.started_at_ms, upper=False) or sub.started_at_ms
        crashpoint("worker.running.before_call")
        for _ in range(3):
            try:
                res, sent = self.call(lambda db: db.running(held.fence, started_at_ms=started))
            except TransientError:
                continue
            if res.answer is LeaseAnswer.OK:
                held.state = "running" if not held.ended else held.state
                self._lease_ok(held, res, sent)
            else:
                self._self_fence(held, by_database=True)
            return
        # No answer: the next renewals keep the lease; the completion works from 'starting' too.

    def _renew(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = [h for h in self.held.values() if not h.previous and h.stop_reason is None
                   and h.state != "claimed" and h.renew_due <= now]
        for held in due:
            try:
                res, sent = self.call(lambda db: db.renew(held.fence, ttl_ms=self.ttl_ms))
            except TransientError:
                held.renew_due = time.monotonic() + min(1.0, self.ttl_s / 10)
                continue
            if res.answer is LeaseAnswer.OK:
                self._count("renewed")
                self._lease_ok(held, res, sent)
            else:
                logger.warning("attempt {}: lease fenced ({})", held.attempt_id, res.reason)
                self._self_fence(held, by_database=True)

    # -- fencing ---------------------------------------------------------------------------------------------
    def _self_fence(self, held: Held, *, by_database: bool) -> None:
        """The lease is gone (or may be): stop the task, keep receipt and log, stop claiming."""
        now = time.monotonic()
        with self.lock:
            if held.stop_reason is not None:
                return
            held.stop_reason = FENCED if by_database else SELF_FENCED
            spawned = held.sub is not None or held.state in _PROCESS
            # Our report waits until the database must have expired the lease by its own clock (last
            # extension + TTL + margin): the sweeper decides first. What we then send is true either
            # way — "lost" for a task we stopped ourselves (outbox.build_payload) — so even a renewal
            # that reached the database late, keeping the lease live, cannot turn it into a verdict.
            not_before = now_ms() if by_database else now_ms() + int(
                max(0.0, held.last_ok + self.ttl_s + self.margin_s - now) * 1000)
        self.claim_paused = True
        self._count("self_fenced")
        with contextlib.suppress(Exception):
            self.leases.mark_stopped(held.attempt_id, held.stop_reason,
                                     stopped_at_ms=self._stopped_at_ms(held.attempt_id), not_before_ms=not_before)
        if not spawned and held.state in ("claimed", "started"):
            self._forget(held, "fenced")  # nothing runs and nothing ever will
            return
        if not held.ended:
            self._signal(held, signal.SIGTERM)
            held.kill_due = time.monotonic() + self.kill_grace_s
            self.guard_wake.set()

    def _signal(self, held: Held, signum: int) -> str | None:
        """A verified group signal through the attempt's executor (its durable handle)."""
        attempt = self.node.journal.attempt(held.attempt_id)
        if attempt is None or attempt.handle is None or attempt.status in RUN_TERMINAL:
            return None
        executor = self.node.executor_for(attempt.executor)
        if executor is None:
            return None
        try:
            return str(executor.signal(attempt.handle, signum))
        except OSError:
            return None

    def _guard_loop(self) -> None:
        """Self-fencing by the monotonic clock alone, and KILL after the grace; never the network."""
        while not self.done.is_set():
            now = time.monotonic()
            wait = _IDLE_S
            with self.lock:
                helds = list(self.held.values())
            for held in helds:
                if held.ended:
                    continue
                if held.stop_reason is None and not held.previous and held.state in _LIVE:
                    if now >= held.own_deadline:
                        logger.warning("attempt {}: no lease renewal in time, fencing itself", held.attempt_id)
                        self._self_fence(held, by_database=False)
                    else:
                        wait = min(wait, held.own_deadline - now)
                if held.kill_due is not None:
                    if now >= held.kill_due:
                        held.kill_due = None
                        self._signal(held, signal.SIGKILL)
                    else:
                        wait = min(wait, held.kill_due - now)
            self.guard_wake.wait(max(0.005, wait))
            self.guard_wake.clear()

    # -- the outbox ------------------------------------------------------------------------------------------
    def _on_outbox(self, attempt_id: str) -> None:
        with self.lock:
            held = self.held.get(attempt_id)
            if held is not None:
                held.ended = True
                held.kill_due = None
        self.outbox_next.pop(attempt_id, None)
        self.wake.set()
        if self.shipper is not None:
            self.shipper.wake()  # the attempt ended: finalize its log soon

    def _submit_outbox(self, *, pre_register: bool = False) -> int:
        """Submit due outbox rows with their fences; returns how many got a final answer."""
        answered = 0
        now = time.monotonic()
        wall = now_ms()
        for row in self.leases.by_state("outbox"):
            if self.outbox_next.get(row.attempt_id, 0.0) > now:
                continue
            if row.not_before_ms is not None and wall < row.not_before_ms:
                self.outbox_next[row.attempt_id] = now + (row.not_before_ms - wall) / 1000
                continue
            if pre_register and row.stop_reason == FENCED:
                continue  # submitted under the new registration: certainly answered 'fenced'
            if self._submit(row):
                answered += 1
        return answered

    def _submit(self, row: LeaseRow) -> bool:
        fence = row.fence()
        kind = row.kind
        try:
            if kind == "complete":
                assert row.exit_code is not None and row.finished_at_ms is not None and row.digest is not None
                res, _sent = self.call(lambda db: db.complete(
                    fence, exit_code=row.exit_code, started_at_ms=row.started_at_ms,
                    finished_at_ms=row.finished_at_ms, signalled=bool(row.signalled), completion_digest=row.digest))
                answer, detail = str(res.answer), res.fence_reason or res.status
            else:
                status = EndStatus.RELEASED if kind == "released" else EndStatus.LOST
                res, _sent = self.call(lambda db: db.end_without_completion(
                    fence, status=status, reason=row.reason, signalled=bool(row.signalled)))
                if res.answer is EndAnswer.REFUSED:
                    # 'released' on a lease that did run, or 'lost' on one that never started: the other.
                    self.leases.note_try(row.attempt_id, "lost" if kind == "released" else "released")
                    return False
                answer, detail = str(res.answer), res.fence_reason or res.outcome
        except TransientError:
            tries = row.tries + 1
            self.leases.note_try(row.attempt_id, row=row)
            backoff = min(float(self.profile.outbox_backoff_cap_s), 0.05 * (2 ** min(tries, 20)))
            self.outbox_next[row.attempt_id] = time.monotonic() + backoff
            return False
        crashpoint("worker.outbox.after_submit")
        self.leases.mark_answered(row.attempt_id, answer)
        self.outbox_next.pop(row.attempt_id, None)
        with self.lock:
            self.held.pop(row.attempt_id, None)
        self._count(f"answer_{answer}")
        log = logger.warning if answer == "fenced" else logger.info
        log("attempt {}: {} answered {} ({})", row.attempt_id, kind, answer, detail)
        return True

    def _purge(self) -> None:
        now = time.monotonic()
        if now < self.purge_due:
            return
        self.purge_due = now + 60.0
        with contextlib.suppress(Exception):
            self.leases.purge_answered(now_ms() - int(self.profile.lease_retention_s * 1000))

    # -- restart -------------------------------------------------------------------------------------------
    def _recover_previous(self) -> None:
        """Before registering: settle, release and submit what the previous process left (old fences)."""
        rows = self.leases.unanswered()
        if not rows:
            return
        logger.info("recovering {} attempts of the previous worker process", len(rows))
        old = rows[0]
        with contextlib.suppress(ControlDBError):
            # Measures the database clock (the outbox states its times in it); the old session's
            # heartbeat changes nothing that matters: registering next replaces it.
            self.call(lambda db: db.heartbeat(WorkerFence(old.worker_id, old.worker_generation, old.session),
                                              ttl_ms=int(self.profile.session_lease_s * 1000)))
        # What ended while no worker ran: receipts, process identities (one bounded local pass).
        with contextlib.suppress(Exception):
            Reconciler(self.node).full_pass()
        for row in rows:
            self._recover_row(row)
        self.journal.rebuild_outbox()
        deadline = time.monotonic() + self.ttl_s
        while time.monotonic() < deadline and not self.stop.is_set():
            pending = [r for r in self.leases.by_state("outbox") if r.stop_reason != FENCED]
            if not pending:
                break
            self._submit_outbox(pre_register=True)
            if any(self.outbox_next.get(r.attempt_id, 0) > time.monotonic() for r in pending):
                self.stop.wait(0.2)

    def _recover_row(self, row: LeaseRow) -> None:
        from ql_core.never_started import StartState, start_state

        if row.state == "claimed":
            # Never launched (launching is written before any spawn): back to the queue.
            self.journal.outbox_direct(row.attempt_id, Payload("released"))
            return
        if row.state != "launching":
            return
        attempt = self.node.journal.attempt(row.attempt_id)
        if attempt is None:
            self.journal.outbox_direct(row.attempt_id, Payload("released"))  # crashed before the local create
            return
        if attempt.status == "starting" and attempt.handle is None \
                and start_state(self.node.executor_for, attempt) is StartState.NEVER_STARTED:
            # Its host (the previous worker process) is gone and never committed the handle, so it
            # never released the held task: the command never started (ql_core.never_started).
            self.node.completion.end_without_receipt(attempt.id, status="lost", reason=NEVER_STARTED)

    def _fence_previous(self) -> None:
        """After registering: every attempt of the previous process still running lost its lease."""
        assert self.worker is not None
        for row in self.leases.unanswered():
            if row.state != "launching" or (row.worker_generation, row.session) == (
                    self.worker.generation, self.worker.session):
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
            with self.lock:
                self.held[row.attempt_id] = held
            logger.warning("attempt {} of the previous process still runs without a lease: stopping it",
                           row.attempt_id)
            self._self_fence(held, by_database=True)

    # -- drain -----------------------------------------------------------------------------------------------
    def _drain(self) -> int:
        """Stop claiming; finish (or hand back) what runs, bounded; submit the outbox; deregister."""
        self.draining = True
        logger.info("draining ({}, at most {:g}s)", self.settings.drain, self.settings.drain_timeout_s)
        with self.lock:
            unstarted = [h for h in self.held.values() if h.state in ("claimed", "started") and not h.ended
                         and h.stop_reason is None and not h.previous]
        for held in unstarted:
            with self.lock:
                if held.state not in ("claimed", "started"):
                    continue
                held.stop_reason = DRAINED  # a runner that has not begun will not spawn it
            self._release(held)
        if self.settings.drain == "hand_back" or self.taken_over:
            self._hand_back_all()
        finish_by = time.monotonic() + self.settings.drain_timeout_s
        handed_back = self.settings.drain == "hand_back" or self.taken_over
        hard_stop = finish_by + float(self.profile.cancel_grace_s) + self.call_timeout_s * 2 + 2.0
        announced = False
        while time.monotonic() < hard_stop:
            if not handed_back and time.monotonic() >= finish_by:
                self._hand_back_all()
                handed_back = True
                hard_stop = time.monotonic() + float(self.profile.cancel_grace_s) + self.call_timeout_s * 2 + 2.0
            self._tick(claiming=False)
            if not announced:
                # After the first round's renewals, not before: the announcement is for operators
                # and must never delay a lease renewal past its deadline.
                announced = True
                self._announce_drain()
            with self.lock:
                open_ = [h for h in self.held.values() if not (h.previous and h.ended)]
            if not open_ and not self.leases.by_state("outbox"):
                break
            self.wake.wait(0.1)
            self.wake.clear()
        if self.shipper is not None and self.worker is not None and not self.taken_over:
            # Deregistering ends the session that proves this worker to the artifact store: finalize
            # the logs of ended attempts first (bounded; a later start finishes whatever is left).
            if not self.shipper.flush(min(10.0, max(1.0, self.settings.drain_timeout_s))):
                logger.info("some logs are not finalized yet; the next start of this worker ships them")
        if self.worker is not None and not self.taken_over:
            with contextlib.suppress(ControlDBError):
                self.call(lambda db: db.deregister(self.worker))  # type: ignore[arg-type]
        current = (self.worker.generation, self.worker.session) if self.worker is not None else None
        pending = waiting = 0
        for row in self.leases.unanswered():
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
        if self.worker is None or self.taken_over:
            return
        try:
            answer, _sent = self.call(lambda db: db.drain(self.worker))  # type: ignore[arg-type]
        except ControlDBError as exc:
            hint = (" (run `ql db grant-worker ROLE` again after `ql db upgrade`)" if exc.sqlstate == "42501"
                    else " (the control database is older than this worker: run `ql db upgrade`)"
                    if exc.sqlstate == "42883" else "")
            logger.warning("could not mark this worker draining in the control database ({}){}; draining anyway",
                           exc.kind, hint)
            return
        if answer is LeaseAnswer.FENCED:
            logger.info("the control database answered fenced to draining: another process holds this worker id")

    def _stopped_at_ms(self, attempt_id: str) -> int:
        """When we stop an attempt, on the time base its receipt's finish uses (its committed start +
        the time since on the boot clock, docs/design.md §3), so the outbox's "did the task beat the
        stop?" compares like with like; the wall clock only when the executor cannot measure."""
        attempt = self.node.journal.attempt(attempt_id)
        if attempt is not None and attempt.started_at_ms is not None:
            elapsed = self.node.attempt_elapsed_ms(attempt)
            if elapsed is not None:
                return attempt.started_at_ms + elapsed
        return now_ms()

    def _hand_back_all(self) -> None:
        with self.lock:
            running = [h for h in self.held.values() if not h.ended and h.stop_reason is None and h.sub is not None]
        for held in running:
            with self.lock:
                if held.stop_reason is not None:
                    continue
                held.stop_reason = DRAINED
            with contextlib.suppress(Exception):
                self.leases.mark_stopped(held.attempt_id, DRAINED, stopped_at_ms=self._stopped_at_ms(held.attempt_id),
                                         not_before_ms=None)
            self._signal(held, signal.SIGTERM)
            held.kill_due = time.monotonic() + float(self.profile.cancel_grace_s)
        self.guard_wake.set()

    # -- the queue listener ----------------------------------------------------------------------------------
    def _listen_loop(self) -> None:
        from .pg_connections import conninfo_of

        try:
            import psycopg
        except ImportError:  # pragma: no cover
            return
        delay = 1.0
        while not self.done.is_set():
            try:
                with psycopg.connect(conninfo_of(self.journal.control_url), autocommit=True, connect_timeout=5,
                                     application_name="ql-worker-queue") as conn:
                    conn.execute("LISTEN ql_queue")
                    conn.execute("LISTEN ql_intent")
                    delay = 1.0
                    while not self.done.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            if note.channel == "ql_intent":
                                with self.lock:
                                    held = self.held.get(note.payload)
                                    if held is not None:
                                        held.renew_due = 0.0  # learn the intent from a renew, now
                            else:
                                self.queue_woken = True
                            self.wake.set()
            except Exception:  # noqa: BLE001 - a wake-up only: the control loop polls anyway
                self.done.wait(delay)
                delay = min(delay * 2, 30.0)

