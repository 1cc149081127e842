"""Lease renewal and the fence: how a held attempt keeps its lease, and how it is stopped without one.

- :meth:`FenceGuard.renew` runs on the lease keeper (:mod:`.lease_keeper`: its own thread and
  connection), :meth:`~FenceGuard.report_running` on the control loop; each answer that extends the
  lease (:meth:`~FenceGuard.lease_ok`) moves the attempt's own deadline and its next renewal
  (:func:`renew_due_at`, keeping two measured lease-call latencies of headroom), and brings the
  control plane's cancel/timeout intent;
- :meth:`FenceGuard.run` is the **fence guard** thread: it never touches the network. Past an
  attempt's own lease deadline on the monotonic clock (renew *sent* + TTL − ``fence_margin_s``,
  always before the database can expire the lease) it fences the attempt itself: stops its process
  group (verified identity: TERM, KILL after half the margin), keeps receipt and log, records
  ``SELF_FENCED`` locally, stops claiming.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from ql_core.clock import now_ms
from ql_core.crashpoints import crashpoint
from ql_core.log import logger
from ql_core.states import RUN_TERMINAL

from .control_db import WORKER_BATCH, ControlDBError, TransientError
from .held_attempts import LIVE, PROCESS
from .outbox import FENCED, SELF_FENCED
from .results import LeaseAnswer

if TYPE_CHECKING:
    from collections.abc import Collection

    from ql_core.node import Node

    from .control_session import ControlSession
    from .held_attempts import Held, HeldAttempts
    from .results import LeaseFence
    from .worker_tables import WorkerLeases

__all__ = ["FenceGuard", "renew_due_at", "IDLE_S", "RUNNING_REPORT_WITHIN_S"]

#: How long a worker thread sleeps at most between looks (it is woken earlier by every event).
IDLE_S = 0.5
#: How long an attempt's ``running`` report may wait for a round with other calls (its completion,
#: a start): the run shows ``starting`` and its timeout starts that much later, at most.
RUNNING_REPORT_WITHIN_S = 0.05


def renew_due_at(sent: float, own_deadline: float, ttl_s: float) -> float:
    """When to renew after a lease call sent at ``sent`` (monotonic): half a lease after it, but
    never later than half way to the own deadline — an answer that did not extend the lease
    (``running`` keeps the claim's expiry) must not push the renewal past the point where the guard
    fences the attempt itself."""
    return min(sent + ttl_s / 2, sent + max(0.0, own_deadline - sent) / 2)


class FenceGuard:
    """Renews the held attempts' leases and stops the attempts that lost (or may have lost) theirs."""

    def __init__(self, node: Node, held: HeldAttempts, session: ControlSession) -> None:
        self.node = node
        self.held = held
        self.session = session
        #: Wakes the guard thread (a deadline moved, a kill is due).
        self.wake = threading.Event()
        #: Wakes the lease keeper (a renewal is due now: an intent was notified, a lease was granted).
        self.renew_wake = threading.Event()
        #: (attempt id, monotonic time of its spawn), the running reports still to be made.
        self._spawned: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
        #: Monotonic: when the oldest spawn not yet taken for a report was queued (None: none).
        self.spawned_since: float | None = None

    @property
    def leases(self) -> WorkerLeases:
        return self.held.leases

    # -- lease answers (the control loop) ----------------------------------------------------------------
    def lease_ok(self, held: Held, res: Any, sent: float) -> None:
        """An answer that extended (or confirmed) the lease: move the own deadline, learn the intents."""
        now = time.monotonic()
        reason = res.intents.cancel_reason
        with self.held.lock:  # the lease keeper and the control loop (``running``) both answer here
            if res.lease_expires_at_ms is not None and res.db_now_ms is not None:
                # The database's expiry, seen from here: never later than sent + (expiry − db now).
                remaining = (res.lease_expires_at_ms - res.db_now_ms) / 1000
                held.own_deadline = max(held.own_deadline, sent + remaining - self.session.margin_s)
            held.last_ok = max(held.last_ok, now)
            deadline = res.intents.deadline_at_ms
            if deadline is not None and res.db_now_ms is not None:
                held.deadline_mono = now + (deadline - res.db_now_ms) / 1000
            held.renew_due = self.next_renew(held, sent)
            fresh_intent = reason is not None and held.intent is None
            if fresh_intent:
                held.intent = reason
            spawned = held.sub is not None
        if fresh_intent and spawned:
            self.apply_intent(held, reason)  # type: ignore[arg-type]
        self.wake.set()
        self.renew_wake.set()

    def renewals_due(self) -> list[float]:
        """When each held attempt's next renewal is due (monotonic), for the lease keeper's sleep."""
        return [h.renew_due for h in self.held.select(self._renewable)]

    @staticmethod
    def _renewable(held: Held) -> bool:
        return not held.previous and held.stop_reason is None and held.state != "claimed"

    def next_renew(self, held: Held, sent: float) -> float:
        """The next renewal after a lease answer to a call sent at ``sent``: :func:`renew_due_at`,
        but at least two of the slowest measured lease calls before the own deadline (a slow
        machine renews earlier rather than late), and never sooner than a tenth of a lease after
        the call (at most 1 s), so a slow database is not asked in a loop."""
        due = renew_due_at(sent, held.own_deadline, self.session.ttl_s)
        headroom = 2 * self.session.lease_latency_max_s()
        due = max(min(due, held.own_deadline - headroom), sent + min(1.0, self.session.ttl_s / 10))
        if held.deadline_mono is not None and held.intent is None:
            # Past the deadline the sweeper commits the timeout intent: learn it promptly.
            now = time.monotonic()
            poll = max(0.2, min(1.0, float(self.session.profile.sweep_interval_s)))
            due = min(due, max(held.deadline_mono + 0.05, now + poll))
        return due

    def apply_intent(self, held: Held, reason: str) -> None:
        """The control plane's cancel/timeout intent: commit it locally and signal (TERM now, KILL later)."""
        try:
            local_run = held.sub.run_id if held.sub is not None else held.run_id
            self.node.canceller.request(local_run, reason)
            self.node.canceller.dispatch_one(local_run)
        except Exception as exc:  # noqa: BLE001 - the runner's wait loop dispatches again
            logger.warning("intent of attempt {} not dispatched yet: {}", held.attempt_id, type(exc).__name__)

    def spawned(self, attempt_id: str) -> None:
        """From a runner thread: the attempt's handle is stored locally; the control loop reports it
        with its next round, at the latest :data:`RUNNING_REPORT_WITHIN_S` later
        (:meth:`.control_loop.ControlLoop.sleep`) — not at once: a short task's completion comes
        within that time, and the report goes in the same statement (one transaction, not two)."""
        now = time.monotonic()
        self._spawned.put((attempt_id, now))
        if self.spawned_since is None:
            self.spawned_since = now

    def take_spawned(self, *, ending: Collection[str] | None = None) -> list[Held]:
        """The attempts spawned since the last look whose ``running`` report is still to be made.

        ``ending``: the attempts whose completion goes with this round, carrying its spawn (revision
        0017). Any other attempt spawned less than :data:`RUNNING_REPORT_WITHIN_S` ago stays queued:
        a short task's completion comes within that time and carries its spawn — no ``running`` call
        at all — and the loop wakes for the report of one that runs on when that time is up."""
        spawned = []
        young: list[tuple[str, float]] = []
        self.spawned_since = None  # before the queue is read: a spawn queued meanwhile sets it again
        now = time.monotonic()
        while True:
            try:
                attempt_id, at = self._spawned.get_nowait()
            except queue.Empty:
                break
            held = self.held.get(attempt_id)
            if held is None or held.sub is None or held.stop_reason is not None:
                continue
            if ending is not None and attempt_id not in ending and now - at < RUNNING_REPORT_WITHIN_S:
                young.append((attempt_id, at))
            else:
                spawned.append(held)
        for item in young:
            self._spawned.put(item)
        if young:
            first = min(at for _a, at in young)
            since = self.spawned_since
            self.spawned_since = first if since is None else min(since, first)
        return spawned

    def report_later(self, spawned: list[Held]) -> None:
        """No answer to these reports: made again with a later round (the loop looks at least every
        :data:`IDLE_S`; no wake-up here, so a database that does not answer is not asked in a loop;
        the renewals keep the leases meanwhile, and a completion works from 'starting' too)."""
        for held in spawned:
            self._spawned.put((held.attempt_id, 0.0))

    def running_calls(self, spawned: list[Held]) -> list[tuple[LeaseFence, int]]:
        """Each spawned attempt's ``running`` call (fence, process start on the database's clock)."""
        return [(held.fence, self.spawned_at(held)) for held in spawned]

    def report_spawned(self) -> None:
        """On the control loop: tell the control plane each attempt spawned since the last round
        (all of them in one transaction)."""
        self.report_running_many(self.take_spawned())

    def report_running_many(self, spawned: list[Held]) -> None:
        """``running`` for these attempts, a batch per transaction (one by one when a batch fails for good)."""
        if len(spawned) == 1:
            self.report_running(spawned[0])
            return
        for i in range(0, len(spawned), WORKER_BATCH):
            chunk = spawned[i:i + WORKER_BATCH]
            calls = self.running_calls(chunk)
            crashpoint("worker.running.before_call")
            for _ in range(3):
                try:
                    results, sent = self.session.call(lambda db: db.running_many(calls))
                except TransientError:
                    continue
                except ControlDBError:
                    for held in chunk:
                        self.report_running(held)
                    break
                for held, res in zip(chunk, results):
                    self.running_answer(held, res, sent)
                break
            # No answer: the next renewals keep the leases; the completion works from 'starting' too.

    def spawned_at(self, held: Held) -> int:
        """The attempt's process start on the database's clock (what its ``running`` report carries)."""
        sub = held.sub
        assert sub is not None
        return self.session.clock.to_db(sub.started_at_ms, upper=False) or sub.started_at_ms

    def running_answer(self, held: Held, res: Any, sent: float) -> None:
        if res.answer is LeaseAnswer.OK:
            held.state = "running" if not held.ended else held.state
            self.lease_ok(held, res, sent)
        else:
            self.self_fence(held, by_database=True)

    def report_running(self, held: Held) -> None:
        sub = held.sub
        if sub is None or held.stop_reason is not None:
            return
        started = self.spawned_at(held)
        crashpoint("worker.running.before_call")
        for _ in range(3):
            try:
                res, sent = self.session.call(lambda db: db.running(held.fence, started_at_ms=started))
            except TransientError:
                continue
            self.running_answer(held, res, sent)
            return
        # No answer: the next renewals keep the lease; the completion works from 'starting' too.

    def renew(self) -> None:
        """Renew every lease whose renewal is due (the lease keeper's thread and connection; several
        in one transaction)."""
        now = time.monotonic()
        due = self.held.select(lambda h: self._renewable(h) and h.renew_due <= now)
        if len(due) > 1:
            for i in range(0, len(due), WORKER_BATCH):
                chunk = due[i:i + WORKER_BATCH]
                try:
                    results, sent = self.session.lease_call(
                        lambda db: db.renew_many([h.fence for h in chunk], ttl_ms=self.session.ttl_ms))
                except TransientError:
                    for held in chunk:
                        held.renew_due = time.monotonic() + min(1.0, self.session.ttl_s / 10)
                    continue
                except ControlDBError:
                    self._renew_each(chunk)
                    continue
                for held, res in zip(chunk, results):
                    self._renew_answer(held, res, sent)
            return
        self._renew_each(due)

    def _renew_each(self, due: list[Held]) -> None:
        for held in due:
            try:
                res, sent = self.session.lease_call(lambda db: db.renew(held.fence, ttl_ms=self.session.ttl_ms))
            except TransientError:
                held.renew_due = time.monotonic() + min(1.0, self.session.ttl_s / 10)
                continue
            self._renew_answer(held, res, sent)

    def _renew_answer(self, held: Held, res: Any, sent: float) -> None:
        if res.answer is LeaseAnswer.OK:
            self.session.count("renewed")
            self.lease_ok(held, res, sent)
        else:
            logger.warning("attempt {}: lease fenced ({})", held.attempt_id, res.reason)
            self.self_fence(held, by_database=True)

    # -- fencing -------------------------------------------------------------------------------------------
    def self_fence(self, held: Held, *, by_database: bool) -> None:
        """The lease is gone (or may be): stop the task, keep receipt and log, stop claiming."""
        now = time.monotonic()
        with self.held.lock:
            if held.stop_reason is not None:
                return
            held.stop_reason = FENCED if by_database else SELF_FENCED
            spawned = held.sub is not None or held.state in PROCESS
            # Our report waits until the database must have expired the lease by its own clock (last
            # extension + TTL + margin): the sweeper decides first. What we then send is true either
            # way — "lost" for a task we stopped ourselves (outbox.build_payload) — so even a renewal
            # that reached the database late, keeping the lease live, cannot turn it into a verdict.
            not_before = now_ms() if by_database else now_ms() + int(
                max(0.0, held.last_ok + self.session.ttl_s + self.session.margin_s - now) * 1000)
        self.session.claim_paused = True
        self.session.count("self_fenced")
        with contextlib.suppress(Exception):
            self.leases.mark_stopped(held.attempt_id, held.stop_reason,
                                     stopped_at_ms=self.stopped_at_ms(held.attempt_id), not_before_ms=not_before)
        if not spawned and held.state in ("claimed", "started"):
            self.held.forget(held, "fenced")  # nothing runs and nothing ever will
            return
        if not held.ended:
            self.signal(held, signal.SIGTERM)
            held.kill_due = time.monotonic() + self.session.kill_grace_s
            self.wake.set()

    def stop(self, held: Held, reason: str, *, grace_s: float) -> None:
        """Stop a running attempt for ``reason`` (TERM now, KILL after ``grace_s``), its stop recorded."""
        with contextlib.suppress(Exception):
            self.leases.mark_stopped(held.attempt_id, reason, stopped_at_ms=self.stopped_at_ms(held.attempt_id),
                                     not_before_ms=None)
        self.signal(held, signal.SIGTERM)
        held.kill_due = time.monotonic() + grace_s

    def stopped_at_ms(self, attempt_id: str) -> int:
        """When we stop an attempt, on the time base its receipt's finish uses (its committed start +
        the time since on the boot clock, docs/design.md §3), so the outbox's "did the task beat the
        stop?" compares like with like; the wall clock only when the executor cannot measure."""
        attempt = self.node.journal.attempt(attempt_id)
        if attempt is not None and attempt.started_at_ms is not None:
            elapsed = self.node.attempt_elapsed_ms(attempt)
            if elapsed is not None:
                return attempt.started_at_ms + elapsed
        return now_ms()

    def signal(self, held: Held, signum: int) -> str | None:
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

    # -- the guard thread ----------------------------------------------------------------------------------
    def run(self) -> None:
        """Self-fencing by the monotonic clock alone, and KILL after the grace; never the network."""
        while not self.session.done.is_set():
            now = time.monotonic()
            wait = IDLE_S
            for held in self.held.select():
                if held.ended:
                    continue
                if held.stop_reason is None and not held.previous and held.state in LIVE:
                    if now >= held.own_deadline:
                        logger.warning("attempt {}: no lease renewal in time, fencing itself", held.attempt_id)
                        self.self_fence(held, by_database=False)
                    else:
                        wait = min(wait, held.own_deadline - now)
                if held.kill_due is not None:
                    if now >= held.kill_due:
                        held.kill_due = None
                        self.signal(held, signal.SIGKILL)
                    else:
                        wait = min(wait, held.kill_due - now)
            self.wake.wait(max(0.005, wait))
            self.wake.clear()
