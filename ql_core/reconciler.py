"""The reconciler: after any crash, find every attempt's true end in bounded rounds (ADR-0007 §2.6).

One round, in this fixed order, every step capped by the profile
(``page_size × pages_per_round`` items per step):

1. passed deadlines → commit ``run.cancel_requested(reason=timeout)`` (before any signal);
2. due cancellation dispatch records → lease, verify, TERM/KILL;
3. this node's active attempts, paged from the *database* with a stable
   cursor (``id > cursor ORDER BY id``; never a walk of the receipt directory):
   a receipt → the consumer (judged first: one whose launcher still runs beside
   its live host is deferred to the next round, one that contradicts the status
   an unreaped launcher's zombie shows is quarantined with an audit event);
   no receipt → the durable identity:
   running → keep; exited → wait the publish grace once, look again, still
   missing → ``lost`` (``RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT``), or the
   intent's state when a committed cancel/timeout was dispatched (TERM sent);
   unverifiable → ``blocked`` (never a signal). A ``starting`` attempt without
   a handle is left alone while its host lives; once its host is gone it
   provably never started (:mod:`ql_core.never_started`: tasks are held until
   their handle is committed) → ``lost`` (``RECOVERY_NEVER_STARTED``); when the
   host's identity cannot be read, after the spawn grace → ``blocked``
   (``RECOVERY_NO_DURABLE_HANDLE``: nothing proves anything either way).
   Missing journal rows of active attempts are back-registered;
4. the journal, paged the same way: receipts of attempts that already ended
   are replayed (``already_terminal``, then cleaned), blocked attempts get
   their late receipts, and retention purges terminal rows whose receipt is
   gone and quarantined files, after the profile's windows;
5. log artifacts (:class:`ql_core.log_retention.LogKeeper`): quota of running logs,
   sizes of ended logs a crash left unsized, retention of ended ones by age
   and total size only — consuming a receipt never deletes a log (the logs of
   attempts a round ends are sized right after they end, in step 3);
6. history: terminal runs past ``history_retention_s`` or beyond the newest
   ``history_max_runs`` are forgotten, a page at a time (their log files
   first, then their rows in one transaction per page) — never a run that is
   not terminal, never one whose receipt may still exist (it still has a
   journal row).

Steps 5 and 6 page until the round's ``retention_budget_ms`` (wall clock) is
spent; a round that stopped with work left reports ``retention_more`` and the
supervisor runs the next one after a pause of the same length. Every statement
of a round is served by an index or a partial index of active rows
(docs/recovery.md "Cost of a round"): an idle round costs the same on an empty
and on a million-run history.

A page that does not move the cursor forward stops the round with
:class:`CursorStuckError` (fail closed) instead of looping. A failure while
settling one attempt is counted (``errors``) and the round goes on with the
next: one poisoned row never starves the others.

:meth:`Reconciler.full_pass` runs rounds until *each* cursor has wrapped once
since the pass began (a phase that wrapped is not repeated), so a pass over
``A`` active attempts and ``J`` journal rows takes
``max(A, J) / (page_size × pages_per_round) + 1`` rounds.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from .clock import now_ms
from .consumer import DEFER, ConsumeOutcome, ConsumeResult
from .log import logger
from .never_started import NEVER_STARTED_REASON, StartState, start_state
from .outcome import LOST_REASON
from .ports.executor import IdentityState
from .states import ATTEMPT_ACTIVE, RUN_TERMINAL
from .tokens import same_hash

if TYPE_CHECKING:
    from .receipts.codec import Receipt
    from .node import Node
    from .records import AttemptRecord, JournalEntry, RunView

__all__ = ["Reconciler", "RoundReport", "CursorStuckError", "REPORT_KEYS", "SPAWN_GRACE_MS", "settle",
           "recover_attempt"]

#: A ``starting`` attempt without a handle whose host cannot be identified is left this long before it
#: is ``blocked`` (nothing proves anything about it; it is never ended by a timer).
SPAWN_GRACE_MS = 30_000
#: Counters every report carries (``ql reconcile`` prints them even when zero).
REPORT_KEYS = ("applied", "already_terminal", "quarantined", "still_running", "lost", "blocked",
               "timed_out", "cancelled")
_NEVER_STARTED = "never_started"


class CursorStuckError(RuntimeError):
    """A page did not advance the cursor: stop rather than loop (fail closed)."""


@dataclass
class RoundReport:
    counts: Counter[str] = field(default_factory=Counter)
    attempts_touched: int = 0
    journal_touched: int = 0
    #: The attempt cursor after the round ("" = the pass wrapped around).
    attempt_cursor: str = ""
    journal_cursor: str = ""

    def merge(self, other: RoundReport) -> None:
        self.counts.update(other.counts)
        self.attempts_touched += other.attempts_touched
        self.journal_touched += other.journal_touched

    def as_dict(self) -> dict[str, int]:
        return {key: self.counts.get(key, 0) for key in REPORT_KEYS} | {
            k: v for k, v in sorted(self.counts.items()) if k not in REPORT_KEYS}


def settle(node: Node, view: RunView) -> None:
    """Try to end a non-terminal run shown to a reader: its passed deadline becomes a timeout intent
    (and its signals are dispatched), and this node's attempt is settled from its receipt or its
    process identity — what a round would do for it, bounded to this one run."""
    if view.terminal or node.consumer is None or view.current_attempt is None:
        return
    node.canceller.enforce_deadline(view.run_id, has_deadline=view.deadline_at_ms is not None,
                                    has_intent=view.cancel_reason is not None)
    if view.cancel_reason is not None or view.deadline_at_ms is not None:
        node.canceller.dispatch_one(view.run_id)
    recover_attempt(node, view.current_attempt.attempt_id)


def recover_attempt(node: Node, attempt_id: str) -> dict[str, int]:
    """Settle one attempt now (receipt, else identity) — what a round does, for one; its counts."""
    return Reconciler(node).check_attempt(attempt_id).as_dict()


class Reconciler:
    """Bounded recovery rounds for one node. Stateless apart from its two cursors."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.profile = node.profile
        self.attempt_cursor = ""
        self.journal_cursor = ""
        #: How long a ``starting`` attempt without a handle is left to its host (ms).
        self.spawn_grace_ms = SPAWN_GRACE_MS
        self._log_keeper = _log_keeper(node)

    @property
    def limit(self) -> int:
        """Hard cap of the items one step of one round may touch."""
        return self.profile.page_size * self.profile.pages_per_round

    # -- one round -------------------------------------------------------------------
    def round(self, *, attempts: bool = True, journal: bool = True) -> RoundReport:
        """One bounded round. ``attempts``/``journal`` False skip that paged step (used by a pass)."""
        return self._round(attempts=attempts, journal=journal)

    def _round(self, *, attempts: bool, journal: bool) -> RoundReport:
        report = RoundReport()
        self._deadlines(report, self.limit)
        for outcome, n in self.node.canceller.dispatch_due(self.limit).items():
            report.counts[f"dispatch_{outcome}"] += n
        if self.node.consumer is not None:
            if attempts:
                self._active_attempts(report)
            if journal:
                self._journal(report)
            # Retention shares one wall-clock budget per round (profile retention_budget_ms).
            deadline = time.monotonic() + self.profile.retention_budget_ms / 1000
            self._logs(report, deadline)
            self._history(report, deadline)
        report.attempt_cursor, report.journal_cursor = self.attempt_cursor, self.journal_cursor
        return report

    def full_pass(self, *, max_rounds: int = 100_000) -> tuple[RoundReport, int]:
        """Rounds until each cursor wrapped once (every attempt and journal row seen); bounded."""
        total = RoundReport()
        self.attempt_cursor = self.journal_cursor = ""
        attempts_left = journal_left = True
        rounds = 0
        for rounds in range(1, max_rounds + 1):
            one = self.round(attempts=attempts_left, journal=journal_left)
            total.merge(one)
            attempts_left = attempts_left and self.attempt_cursor != ""
            journal_left = journal_left and self.journal_cursor != ""
            if not attempts_left and not journal_left:
                break
        total.attempt_cursor, total.journal_cursor = self.attempt_cursor, self.journal_cursor
        return total, rounds

    # -- step 1: deadlines ---------------------------------------------------------
    def _deadlines(self, report: RoundReport, limit: int) -> None:
        # The store's wall clock picks candidates; a duration decides (Canceller.deadline_passed): a
        # submitter whose clock was behind does not make a task time out early here. (One whose
        # clock was ahead is not a candidate yet: its launcher enforces its deadline itself.)
        for run_id in self.node.journal.due_deadlines(self.node.node_id, now_ms(), limit):
            try:
                if str(self.node.canceller.enforce_deadline(run_id)) == "requested":
                    report.counts["timeouts_requested"] += 1
            except Exception as exc:  # noqa: BLE001 - the next round retries this deadline
                report.counts["errors"] += 1
                logger.warning("timeout intent of run {} deferred: {}", run_id, type(exc).__name__)

    # -- paging ------------------------------------------------------------------------
    def _fetch_attempts(self, cursor: str, limit: int) -> list[AttemptRecord]:
        """One page of this node's active attempts with id > ``cursor``, in id order."""
        return self.node.journal.page_active_attempts(self.node.node_id, cursor, limit)

    def _fetch_journal(self, cursor: str, limit: int) -> list[JournalEntry]:
        """One page of journal rows with attempt_id > ``cursor``, with their attempts' status and owner."""
        return self.node.journal.page_journal(cursor, limit)

    def _pages(self, fetch: Any, cursor_attr: str) -> Iterator[Any]:
        """Yield rows page by page (at most ``pages_per_round`` pages), moving the named cursor.

        The cursor wraps to "" when a page comes back short (the end was reached).
        """
        page_size, pages = self.profile.page_size, self.profile.pages_per_round
        for _ in range(pages):
            cursor = getattr(self, cursor_attr)
            rows = fetch(cursor, page_size)
            if not rows:
                setattr(self, cursor_attr, "")
                return
            if len(rows) > page_size:
                raise CursorStuckError(f"{cursor_attr}: a page returned {len(rows)} rows, cap {page_size}")
            last = _key(rows[-1])
            if last <= cursor or any(_key(a) >= _key(b) for a, b in zip(rows, rows[1:])):
                # Not strictly past the cursor, or not strictly ordered: paging would loop or skip.
                raise CursorStuckError(f"{cursor_attr} did not advance past {cursor!r}")
            setattr(self, cursor_attr, last if len(rows) == page_size else "")
            yield rows
            if len(rows) < page_size:
                return

    # -- step 3: active attempts -----------------------------------------------------
    def _active_attempts(self, report: RoundReport) -> None:
        for page in self._pages(self._fetch_attempts, "attempt_cursor"):
            report.attempts_touched += len(page)
            self._settle(page, report)

    def check_attempt(self, attempt_id: str) -> RoundReport:
        """The same recovery steps for one attempt (a follower uses this when no supervisor runs)."""
        report = RoundReport()
        attempt = self.node.journal.attempt(attempt_id)
        if attempt is None or attempt.runtime_owner != self.node.node_id or self.node.consumer is None:
            return report
        if attempt.status in ATTEMPT_ACTIVE:
            report.attempts_touched = 1
            self._settle([attempt], report)
        elif attempt.status == "blocked":
            self._consume(attempt.id, report)
        return report

    def _settle(self, attempts: list[AttemptRecord], report: RoundReport) -> None:
        waiting: set[str] = set()  # seen running/starting: no log to size (the rest may have ended)
        try:
            self._settle_page(attempts, report, waiting)
        finally:
            self._size_ended_logs([a for a in attempts if a.id not in waiting], report)

    def _size_ended_logs(self, attempts: list[AttemptRecord], report: RoundReport) -> None:
        """Right after this process ended attempts: cut their logs to quota and record their sizes in one
        transaction (docs/logs.md "Size at the end"); still-active ones are left alone."""
        if self._log_keeper is None or not attempts:
            return
        from .logs import finalize_logs

        try:
            report.counts.update(finalize_logs(self.node, [a.log_artifact_id for a in attempts]))
        except Exception as exc:  # noqa: BLE001 - the sizing queue (ix_ql_log_unsized) retries them
            report.counts["log_errors"] += 1
            logger.warning("log sizes deferred: {}", type(exc).__name__)

    def _settle_page(self, attempts: list[AttemptRecord], report: RoundReport, waiting: set[str]) -> None:
        self._ensure_journal(attempts, report)
        exited: list[AttemptRecord] = []
        # Every receipt of the page first, applied in one transaction (one durable commit per page).
        by_id = {a.id: a for a in attempts}

        def judge(receipt: Receipt) -> int | str | None:
            return self._judge(by_id[receipt.attempt_id], receipt)

        settled = self._consume_page([a.id for a in attempts], report, judge=judge)
        for attempt in attempts:
            try:
                if attempt.id in settled:
                    continue
                state = self._identity(attempt)
                if state == _NEVER_STARTED:
                    result = self.node.completion.end_without_receipt(attempt.id, status="lost",
                                                                      reason=NEVER_STARTED_REASON)
                    report.counts["lost" if str(result.outcome) == "applied" else "already_terminal"] += 1
                elif state is IdentityState.RUNNING:
                    report.counts["still_running"] += 1
                    waiting.add(attempt.id)
                elif state is IdentityState.EXITED:
                    exited.append(attempt)
                elif state is IdentityState.UNVERIFIABLE:
                    reason = ("RECOVERY_NO_DURABLE_HANDLE" if attempt.handle is None
                              else "RECOVERY_IDENTITY_UNVERIFIABLE")
                    if self.node.completion.mark_blocked(attempt.id, reason).status == "blocked":
                        report.counts["blocked"] += 1
                else:
                    report.counts["still_starting"] += 1
                    waiting.add(attempt.id)
            except Exception as exc:  # noqa: BLE001 - one bad attempt must not starve the others
                report.counts["errors"] += 1
                logger.warning("attempt {} not settled this round: {}", attempt.id, type(exc).__name__)
        if not exited:
            return
        # One bounded grace for the whole batch: a launcher may be between exit and link().
        time.sleep(self.profile.publish_grace_ms / 1000)
        settled = self._consume_page([a.id for a in exited], report, judge=judge)
        missing = [attempt for attempt in exited if attempt.id not in settled]
        if missing:
            self._end_without_receipt(missing, report)

    def _identity(self, attempt: AttemptRecord) -> IdentityState | str | None:
        """The attempt's durable identity; None while its host may still record the handle.

        Without a handle, what its host's identity proves decides
        (:func:`ql_core.never_started.start_state`): host alive → None (wait);
        host gone → ``_NEVER_STARTED``; unknown → None for the spawn grace,
        then ``UNVERIFIABLE`` (blocked; a receipt could still end it). An
        attempt whose executor is not installed here is ``UNVERIFIABLE`` too.
        """
        if attempt.handle is None:
            proof = start_state(self.node.executor_for, attempt) if attempt.status == "starting" else None
            if proof is StartState.HOST_ALIVE:
                return None
            if proof is StartState.NEVER_STARTED:
                return _NEVER_STARTED
            if now_ms() - attempt.created_at_ms < self.spawn_grace_ms:
                return None
            return IdentityState.UNVERIFIABLE
        executor = self.node.executor_for(attempt.executor)
        if executor is None:
            return IdentityState.UNVERIFIABLE
        return executor.inspect(attempt.handle)

    def _judge(self, attempt: AttemptRecord, receipt: Receipt) -> int | str | None:
        """What the kernel says about a well-formed receipt of an active attempt, before it is applied.
        Only a receipt that would be accepted (its run, token and next sequence) is judged: any
        other is the completion's to reject, now.

        - its launcher still runs (not a zombie) and so does its host: :data:`DEFER` — a launcher
          publishes only after its command ended and exits right after, so this receipt cannot be
          its own yet, and the host that may be waiting will see the true status when it reaps
          the launcher (a same-user task that forged it must not beat that host). Bounded: the
          launcher exits, or the host dies, and the next round decides;
        - its launcher is an unreaped zombie that exited normally with a non-zero status: that
          status (a launcher exits with its command's), which the receipt must match;
        - anything else (no such executor capability, launcher gone, unknown): None, the receipt
          decides as it always did.
        """
        if (receipt.run_id != attempt.run_id or receipt.callback_sequence != attempt.callback_sequence + 1
                or not same_hash(attempt.callback_token_hash, receipt.token)):
            return None
        executor = self.node.executor_for(attempt.executor)
        leader_state = getattr(executor, "leader_state", None)
        if executor is None or leader_state is None or attempt.handle is None:
            return None
        try:
            state, status = leader_state(attempt.handle)
            if state == "alive":
                host_alive = (attempt.host_handle is not None
                              and executor.inspect(attempt.host_handle) is IdentityState.RUNNING)
                return DEFER if host_alive else None
        except OSError as exc:  # cannot tell: the receipt decides, as before
            logger.debug("launcher of attempt {} not judged: {}", attempt.id, type(exc).__name__)
            return None
        return status if state == "exited" else None

    def _consume_page(self, attempt_ids: list[str], report: RoundReport, *,
                      judge: Any = None) -> set[str]:
        """The attempts whose receipt settled them (or must be retried, or was deferred): no
        identity check for those."""
        assert self.node.consumer is not None
        try:
            results = self.node.consumer.consume_many(attempt_ids, judge=judge)
        except Exception as exc:  # noqa: BLE001 - one bad page must not stop the round
            report.counts["errors"] += 1
            logger.warning("{} receipts not settled this round: {}", len(attempt_ids), type(exc).__name__)
            return set(attempt_ids)
        return {attempt_id for attempt_id, result in results.items() if self._count(result, report)}

    def _consume(self, attempt_id: str, report: RoundReport) -> bool:
        """True when the receipt settled the attempt (or must be retried): no identity check then."""
        assert self.node.consumer is not None
        return self._count(self.node.consumer.consume(attempt_id), report)

    @staticmethod
    def _count(result: ConsumeResult, report: RoundReport) -> bool:
        if result.outcome is ConsumeOutcome.MISSING:
            return False
        if result.outcome is ConsumeOutcome.UNUSABLE:
            report.counts["receipt_unusable"] += 1
            return False  # reported; the identity decides (exited → lost), the run still ends
        if result.outcome is ConsumeOutcome.QUARANTINED:
            report.counts["quarantined"] += 1
            return False  # a bad receipt proves nothing: identity decides, a later valid one still wins
        if result.outcome is ConsumeOutcome.RETRY:
            report.counts["retry"] += 1
            return True
        if result.outcome is ConsumeOutcome.DEFERRED:
            report.counts["receipt_deferred"] += 1
            return True  # its launcher runs: identity would say so too
        report.counts[str(result.outcome)] += 1
        if result.outcome is ConsumeOutcome.APPLIED and result.status in ("timed_out", "cancelled"):
            report.counts[result.status] += 1
        return True

    def _end_without_receipt(self, attempts: list[AttemptRecord], report: RoundReport) -> None:
        """Exited, grace over, still no receipt: lost — or the intent's state if we signalled it."""
        for attempt in attempts:
            try:
                result = self.node.completion.end_without_receipt(attempt.id, reason=LOST_REASON)
            except Exception as exc:  # noqa: BLE001
                report.counts["errors"] += 1
                logger.warning("attempt {} not settled this round: {}", attempt.id, type(exc).__name__)
                continue
            if str(result.outcome) == "applied":
                report.counts[str(result.status)] += 1
                logger.info("attempt {} ended {}", attempt.id, result.status)
            else:
                report.counts["already_terminal"] += 1

    def _ensure_journal(self, attempts: list[AttemptRecord], report: RoundReport) -> None:
        """Attempts from before the journal existed get their row (idempotent back-registration)."""
        receipts = self.node.receipts
        assert receipts is not None
        missing = {a.id: (a.run_id, receipts.relative_ref(a.id)) for a in attempts
                   if self.node.journal.journal_entry(a.id) is None}
        if missing:
            report.counts["journal_registered"] += self.node.journal.register_journal(missing, now_ms())

    # -- step 5: log quota and retention (age and size only; never because of a receipt) --------
    def _logs(self, report: RoundReport, deadline: float) -> None:
        if self._log_keeper is None:
            return
        try:
            report.counts.update(self._log_keeper.round(self.limit, deadline=deadline))
        except Exception as exc:  # noqa: BLE001 - logs are never a reason to fail recovery
            report.counts["log_errors"] += 1
            logger.warning("log maintenance deferred: {}", type(exc).__name__)

    # -- step 6: history retention (pages until the round's retention budget is spent) ----------
    def _history(self, report: RoundReport, deadline: float) -> None:
        """Forget terminal runs past the limits, one page (one transaction) at a time, while the
        round's ``retention_budget_ms`` lasts; ``retention_more`` tells the supervisor work is left."""
        from .ports.journal import HistoryRetention

        journal = self.node.journal
        if not isinstance(journal, HistoryRetention):
            return
        try:
            cutoff = now_ms() - int(self.profile.history_retention_s * 1000)
            while True:
                candidates = journal.history_candidates(self.node.node_id, finished_before_ms=cutoff,
                                                        keep_newest=self.profile.history_max_runs,
                                                        limit=self.limit)
                if not candidates:
                    return
                if not self._purge_page(candidates, report):
                    return  # only runs that must wait (a journal row, a file error): next round
                if time.monotonic() >= deadline:
                    report.counts["retention_more"] = 1
                    return
        except Exception as exc:  # noqa: BLE001 - history is never a reason to fail recovery
            report.counts["history_errors"] += 1
            logger.warning("history retention deferred: {}", type(exc).__name__)

    def _purge_page(self, candidates: dict[str, list[str]], report: RoundReport) -> int:
        from .log_retention import delete_log_file

        ready = []
        for run_id, log_ids in candidates.items():
            try:
                for log_id in log_ids:
                    delete_log_file(self.node, log_id)  # files first: a crash leaves rows, never orphans
                ready.append(run_id)
            except Exception as exc:  # noqa: BLE001 - this run waits for the next round
                report.counts["history_errors"] += 1
                logger.warning("history of run {} kept this round: {}", run_id, type(exc).__name__)
        if not ready:
            return 0
        purged = int(self.node.journal.purge_runs(ready))  # type: ignore[attr-defined]
        report.counts["history_purged"] += purged
        return purged

    # -- step 4: the journal -------------------------------------------------------------
    def _journal(self, report: RoundReport) -> None:
        now = now_ms()
        for page in self._pages(self._fetch_journal, "journal_cursor"):
            # Only this node's rows: on a shared database another node's rows index receipts in a
            # directory this node cannot see — judging them "missing" would purge live rows. (Rows
            # of unknown attempts have no owner and are left alone too.)
            mine = [row for row in page if row.attempt_owner == self.node.node_id]
            report.journal_touched += len(mine)
            expired_or_unseen: list[JournalEntry] = []
            for row in mine:
                try:
                    outcome, kept_in_place = None, False
                    if row.attempt_status not in ATTEMPT_ACTIVE:  # step 3 owns active attempts' receipts
                        # Ended (or blocked) attempt: a receipt left behind is replayed and cleaned.
                        result = self.node.consumer.consume(row.attempt_id)  # type: ignore[union-attr]
                        outcome, kept_in_place = result.outcome, getattr(result, "kept_in_place", False)
                        if outcome is ConsumeOutcome.UNUSABLE:
                            report.counts["receipt_unusable"] += 1
                            outcome = ConsumeOutcome.MISSING  # nothing there can ever be a receipt
                        if outcome is not ConsumeOutcome.MISSING:
                            report.counts[str(outcome)] += 1
                    if row.state == "quarantined":
                        # Whatever the attempt's state, the quarantined copy is kept exactly its window.
                        # Not this round: a retry, or a copy quarantined just now (its clock restarted).
                        # A rejected file kept in place (the slot is taken) leaves the earlier copy's
                        # clock running: that copy still goes on time.
                        fresh = outcome is ConsumeOutcome.QUARANTINED and not kept_in_place
                        if outcome is not ConsumeOutcome.RETRY and not fresh:
                            self._expire_quarantine(row, now, report)
                        continue
                except Exception as exc:  # noqa: BLE001
                    report.counts["errors"] += 1
                    logger.warning("journal row {} not handled this round: {}", row.attempt_id,
                                   type(exc).__name__)
                    continue
                if outcome is ConsumeOutcome.MISSING and row.attempt_status != "blocked":
                    # Ended and its receipt seen missing: the retention clock runs (blocked: it may still come).
                    expired_or_unseen.append(row)
            if expired_or_unseen:
                self._expire_missing(expired_or_unseen, now, report)

    def _expire_missing(self, rows: list[JournalEntry], now: int, report: RoundReport) -> None:
        """Terminal rows whose receipt this round saw missing: start their clock, purge after the window."""
        window = int(self.profile.terminal_journal_retention_s * 1000)
        unseen = [r.attempt_id for r in rows if r.terminal_seen_at_ms is None]
        expired = [r.attempt_id for r in rows
                   if r.terminal_seen_at_ms is not None and now - r.terminal_seen_at_ms >= window]
        self.node.journal.mark_terminal_seen(unseen, now)
        if expired:
            report.counts["journal_purged"] += self.node.journal.resolve(expired)

    def _expire_quarantine(self, row: JournalEntry, now: int, report: RoundReport) -> bool:
        """After ``quarantine_retention_s``: delete the quarantined copy, whatever the attempt's state.

        The row of an ended (or unknown) attempt is deleted with it (True); an active or
        blocked attempt's row goes back to ``pending`` — its valid receipt may still come.
        The window always counts from the quarantine (``updated_at_ms``).
        """
        if now - row.updated_at_ms < int(self.profile.quarantine_retention_s * 1000):
            return False
        receipts = self.node.receipts
        assert receipts is not None
        if receipts.purge_quarantined(row.attempt_id):
            report.counts["quarantine_purged"] += 1
        ended = row.attempt_status in RUN_TERMINAL or row.attempt_status is None
        if ended and receipts.read(row.attempt_id).status != "missing":
            # A rejected file waited in place for the slot: keep the row, so the next round moves
            # it into the freed slot on its own clock — never an unindexed file left behind.
            return True
        if ended:
            self.node.journal.resolve([row.attempt_id])
        else:
            # Active or blocked attempt: back to pending, its valid receipt may still come.
            self.node.journal.requeue_quarantined(row.attempt_id, row.updated_at_ms, now)
        return ended


def _log_keeper(node: Node) -> Any:
    """The log quota/retention keeper of a node that runs local processes (None otherwise)."""
    if node.receipts is None:
        return None
    from .log_retention import LogKeeper

    return LogKeeper(node)


def _key(row: Any) -> str:
    return row.id if hasattr(row, "id") else row.attempt_id
