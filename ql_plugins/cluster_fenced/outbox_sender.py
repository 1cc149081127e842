"""Submitting the outbox: every local terminal transition of a claimed attempt, with its fence.

Each row (:class:`~.worker_store.WorkerJournal` writes it) is submitted with the attempt's fence
until a final answer (``applied``, ``already_completed``, ``already_terminal``, ``fenced``; anything
else is retried with capped backoff), and only then marked answered. Runs on the control loop.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Callable

from ql_core.clock import now_ms
from ql_core.crashpoints import crashpoint
from ql_core.log import logger

from .control_db import WORKER_BATCH, Completion, ControlDB, ControlDBError, TransientError
from .outbox import FENCED
from .results import EndAnswer, EndStatus
from .ship_table import ShipTable

if TYPE_CHECKING:
    from .control_session import ControlSession
    from .held_attempts import HeldAttempts
    from .log_shipper import LogShipper
    from .results import CompletionResult, LeaseFence
    from .ship_table import ShipRow
    from .worker_tables import LeaseRow

__all__ = ["OutboxSender"]


class OutboxSender:
    """Submits due outbox rows and purges old answered ones."""

    def __init__(self, held: HeldAttempts, session: ControlSession) -> None:
        self.held = held
        self.leases = held.leases
        self.session = session
        self.shipper: LogShipper | None = None
        #: Monotonic: the next purge of answered rows.
        self.purge_due = 0.0
        #: Called before due completions are sent (the worker sets the fence guard's
        #: ``report_spawned``): see :meth:`submit_due`.
        self.before_complete: Callable[[], None] | None = None

    def on_outbox(self, attempt_id: str) -> None:
        """An attempt went into the outbox (any thread): it ended locally; submit it soon."""
        with self.held.lock:
            held = self.held.get(attempt_id)
            if held is not None:
                held.ended = True
                held.kill_due = None
        self.held.outbox_next.pop(attempt_id, None)
        self.session.wake.set()
        if self.shipper is not None:
            self.shipper.wake()  # the attempt ended: finalize its log soon

    def submit_due(self, *, pre_register: bool = False) -> int:
        """Submit due outbox rows with their fences; returns how many got a final answer."""
        answered, completions = self.take_due(pre_register=pre_register)
        if completions and self.before_complete is not None:
            # A runner queues its attempt's "spawned" before the terminal commit that writes its
            # outbox row, so every spawn behind these rows is queued by now — but maybe after this
            # round's running reports were taken (a task that ended during that call). Reported
            # first, or the completion (accepted from 'starting' too) would leave the run without
            # its attempt.spawned event at the control plane.
            self.before_complete()
        return answered + self.submit_completions(completions)

    def take_due(self, *, pre_register: bool = False) -> tuple[int, list[LeaseRow]]:
        """Submit the due rows that are not completions (each alone); returns how many of those got
        a final answer, and the due completions (left to the caller: they go in one statement)."""
        answered = 0
        now = time.monotonic()
        wall = now_ms()
        retry = self.held.outbox_next
        completions = []
        for row in self.leases.by_state("outbox"):
            if retry.get(row.attempt_id, 0.0) > now:
                continue
            if row.not_before_ms is not None and wall < row.not_before_ms:
                retry[row.attempt_id] = now + (row.not_before_ms - wall) / 1000
                continue
            if pre_register and row.stop_reason == FENCED:
                continue  # submitted under the new registration: certainly answered 'fenced'
            if row.kind == "complete":
                completions.append(row)  # together, by the caller
            elif self._submit(row):
                answered += 1
        return answered, completions

    def submit_completions(self, completions: list[LeaseRow]) -> int:
        """These completions, a batch per transaction (with the empty, final logs among them: one
        look for the round); returns how many got a final answer."""
        if not completions:
            return 0
        empty = self.empty_logs(completions)
        if len(completions) == 1 and not empty:
            return int(self._submit(completions[0]))
        answered = 0
        for i in range(0, len(completions), WORKER_BATCH):
            answered += self._submit_completions(completions[i:i + WORKER_BATCH], empty)
        return answered

    @staticmethod
    def completion_calls(rows: list[LeaseRow]) -> list[tuple[LeaseFence, Completion]]:
        """Each row's completion call (fence and payload)."""
        calls = []
        for row in rows:
            assert row.exit_code is not None and row.finished_at_ms is not None and row.digest is not None
            calls.append((row.fence(), Completion(row.exit_code, row.started_at_ms, row.finished_at_ms,
                                                  bool(row.signalled), row.digest)))
        return calls

    def _submit_completions(self, rows: list[LeaseRow], empty: dict[str, ShipRow] | None = None) -> int:
        """Many completions in one transaction (each fenced on its own); one by one when the batch
        fails for good, so one row never holds the others' completions back."""
        calls = self.completion_calls(rows)
        empty = empty or {}
        proofs = [fence for (fence, _c), row in zip(calls, rows) if row.attempt_id in empty]
        carried: list[tuple[str, str | None]] | None = None
        try:
            if proofs:
                assert self.shipper is not None
                max_bytes = self.shipper.max_bytes

                def call(db: ControlDB) -> list[CompletionResult]:
                    nonlocal carried
                    results, carried = db.complete_many_with_empty_logs(calls, proofs, max_bytes=max_bytes)
                    return results

                results, _sent = self.session.call(call)
            else:
                results, _sent = self.session.call(lambda db: db.complete_many(calls))
        except TransientError:
            self.retry_later(rows)
            return 0
        except ControlDBError:
            return self.submit_each(rows)
        self.completions_answered(rows, results, empty, carried)
        return len(rows)

    def retry_later(self, rows: list[LeaseRow]) -> None:
        """No answer (it may or may not have committed): each row again after its backoff."""
        for row in rows:
            self._retry_later(row)

    def submit_each(self, rows: list[LeaseRow]) -> int:
        """The batch failed for good: each row alone, so one row never holds the others back."""
        answered = 0
        for row in rows:
            try:
                answered += int(self._submit(row))
            except ControlDBError as exc:  # this row only: the others' completions go on
                logger.error("attempt {}: completion not accepted ({}); retried later", row.attempt_id, exc)
                self._retry_later(row)
        return answered

    def completions_answered(self, rows: list[LeaseRow], results: list[CompletionResult],
                             empty: dict[str, ShipRow], carried: list[tuple[str, str | None]] | None) -> None:
        """The answers to these completions (``carried``: to the empty logs sent with them, in
        ``rows`` order, None when they were not sent): recorded, and the attempts no longer held."""
        crashpoint("worker.outbox.after_submit")
        ship_rows = [empty[row.attempt_id] for row in rows if row.attempt_id in empty]
        also = None
        if ship_rows and self.shipper is not None:
            answers = [answer for answer, _reason in (carried or [("", None)] * len(ship_rows))]
            acked = self.shipper.carried(list(zip(ship_rows, answers)))
            if acked:
                # The empty logs' rows go 'final' in the commit of these answers: a crash leaves
                # both undone (sent again: 'already_finalized') or both done.
                also = lambda c: ShipTable.finalized_in(c, acked)  # noqa: E731
        self.leases.mark_answered_many([(row.attempt_id, str(res.answer)) for row, res in zip(rows, results)],
                                       also=also)
        for row, res in zip(rows, results):
            self._answered(row, str(res.answer), res.fence_reason or res.status)

    def empty_logs(self, rows: list[LeaseRow]) -> dict[str, ShipRow]:
        """The attempts among these completions whose empty, final log goes with the completion
        (:meth:`.log_shipper.LogShipper.empty_final_logs`); none without a shipper, or when the
        control database has no ``ql_artifact_empty_many`` (revision 0016)."""
        if self.shipper is None:
            return {}
        try:
            if not self.session.db().carries_empty_logs:
                return {}
            return self.shipper.empty_final_logs([row.attempt_id for row in rows])
        except Exception as exc:  # noqa: BLE001 - the local table: the shipper ships them as before
            logger.warning("empty logs not sent with their completions ({})", type(exc).__name__)
            return {}

    def _retry_later(self, row: LeaseRow) -> None:
        tries = row.tries + 1
        self.leases.note_try(row.attempt_id, row=row)
        backoff = min(float(self.session.profile.outbox_backoff_cap_s), 0.05 * (2 ** min(tries, 20)))
        self.held.outbox_next[row.attempt_id] = time.monotonic() + backoff

    def _answered(self, row: LeaseRow, answer: str, detail: str | None) -> None:
        """A final answer, recorded: the attempt is no longer held."""
        self.held.outbox_next.pop(row.attempt_id, None)
        self.held.drop(row.attempt_id)
        self.session.count(f"answer_{answer}")
        log = logger.warning if answer == "fenced" else logger.info
        log("attempt {}: {} answered {} ({})", row.attempt_id, row.kind, answer, detail)

    def _submit(self, row: LeaseRow) -> bool:
        fence = row.fence()
        kind = row.kind
        call = self.session.call
        try:
            if kind == "complete":
                assert row.exit_code is not None and row.finished_at_ms is not None and row.digest is not None
                res, _sent = call(lambda db: db.complete(
                    fence, exit_code=row.exit_code, started_at_ms=row.started_at_ms,
                    finished_at_ms=row.finished_at_ms, signalled=bool(row.signalled), completion_digest=row.digest))
                answer, detail = str(res.answer), res.fence_reason or res.status
            else:
                status = EndStatus.RELEASED if kind == "released" else EndStatus.LOST
                res, _sent = call(lambda db: db.end_without_completion(
                    fence, status=status, reason=row.reason, signalled=bool(row.signalled)))
                if res.answer is EndAnswer.REFUSED:
                    # 'released' on a lease that did run, or 'lost' on one that never started: the other.
                    self.leases.note_try(row.attempt_id, "lost" if kind == "released" else "released")
                    return False
                answer, detail = str(res.answer), res.fence_reason or res.outcome
        except TransientError:
            self._retry_later(row)
            return False
        crashpoint("worker.outbox.after_submit")
        self.leases.mark_answered(row.attempt_id, answer)
        self._answered(row, answer, detail)
        return True

    def purge(self) -> None:
        """Once a minute: drop answered rows older than ``lease_retention_s``."""
        now = time.monotonic()
        if now < self.purge_due:
            return
        self.purge_due = now + 60.0
        with contextlib.suppress(Exception):
            self.leases.purge_answered(now_ms() - int(self.session.profile.lease_retention_s * 1000))
