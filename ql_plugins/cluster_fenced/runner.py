"""Claims and starts, and the **runner** thread of each attempt.

The claim and the ``start`` call run on the control loop — for the free slots, and while the
worker's tasks are short for ``claim_ahead`` runs more, each of which waits in its runner thread for
a slot (:meth:`Runner.run_attempt`; docs/cluster.md, "Claiming ahead"). Then one runner thread per attempt (a
thread kept from an earlier attempt when one is idle: :mod:`.runner_threads`) mirrors the attempt into the local store (that create commit also moves its lease row to
``launching``, and records a standby launcher's handle when the executor keeps one: then no
handle commit follows) and spawns it through the node's own two steps (``ql_core.submit.create`` with the
claim's ids, then ``start``: log artifact, receipt location, executor, durable handle), then blocks in ``ql_core.wait.wait`` — the local live path,
which also dispatches the local cancel intents (TERM, KILL after the grace) — until the attempt ends
locally. A runner never calls the control database.

The runner always waits for what it spawned, so its attempts take the acknowledged path
(``awaited``, docs/launcher.md): the launcher publishes no receipt while the worker lives — the
runner commits the status the kernel reports (the local terminal commit, with the outbox row) and
then tells the task's publisher it has nothing to publish. That is three fsyncs, a receipt file and
its read-back fewer per task; a worker that dies (or a runner that stops waiting: ``detach``) at any
step before the acknowledgement leaves the receipt to the task, replayed on restart as before.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ql_core.crashpoints import crashpoint
from ql_core.errors import QlError
from ql_core.log import logger
from ql_core.wait import detach as detach_locally
from ql_core.wait import wait as wait_locally

from .control_db import WORKER_BATCH, ControlDBError, TransientError
from .held_attempts import Held
from .outbox import Payload
from .results import LeaseAnswer
from .runner_threads import RunnerThreads

if TYPE_CHECKING:
    from ql_core.node import Node
    from ql_core.submit import Submission

    from .control_session import ControlSession
    from .fence_guard import FenceGuard
    from .held_attempts import HeldAttempts
    from .log_shipper import LogShipper
    from .worker_ports import WorkerStore

__all__ = ["Runner", "spawn_claimed", "task_spec", "CLAIM_GATHER_S", "CLAIMED_AHEAD_EXPIRED", "SLOT_LOOK_S"]

#: How long a busy worker (fewer than half its slots free) waits for more slots to free before it
#: claims: a refill of one slot at a time costs a claim, a local commit and a start per run.
CLAIM_GATHER_S = 0.005
#: The in-memory stop reason of a run claimed ahead that found no free slot in time: its runner
#: hands it back (``released``) and never spawns it.
CLAIMED_AHEAD_EXPIRED = "CLAIMED_AHEAD_EXPIRED"
#: How often a run claimed ahead, waiting for a slot, looks whether it was stopped or cancelled.
SLOT_LOOK_S = 0.05


def spawn_claimed(node: Node, *, run_id: str, attempt_id: str, log_id: str, token: str,
                  command: tuple[str, ...], shell: bool, cwd: str | None, env: dict[str, str] | None,
                  before_spawn: Callable[[], None] | None = None, awaited: bool = False) -> Submission:
    """Mirror a claimed attempt into the local store (same ids, the lease token as callback token)
    and spawn it through the node's own path (:func:`ql_core.submit.create`, then
    :func:`~ql_core.submit.start`: log, receipt location, executor, handle). The returned
    submission's ``run_id`` is the *local* run id (see below). ``awaited``: the caller will
    ``wait`` for it (or ``detach`` it) — the acknowledged path (module docstring).

    As ``Runtime.submit`` does, it takes a standby launcher when the executor keeps one
    (:func:`ql_core.submit.take_standby`): its handle goes into the create commit, which is then the only
    commit before the task starts (no handle commit), and the launcher was started off this path.
    A SIGKILL between that commit and the hand-over ends the attempt ``lost`` on restart (the idle
    standby exits unrun, but nothing proves it); the classic path would have released it."""
    from ql_core.ids import new_id
    from ql_core.submit import RunIds, create, start, take_standby

    if node.journal.run(run_id) is not None:
        # A later attempt of a run this worker ran before (retried here): the local store holds one
        # current attempt per run, so this attempt gets a local run of its own. The control plane
        # never sees the local run id (every fenced call names the attempt).
        run_id = new_id()
    # No local deadline: the control plane's lease and the worker's own timers bound the attempt.
    executor, _receipts = node.runner()
    # The submit path's own helper (None: no standby here — the classic path, unchanged).
    standby = take_standby(node, executor, command, shell=shell, cwd=cwd, env=env, awaited=awaited)
    sub = create(node, ids=RunIds(run_id, attempt_id, log_id, token), standby=standby)
    sub.awaited = awaited
    if before_spawn is not None:
        before_spawn()
    return start(node, sub, command, shell=shell, cwd=cwd, env=env, standby=standby)


def task_spec(spec: Any) -> tuple[tuple[str, ...], bool, str | None, dict[str, str] | None] | None:
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
    env_add = spec.get("env_add")
    for mapping in (env, env_add):
        if mapping is not None and not (isinstance(mapping, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())):
            return None
    if env_add:  # `ql run --env`: added to the task's environment here (its own, else this worker's)
        env = {**(env or os.environ), **env_add}
    return tuple(command), shell, cwd, (dict(env) if env else None)


class Runner:
    """Claims attempts up to the free slots, starts them, and runs each in its own thread."""

    def __init__(self, node: Node, store: WorkerStore, session: ControlSession, guard: FenceGuard) -> None:
        self.node = node
        self.store = store
        self.session = session
        self.guard = guard
        #: The attempts this worker holds (the guard's).
        self.held: HeldAttempts = guard.held
        #: The spec key ring (sealing.SpecKeyRing), read when the worker starts.
        self.ring: Any = None
        self.shipper: LogShipper | None = None
        self.claim_due = 0.0
        #: Monotonic: since when a claim waits for more slots to free (None: it does not).
        self.gather_since: float | None = None
        #: A queue notification arrived: claim now, not at ``claim_due``.
        self.queue_woken = False
        #: The runner threads, each kept for the next attempt (its local-store connection with it).
        self.threads = RunnerThreads(self.run_attempt)
        #: One per slot: a runner takes one before it spawns and gives it back once its attempt has
        #: ended locally. A run claimed ahead waits here for the next free slot.
        self.free_slots = threading.BoundedSemaphore(session.settings.slots)
        #: Whether this worker claims ahead now (``claim_ahead``): after a task that ran shorter
        #: than ``claim_ahead_wait_s``, until a run claimed ahead waited that long for a slot. So
        #: a worker whose tasks are long claims for its free slots only, and never sits on queued
        #: runs that another worker could start.
        self.claiming_ahead = False

    # -- claim and start (the control loop) ------------------------------------------------------------
    def capacity(self) -> int:
        """How many attempts this worker holds at most now: its slots, plus ``claim_ahead`` while
        its tasks are short (:attr:`claiming_ahead`) — but not while a task of the previous process
        still runs (it is being stopped): it holds no slot, so a run claimed ahead would find its
        slot free and run beside it, one process more than the slots."""
        ahead = int(self.session.profile.claim_ahead) if self.claiming_ahead else 0
        if ahead and self.held.select(lambda h: h.previous and not h.ended):
            ahead = 0
        return self.session.settings.slots + ahead

    def may_claim(self) -> bool:
        s = self.session
        return (s.worker is not None and not s.draining and not s.claim_paused and not s.taken_over
                and not s.stop.is_set() and self.held.live_processes() < self.capacity())

    def claim(self) -> None:
        """Claim up to the free slots (plus ``claim_ahead`` while tasks are short: :meth:`capacity`)
        and record the claims locally; their ``start`` goes with the round's other reports
        (:meth:`pending_starts`, :mod:`.round_report`)."""
        if not self.may_claim():
            return
        now = time.monotonic()
        if now < self.claim_due and not self.queue_woken:
            return
        slots = self.capacity()
        free = slots - self.held.live_processes()
        if free < (slots + 1) // 2:
            # Busy, and few slots free: wait a moment for more to free, so one claim (its
            # transaction, local commit and start) serves several runs, not one run each.
            if self.gather_since is None:
                self.gather_since = now
            if now < self.gather_since + CLAIM_GATHER_S:
                self.claim_due = self.gather_since + CLAIM_GATHER_S
                return
        self.gather_since = None
        self.queue_woken = False
        from ql_core.ids import new_id

        profile = self.session.profile
        n = min(free, int(profile.claim_batch))
        worker = self.session.worker
        assert worker is not None
        ids = [new_id() for _ in range(n)]
        logs = [new_id() for _ in range(n)]
        executor = self.node.config.executor
        ttl_ms, ttl_s, margin_s = self.session.ttl_ms, self.session.ttl_s, self.session.margin_s
        try:
            result, sent = self.session.call(lambda db: db.claim(worker, max_n=n, free_slots=free, executor=executor,
                                                                 attempt_ids=ids, log_ids=logs, lease_ttl_ms=ttl_ms))
        except TransientError:
            # Never replayed: claims whose answer was lost stay 'claimed' and the sweeper requeues them.
            self.claim_due = time.monotonic() + 1.0
            return
        crashpoint("worker.claim.after_answer")
        if result.answer is LeaseAnswer.FENCED:
            logger.warning("claim fenced (session lapsed or taken over): claiming paused until a heartbeat answers")
            self.session.claim_paused = True
            self.session.heartbeat_due = 0.0
            return
        if not result.attempts:
            self.claim_due = time.monotonic() + profile.claim_interval_s
            return
        fences = [(a.fence(worker), a.run_id) for a in result.attempts]
        log_of = dict(zip(ids, logs))  # the control plane keeps the log id this worker chose
        shipper = self.shipper
        also = None
        if shipper is not None:
            # Tracked for log shipping in the same commit as the lease rows (before anything spawns:
            # every byte of these logs is shipped) — one commit per claim, not two, and unsynced
            # (WorkerLeases.insert_claimed: each attempt's fsync'd create commit carries it). A
            # SIGKILL before it leaves neither (never started: the sweeper requeues the claims);
            # after it, both.
            ship_rows = [(f.attempt_id, run_id, log_of[f.attempt_id], f.lease_generation, f.lease_token)
                         for f, run_id in fences]
            also = lambda c: shipper.table.track_in(c, ship_rows)  # noqa: E731
        try:
            self.store.leases.insert_claimed(fences, also=also)
        except Exception as exc:  # noqa: BLE001 - not recorded: never started; the sweeper requeues them
            logger.error("claimed {} attempts but could not record them locally ({}); they are not started",
                         len(fences), type(exc).__name__)
            self.claim_due = time.monotonic() + 1.0
            return
        # The shipper is not woken here: nothing of these attempts is spawned yet, so its round would
        # find no local attempt to open a log for (its next round, at the latest ship_interval_s
        # later or when an attempt ends, does).
        self.session.count("claimed", len(result.attempts))
        for claimed, (fence, _run_id) in zip(result.attempts, fences):
            held = Held(fence=fence, run_id=claimed.run_id, log_id=log_of[claimed.attempt_id], spec=claimed.sealed_spec,
                        timeout_ms=claimed.timeout_ms,
                        own_deadline=sent + ttl_s - margin_s, renew_due=sent + ttl_s / 2,
                        last_ok=time.monotonic())
            self.held.add(held)
        self.claim_due = time.monotonic() if len(result.attempts) == n else (
            time.monotonic() + profile.claim_interval_s)

    def pending_starts(self) -> list[Held]:
        """The claimed attempts whose ``start`` is due: just claimed, or their earlier call got no
        answer (then again a second later)."""
        now = time.monotonic()
        return self.held.select(lambda h: h.state == "claimed" and h.stop_reason is None
                                and h.start_retry <= now and not h.previous)

    def start_many(self, helds: list[Held]) -> None:
        """``start`` for a whole claim in one transaction (each still fenced on its own); one by one
        when the batch fails for good, so one bad call never holds the others back."""
        if len(helds) == 1:
            self.start(helds[0])
            return
        for i in range(0, len(helds), WORKER_BATCH):
            chunk = helds[i:i + WORKER_BATCH]
            try:
                results, sent = self.session.call(lambda db: db.start_many([h.fence for h in chunk]))
            except TransientError:
                for held in chunk:
                    held.start_retry = time.monotonic() + 1.0
                continue
            except ControlDBError:
                for held in chunk:
                    self.start(held)
                continue
            for held, res in zip(chunk, results):
                self.started(held, res, sent)

    def start(self, held: Held) -> None:
        try:
            res, sent = self.session.call(lambda db: db.start(held.fence))
        except TransientError:
            held.start_retry = time.monotonic() + 1.0
            return
        self.started(held, res, sent)

    def started(self, held: Held, res: Any, sent: float) -> None:
        """The control plane's answer to ``start``: spawn (a runner thread), hand back, or forget."""
        if res.answer is not LeaseAnswer.OK:
            # Gone before it started (cancelled while claimed, expired, another generation): never spawned.
            logger.info("attempt {} fenced before start ({})", held.attempt_id, res.reason)
            self.held.forget(held, "fenced")
            return
        crashpoint("worker.start.after_answer")
        self.guard.lease_ok(held, res, sent)
        if res.intents.cancel_reason is not None:
            self.release(held)  # a cancel before the spawn: nothing runs, the intent ends it
            return
        held.state = "started"
        self.threads.run(held)

    def release(self, held: Held) -> None:
        """Hand a never-spawned attempt back (its outbox row: ``released``)."""
        held.spec = None
        if self.store.outbox_direct(held.attempt_id, Payload("released")):
            held.ended = True

    # -- the runner: spawn and wait (its own thread; never calls the control database) ---------------------
    def run_attempt(self, held: Held) -> None:
        """Take a slot (a run claimed ahead waits for one), then spawn the attempt and wait for it."""
        slot = self._take_slot(held)
        if slot is None:
            return  # handed back: it waited too long for a slot
        try:
            ran_s = self._run_attempt(held)  # without a slot: stopped or cancelled while it waited, never spawned
            if ran_s is not None and ran_s < float(self.session.profile.claim_ahead_wait_s):
                self.claiming_ahead = True  # a short task: claim ahead (again)
        finally:
            if slot:
                self.free_slots.release()

    def _take_slot(self, held: Held) -> bool | None:
        """True: a slot is ours. False: no slot, the attempt was stopped or cancelled while it waited
        (:meth:`_run_attempt` then abandons it). None: no slot within ``claim_ahead_wait_s``; the
        attempt is handed back to the queue (``released``: no retry used) and this worker stops
        claiming ahead until a task of its own runs shorter than that."""
        profile = self.session.profile
        # Without claim_ahead a slot is only waited for while the runner before gives it back (its
        # attempt has ended; it finishes the log): no bound, nothing to hand back.
        give_up = time.monotonic() + float(profile.claim_ahead_wait_s) if int(profile.claim_ahead) > 0 else None
        while True:
            if self.free_slots.acquire(timeout=SLOT_LOOK_S):  # at once when one is free
                return True
            if held.stop_reason is not None or held.intent is not None:
                return False
            if give_up is not None and time.monotonic() >= give_up:
                break
        self.claiming_ahead = False
        with self.held.lock:
            if held.stop_reason is not None or held.intent is not None or held.state != "started":
                return False
            held.stop_reason = CLAIMED_AHEAD_EXPIRED  # nothing else spawns it (drain, guard: stopped)
        logger.info("attempt {} found no free slot within {:g}s: handed back to the queue", held.attempt_id,
                    float(profile.claim_ahead_wait_s))
        self.release(held)
        return None

    def _run_attempt(self, held: Held) -> float | None:
        """Spawn the attempt and wait for it; the seconds from its hand-over to its local end (None:
        not spawned)."""
        attempt_id = held.attempt_id
        with self.held.lock:
            if held.stop_reason is not None or held.intent is not None:
                abandon = True
            else:
                abandon = False
                held.state = "launching"
        if abandon:
            if held.stop_reason is None:
                self.release(held)
            return
        try:
            sealed, held.spec = held.spec, None
            spec, problem = self._open_spec(held.run_id, sealed)
            del sealed
            # ``launching`` is written in the local create commit (.worker_local), not before it: a
            # SIGKILL before that commit leaves the row ``claimed`` and no local run, which the
            # restart releases exactly as it released ``launching`` without a local run.
            if spec is None:
                # Never spawned: the attempt ends lost with a reason that says why (the run fails
                # clearly instead of waiting for a key that may never come).
                logger.error("attempt {}: {}; it is not run", attempt_id, problem)
                reason = "SPEC_INVALID" if problem == "the run's task spec is malformed" else "SPEC_UNREADABLE"
                self.store.outbox_direct(attempt_id, Payload("lost", reason=reason))
                return
            command, shell, cwd, env = spec
            sub = spawn_claimed(self.node, run_id=held.run_id, attempt_id=attempt_id, log_id=held.log_id,
                                token=held.fence.lease_token, command=command, shell=shell, cwd=cwd, env=env,
                                before_spawn=lambda: crashpoint("worker.launch.before_spawn"), awaited=True)
        except QlError as exc:
            # Nothing runs (spawn failed, handle not saved): the local terminal state is in the outbox.
            logger.warning("attempt {} did not start: {}", attempt_id, exc)
            return
        except Exception as exc:  # noqa: BLE001 - the supervisor settles whatever was created
            logger.error("attempt {} launch failed: {}", attempt_id, type(exc).__name__)
            return
        try:
            with self.held.lock:
                held.sub = sub
                held.state = "spawned"
                stop_now = held.stop_reason is not None
                intent = held.intent
            if stop_now:
                self.guard.signal(held, signal.SIGTERM)
            elif intent is not None:
                self.guard.apply_intent(held, intent)
            self.guard.spawned(attempt_id)
        except BaseException:
            detach_locally(self.node, sub)  # no wait follows: the task publishes its receipt itself
            raise
        began = time.monotonic()
        try:
            wait_locally(self.node, sub)  # detaches itself when it stops waiting on an error
        except Exception as exc:  # noqa: BLE001 - the supervisor settles it from its receipt or identity
            logger.warning("waiting for attempt {} failed: {}", attempt_id, type(exc).__name__)
        return time.monotonic() - began

    def _open_spec(self, run_id: str, sealed: Any) -> tuple[Any, str]:
        """The attempt's task spec, opened in memory: (spec, "") or (None, why — never a spec byte)."""
        from .sealing import SpecUnreadable

        if sealed is None:
            return None, "the control database had no sealed spec for this attempt"
        try:
            opened = self.ring.open(run_id, sealed)
        except SpecUnreadable as exc:
            return None, f"its task spec cannot be opened: {exc}"
        spec = task_spec(opened)
        del opened
        return (spec, "") if spec is not None else (None, "the run's task spec is malformed")
