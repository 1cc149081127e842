"""Waiting: the live fast path for the task this process started, and watching any other run.

- :func:`wait` with the :class:`~ql_core.submit.Submission` this process spawned blocks on the
  child (the launcher) through its executor, enforcing the deadline at its exact time and
  dispatching any cancel intent (TERM, KILL after the grace), then completes the attempt from
  what it reaped (:func:`complete_from_wait`) through the same path recovery uses.
- With a run id (a host re-attaching after a restart) or a queued submission it watches the run
  (:func:`watch`): look, settle (:func:`ql_core.reconciler.settle`), sleep, until it is terminal.
- :func:`detach` makes the waiting host step back: the task publishes its receipt itself.

The acknowledged path (``awaited``): the task's receipt is held back while its host lives; the
host commits the status it reaped and then acknowledges, so a host dying at any step never loses
the true status and never commits a second one (docs/launcher.md, "The acknowledged path").
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Callable

from .clock import elapsed_ms_ceil, now_ms
from .completion import CompletionOutcome
from .crashpoints import crashpoint
from .log import logger
from .logs import finalize_own_log, open_empty_log
from .ports.journal import ConflictError, StoreBusyError

# What every awaited task's path uses is imported here, once (a function-level import runs the import
# machinery on each call: ql_core/submit.py says what that costs); recovery's modules (the reconciler)
# stay imported where a wait needs them, which an awaited run that ends normally never does. The
# receipt codec and the consumer are loaded on a wait's first use (cached: one lookup per task, not an
# import), not at import: a reader (ql status) imports this module through ql_core.runtime and must
# not load them (tests/foundation/test_layering.py).

if TYPE_CHECKING:
    from .completion import CompletionResult
    from .consumer import ConsumeOutcome
    from .logs import EmptyLog
    from .node import Node
    from .ports.executor import Executor, ExitObservation
    from .receipts.codec import Receipt
    from .records import RunView
    from .submit import Submission

__all__ = ["wait", "watch", "detach", "complete_from_wait", "INTENT_POLL_S", "FIRST_INTENT_CHECK_S", "BUSY_RETRY_S",
           "REATTACH_POLL_S"]


@functools.cache
def _receipt_type() -> type[Receipt]:
    from .receipts.codec import Receipt

    return Receipt


@functools.cache
def _consume_outcome() -> type[ConsumeOutcome]:
    from .consumer import ConsumeOutcome

    return ConsumeOutcome


#: How often a waiting host re-reads the run for a cancel intent or a due KILL (it blocks in between).
INTENT_POLL_S = 1.0
#: When a waiting host first reads the run for a cancel intent: not at once (most awaited tasks end
#: sooner, and the read is then a store read per task for nothing), but well within
#: :data:`INTENT_POLL_S`. ``ql cancel`` dispatches its TERM itself; the deadline is enforced from
#: memory (and by the launcher) at its exact time whatever this says.
FIRST_INTENT_CHECK_S = 0.05
#: How soon a waiting host retries an intent the run store was too busy to take.
BUSY_RETRY_S = 0.2
#: How often :func:`wait` looks at a run it is not the parent of (re-attached, or queued).
REATTACH_POLL_S = 0.2
#: How long a host that reaped an awaited task too late to place its end waits for the receipt it
#: then lets the task's publisher publish (it stops waiting as soon as the publisher is gone).
RELEASED_RECEIPT_WAIT_S = 10.0


def wait(node: Node, sub: Submission | str, *, on_tick: Callable[[], None] | None = None,
         tick_s: float = INTENT_POLL_S) -> RunView:
    """Block until the run ends and return its final view (``Runtime.wait`` documents it)."""
    if isinstance(sub, str) or sub.task is None:
        return watch(node, sub if isinstance(sub, str) else sub.run_id, on_tick=on_tick)
    assert sub.executor is not None and sub.attempt_id is not None and sub.log_artifact_id is not None
    executor = node.executor_for(sub.executor)
    assert executor is not None
    try:
        observed = _wait_live(node, sub, executor, on_tick=on_tick, tick_s=tick_s)
    except BaseException:
        detach(node, sub)  # we stop waiting: the task publishes its own receipt
        raise
    if on_tick is not None:
        on_tick()
    # Only where this host commits the end itself (the acknowledged path): there an APPLIED result
    # is our own terminal commit, the one that carried the offered size.
    empty = _offer_empty_log(node, sub) if observed.held_receipt and observed.exit_code is not None else None
    try:
        try:
            result = complete_from_wait(node, sub, observed)
        finally:
            if empty is not None:
                node.journal.withdraw_log_size(sub.attempt_id)  # type: ignore[attr-defined]
        # The view our own terminal commit left (no read of the run); any other ending: read it.
        view = result.view if result is not None and result.view is not None else node.view(sub.run_id)
        if not view.terminal:
            # Our child (the launcher) is gone but the run is not over: its command runs on in its
            # process group, or its end is still being proven. Watch it like a re-attached host.
            view = watch(node, sub.run_id, on_tick=on_tick)
        if empty is not None and result is not None and result.outcome is CompletionOutcome.APPLIED:
            # Our terminal commit recorded the size (0): the file may go now, if it is still empty.
            drop, empty = empty, None
            if _drop_empty(drop) is not None:
                return view
        _finalize_log(node, sub.log_artifact_id)
    finally:
        if empty is not None:
            empty.close()
    return view


def detach(node: Node, sub: Submission) -> None:
    """Stop being the waiting host of ``sub``: its task publishes its receipt when it ends, and
    recovery (a supervisor, ``ql reconcile``) completes it. Idempotent."""
    if sub.task is not None and sub.awaited and sub.executor is not None:
        executor = node.executor_for(sub.executor)
        if executor is not None:
            executor.acknowledge(sub.task, committed=False)
    sub.awaited = False


def _remaining_s(sub: Submission) -> float | None:
    """Seconds until ``sub``'s deadline (None: it has none), on the boot clock from its committed
    start (a wall clock stepped while it runs moves nothing); the wall clock when the start has no
    boot-clock time."""
    if sub.deadline_at_ms is None:
        return None
    timeout_ms = sub.deadline_at_ms - sub.started_at_ms
    if sub.started_boot_ms is not None:
        elapsed = elapsed_ms_ceil(sub.started_boot_ms)
        if elapsed is not None:
            return (timeout_ms - elapsed) / 1000
    return (sub.deadline_at_ms - now_ms()) / 1000


def _wait_live(node: Node, sub: Submission, executor: Executor, *, on_tick: Callable[[], None] | None,
               tick_s: float) -> ExitObservation:
    """Block on our child until it exits, enforcing the deadline and dispatching intents.

    A run store that stays busy (another process holds the write lock past the retries) does not
    end the wait: the intent or its dispatch is tried again after a short pause — the task is
    still ours to watch, and recovery enforces the persisted deadline as well."""
    assert sub.task is not None
    intent = False
    first = True  # the run was created a moment ago: its first look for an intent can wait a little
    while True:
        node.check_data_dir()
        if on_tick is not None:
            on_tick()
        busy = False
        try:
            if not intent and not first:
                run = node.journal.run(sub.run_id)
                intent = run is not None and run.cancel_reason is not None
            # In-memory timer: a fast path only; the launcher and recovery enforce the persisted
            # deadline too. Without a deadline (or with an intent) the rule has nothing to do, so the
            # canceller is not even built: a run without --timeout never imports ql_core.cancellation.
            if (sub.deadline_at_ms is not None and not intent
                    and node.canceller.enforce_deadline(sub.run_id, has_deadline=True, has_intent=False,
                                                        remaining_s=_remaining_s(sub)) is not None):
                intent = True
            if intent:
                node.canceller.dispatch_one(sub.run_id)
        except (StoreBusyError, ConflictError) as exc:
            busy = True
            logger.warning("run {}: the run store is busy ({}); the deadline and intents are retried",
                           sub.run_id, type(exc).__name__)
        timeout = BUSY_RETRY_S if busy else min(tick_s, FIRST_INTENT_CHECK_S) if first else tick_s
        first = False
        remaining = _remaining_s(sub)
        if not intent and not busy and remaining is not None:
            timeout = min(timeout, max(0.0, remaining))
        observed = executor.wait(sub.task, timeout)
        if observed is not None:
            return observed


def watch(node: Node, run_id: str, *, on_tick: Callable[[], None] | None = None) -> RunView:
    """Wait for a run this process is not the parent of: look, settle, sleep, until it is terminal.

    A run store that is busy or away for a while (a control database restarting, a dropped
    connection) does not end the wait: the look is tried again (one warning per outage)."""
    from .reconciler import settle

    away = False
    while True:
        node.check_data_dir()
        if on_tick is not None:
            on_tick()
        try:
            view = node.view(run_id)
            if not view.terminal:
                try:
                    settle(node, view)
                except (StoreBusyError, ConflictError) as exc:  # another writer holds the store: next time
                    logger.warning("run {}: the run store is busy ({}); retrying", run_id, type(exc).__name__)
                view = node.view(run_id)
        except StoreBusyError as exc:
            if not away:
                logger.warning("run {}: the run store is busy or unreachable ({}); still waiting", run_id,
                               type(exc).__name__)
            away = True
            time.sleep(REATTACH_POLL_S)
            continue
        away = False
        if view.terminal:
            if on_tick is not None:
                on_tick()
            return view
        time.sleep(REATTACH_POLL_S)


def complete_from_wait(node: Node, sub: Submission, observed: ExitObservation) -> CompletionResult | None:
    """End the attempt from what this host saw when it reaped the task.

    The status the host reaped is kernel truth: the receipt is applied only when it agrees; one
    that disagrees (forged by a same-user task) is quarantined and an ``attempt.receipt_rejected``
    audit event records it (the consumer does, on every path) before the observed outcome is
    committed. Without a receipt (publication failed), the observation alone decides.
    """
    assert sub.attempt_id is not None
    seen = _host_observed(sub, observed)
    if observed.held_receipt and seen is not None:
        return _complete_held(node, sub, seen)
    # Imported past the held-receipt return (the usual path of an awaited run): that path never
    # needs recovery (issue 25 item 3: a one-shot ``ql run`` pays ~0.7 ms importing the reconciler).
    from .ports.journal import EventSpec
    from .reconciler import recover_attempt

    assert node.consumer is not None
    consumed = node.consumer.consume(sub.attempt_id, observed_exit_code=observed.exit_code)
    if consumed.outcome in (_consume_outcome().APPLIED, _consume_outcome().ALREADY_TERMINAL):
        return None
    if seen is None:
        # The executor cannot vouch for the task's status (its launcher died, or lost the
        # status): say so in an event, then recovery decides — the command may run on (the
        # waiter keeps watching it), and without a receipt it ends lost, or in the intent's
        # state when our dispatcher signalled it — never a guess.
        if observed.detail:
            node.completion.note(sub.attempt_id, EventSpec("attempt.observation_lost", attempt_id=sub.attempt_id,
                                                           reason=observed.detail[:80]))
        recover_attempt(node, sub.attempt_id)
        return None
    result = node.completion.complete(seen, executor=sub.executor)
    if consumed.outcome in (_consume_outcome().MISSING, _consume_outcome().UNUSABLE):
        # No receipt will ever come (the launcher is gone): the row rides out with the next create
        # commit or retention — no extra commit here.
        node.journal.note_consumed(sub.attempt_id)
    return result


def _host_observed(sub: Submission, observed: ExitObservation) -> Receipt | None:
    """What the host reaped, as the receipt the completion takes (built once, for both paths);
    None when the executor has no status to vouch for."""
    if observed.exit_code is None:
        return None
    assert sub.attempt_id is not None
    return _receipt_type()(schema_version=1, run_id=sub.run_id, attempt_id=sub.attempt_id,
                   callback_sequence=sub.callback_sequence, token=sub.token, started_at_ms=sub.started_at_ms,
                   finished_at_ms=max(observed.finished_at_ms, sub.started_at_ms), exit_code=observed.exit_code)


def _complete_held(node: Node, sub: Submission, seen: Receipt) -> CompletionResult | None:
    """Acknowledged completion: commit the status the host reaped, then tell the task's
    publisher it has nothing to publish. Any failure before the acknowledgement leaves the
    receipt to the publisher (and the run to the receipt path): the host dying at any step
    never loses the true status and never commits a second one.

    A receipt already in the slot is looked at first (one failed lstat when there is none, the
    usual case): the publisher's own, published because this host was too slow to answer
    (stopped, say) and agreeing with what we reaped, completes the run as any receipt; any
    other is a forgery, quarantined with an ``attempt.receipt_rejected`` event, and what we
    reaped is committed."""
    assert sub.task is not None and sub.executor is not None and sub.attempt_id is not None
    assert node.consumer is not None
    executor = node.executor_for(sub.executor)
    assert executor is not None
    crashpoint("wait.after_exit")
    # A missing receipt, an unusable slot or a failed read all lead on to our own commit below: a
    # store that can tell "surely nothing there" in one look (ports.receipt_store.SurelyAbsent)
    # spares the checked read for them.
    absent = getattr(node.receipts, "surely_absent", None)
    if absent is None or not absent(sub.attempt_id):
        consumed = node.consumer.consume(sub.attempt_id, observed_exit_code=seen.exit_code)
        if consumed.outcome in (_consume_outcome().APPLIED, _consume_outcome().ALREADY_TERMINAL):
            executor.acknowledge(sub.task, committed=True)  # its publisher published already
            sub.awaited = False
            return None
    bound = True  # our finish time is an upper bound: the transaction defers to an intent it may miss
    while True:
        try:
            result = node.completion.complete(seen, executor=sub.executor, bound=bound)
        except (StoreBusyError, ConflictError) as exc:
            # The store stayed busy: the task publishes its receipt, and the caller watches the run
            # end from it (wait() falls back to watching a run that is not terminal yet).
            executor.acknowledge(sub.task, committed=False)
            sub.awaited = False
            logger.warning("run {}: the run store is busy ({}); completing from the task's receipt",
                           sub.run_id, type(exc).__name__)
            return None
        except BaseException:
            executor.acknowledge(sub.task, committed=False)
            sub.awaited = False
            raise
        if result.outcome is not CompletionOutcome.DEFERRED:
            break
        # Our finish time only says "it ended before we reaped it". Reaped late (this host was
        # stopped, or waiting for another run), that bound lies past a deadline or a cancel the
        # task may have beaten. The publisher holds the launcher's own finish time: let it
        # publish, and apply that receipt (checked against what we reaped).
        executor.acknowledge(sub.task, committed=False)
        sub.awaited = False
        if _consume_released(node, sub, executor, seen.exit_code):
            return None
        bound = False  # no receipt came (its publisher is gone): what we reaped decides, on our bound
    crashpoint("wait.before_ack")
    executor.acknowledge(sub.task, committed=True)
    sub.awaited = False
    crashpoint("wait.after_ack")
    # No receipt will ever come: the journal row rides out with the next create commit or
    # retention — no extra commit here.
    node.journal.note_consumed(sub.attempt_id)
    return result


def _consume_released(node: Node, sub: Submission, executor: Executor, exit_code: int) -> bool:
    """After an awaited task's publisher was told "no ok": apply the receipt it publishes (one that
    disagrees with ``exit_code`` is quarantined), waiting while it is still there to publish (its
    launcher's group still has a member), at most :data:`RELEASED_RECEIPT_WAIT_S`. True when the run
    has ended from a receipt."""
    from .ports.executor import IdentityState

    assert sub.task is not None and sub.attempt_id is not None and node.consumer is not None
    end = time.monotonic() + RELEASED_RECEIPT_WAIT_S
    while True:
        publishing = executor.inspect(sub.task.handle) is IdentityState.RUNNING
        consumed = node.consumer.consume(sub.attempt_id, observed_exit_code=exit_code)
        if consumed.outcome in (_consume_outcome().APPLIED, _consume_outcome().ALREADY_TERMINAL):
            return True
        if not publishing or time.monotonic() >= end:
            return False
        time.sleep(0.01)


def _offer_empty_log(node: Node, sub: Submission) -> EmptyLog | None:
    """The reaped task's log, held open, when it is empty and the run store records that size in the
    terminal commit (``ports.journal.TerminalLogSize``; offered here): the usual awaited task then
    needs no commit of its own for its log, nor a read of it. None: :func:`_finalize_log` does it
    after the terminal commit, as for a store without the capability."""
    offer = getattr(node.journal, "offer_log_size", None)
    if offer is None:
        return None
    assert sub.attempt_id is not None and sub.log_artifact_id is not None
    try:
        empty = open_empty_log(node.config.data_dir, sub.log_artifact_id, created_here=True)
    except Exception:  # noqa: BLE001 - an unsafe or unreadable log: _finalize_log reports it
        return None
    if empty is not None:
        offer(sub.attempt_id, sub.log_artifact_id, 0)
    return empty


def _drop_empty(empty: EmptyLog) -> bool | None:
    """:meth:`EmptyLog.drop`, best effort: None when the log must be sized again (it grew since it
    was found empty, or the drop failed)."""
    try:
        return empty.drop()
    except Exception:  # noqa: BLE001 - kept: _finalize_log looks at it again
        return None


def _finalize_log(node: Node, log_artifact_id: str) -> None:
    """After the fast path's terminal commit: cut the log to its quota (best effort: the next
    round, or a follower, does it otherwise)."""
    try:
        finalize_own_log(node, log_artifact_id)
    except Exception as exc:  # noqa: BLE001
        logger.warning("wait: finalize_log failed: {}", type(exc).__name__)
