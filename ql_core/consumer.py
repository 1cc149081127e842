"""The receipt consumer: read → CompletionService → delete; the journal row goes later (ADR-0007 §2.5).

Order is the whole point:
- the receipt is deleted only after ``applied`` or a consistent
  ``already_terminal`` was *committed* (a crash in between replays it);
- deleting it costs no commit: the terminal transaction already started the
  journal row's retention clock, and the row itself is only *noted* as
  consumed — it is deleted inside this runtime's next journal write (the next
  create) or by retention once the reconciler has seen the receipt missing.
  A journal row is therefore never gone while its receipt may exist, and a
  ``quarantined`` row survives a later success so its quarantined copy is
  purged on time;
- a deterministic rejection (codec, token, sequence, owner, state) is first
  persisted as ``quarantined`` in the journal, then the file is moved (hard
  link + unlink) into the private quarantine; its content is never logged;
- database, compare-and-set and ordinary file-system errors keep the file for
  the next round; a quarantine slot already taken by an earlier rejected file
  is not transient: the decision stands (``quarantined``) and the file stays
  in place, never overwriting the earlier one;
- a receipt *slot* that cannot hold a receipt — a directory, FIFO or device
  planted at its path, a symlinked shard — is ``unusable``: reported, never
  retried for ever, never moved; the attempt's identity decides instead.
A quarantine never poisons the attempt: it stays active, and a valid receipt
published later still completes it.

A receipt that disagrees with kernel truth — the status the spawning host
reaped, or the status an unreaped launcher's zombie still shows — is
quarantined (``disagrees_with_observed_exit``) and an ``attempt.receipt_rejected``
audit event is recorded, on every path. Recovery may also *defer* a valid
receipt (``judge``): one whose launcher is still alive beside a live host
cannot be genuine yet, since a launcher publishes only after its command
ended and exits right after; it is looked at again next round.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Callable, Literal

from .clock import now_ms
from .completion import CompletionOutcome, CompletionResult, CompletionService
from .crashpoints import crashpoint
from .log import logger
from .ports.journal import EventSpec
from .ports.receipt_store import QuarantineConflictError, ReceiptStoreError, UnsafePathError
from .value_class import value_class

if TYPE_CHECKING:
    from .ports.journal import ReceiptJournal
    from .ports.receipt_store import ReceiptStore
    from .receipts.codec import Receipt

__all__ = ["ConsumeOutcome", "ConsumeResult", "ReceiptConsumer", "DISAGREES_WITH_OBSERVED", "DEFER", "Judge",
           "RECEIPT_REJECTED_EVENT"]

#: Quarantine reason of a receipt whose exit code differs from what the kernel showed (the status
#: the spawning host reaped, or an unreaped launcher's).
DISAGREES_WITH_OBSERVED = "disagrees_with_observed_exit"
#: Audit event recorded with every such quarantine (its reason: the quarantine reason, upper case).
RECEIPT_REJECTED_EVENT = "attempt.receipt_rejected"
#: A judge's answer for a receipt that must wait for the next round.
DEFER: Literal["defer"] = "defer"
#: ``judge(receipt)`` for a well-formed receipt found during recovery: :data:`DEFER`, the exit status
#: the kernel showed for it (the receipt must agree), or None (no view: the receipt decides).
Judge = Callable[["Receipt"], "int | Literal['defer'] | None"]
_NOT_A_FILE = "codec:not_regular_file"


class ConsumeOutcome(enum.StrEnum):
    MISSING = "missing"
    APPLIED = "applied"
    ALREADY_TERMINAL = "already_terminal"
    QUARANTINED = "quarantined"
    #: transient trouble (database busy, I/O error): the receipt stays for the next round
    RETRY = "retry"
    #: the slot cannot hold a receipt (not a regular file, symlinked shard): as good as missing
    UNUSABLE = "unusable"
    #: a valid receipt whose launcher still runs beside its live host: left for the next round
    DEFERRED = "deferred"


@value_class()  # as @dataclass(frozen=True, slots=True), without its import-time code generation
class ConsumeResult:
    __slots__ = ("outcome", "status", "reason", "kept_in_place")
    outcome: ConsumeOutcome
    status: str | None
    reason: str | None
    #: QUARANTINED, but the file could not be moved because the quarantine slot holds an earlier
    #: rejected file of the attempt (never overwritten): that earlier copy's retention still applies.
    kept_in_place: bool

    def __init__(self, outcome: ConsumeOutcome, status: str | None = None, reason: str | None = None,
                 kept_in_place: bool = False) -> None:
        _set = object.__setattr__
        _set(self, "outcome", outcome)
        _set(self, "status", status)
        _set(self, "reason", reason)
        _set(self, "kept_in_place", kept_in_place)


class ReceiptConsumer:
    """Turns one attempt's receipt file into at most one terminal commit."""

    def __init__(self, store: ReceiptStore, journal: ReceiptJournal, completion: CompletionService) -> None:
        """``journal``: only its receipt-journal part is used (the quarantine decision, the consumed hint)."""
        self._store = store
        self._journal = journal
        self._completion = completion

    def consume(self, attempt_id: str, *, observed_exit_code: int | None = None) -> ConsumeResult:
        """Settle the attempt from its receipt, if one is there (see the module doc).

        ``observed_exit_code``: the status the spawning host itself saw when it reaped the task —
        kernel truth. A valid receipt that disagrees with it is not applied: it is quarantined
        (``disagrees_with_observed_exit``) and the caller applies what it observed.
        """
        judge = None if observed_exit_code is None else (lambda _receipt: observed_exit_code)
        found = self._read_and_judge(attempt_id, judge)
        if isinstance(found, ConsumeResult):
            return found
        try:
            result = self._completion.complete(found)
        except Exception as exc:  # noqa: BLE001 - any DB/CAS failure: keep the receipt
            logger.warning("completion of attempt {} deferred: {}", attempt_id, type(exc).__name__)
            return ConsumeResult(ConsumeOutcome.RETRY, reason=type(exc).__name__)
        if result.outcome is not CompletionOutcome.REJECTED:
            crashpoint("consumer.after_commit")
        return self._settle(attempt_id, result)

    def consume_many(self, attempt_ids: list[str], *, judge: Judge | None = None) -> dict[str, ConsumeResult]:
        """:meth:`consume` for a page of attempts (recovery), with every valid receipt applied in
        ONE terminal transaction where the run store can batch; the files are removed only after
        that commit. A failed batch keeps every receipt (``retry``). ``judge`` is asked about each
        valid receipt only (the common round, with no receipt, costs nothing more): it may defer
        it (``deferred``) or name the status the kernel showed, which the receipt must match."""
        results: dict[str, ConsumeResult] = {}
        valid: list[Receipt] = []
        for attempt_id in attempt_ids:
            found = self._read_and_judge(attempt_id, judge)
            if isinstance(found, ConsumeResult):
                results[attempt_id] = found
            else:
                valid.append(found)
        if not valid:
            return results
        try:
            completions = self._completion.complete_many(valid)
        except Exception as exc:  # noqa: BLE001 - any DB/CAS failure: keep every receipt
            logger.warning("completion of {} attempts deferred: {}", len(valid), type(exc).__name__)
            for receipt in valid:
                results[receipt.attempt_id] = ConsumeResult(ConsumeOutcome.RETRY, reason=type(exc).__name__)
            return results
        crashpoint("consumer.after_commit")
        for receipt, result in zip(valid, completions):
            results[receipt.attempt_id] = self._settle(receipt.attempt_id, result)
        return results

    def _read_and_judge(self, attempt_id: str, judge: Judge | None) -> ConsumeResult | Receipt:
        """Read the attempt's receipt and classify it: the valid receipt to apply, or what became of
        the attempt's slot instead (missing, unusable, unreadable this round, quarantined, deferred).
        ``judge`` is asked about a valid receipt only (see :meth:`consume_many`)."""
        try:
            read = self._store.read(attempt_id)
        except UnsafePathError as exc:
            logger.warning("receipt slot of attempt {} is unusable: {}", attempt_id, type(exc).__name__)
            return ConsumeResult(ConsumeOutcome.UNUSABLE, reason=type(exc).__name__)
        except ReceiptStoreError as exc:
            logger.warning("receipt of attempt {} unreadable this round: {}", attempt_id, type(exc).__name__)
            return ConsumeResult(ConsumeOutcome.RETRY, reason=type(exc).__name__)
        if read.status == "missing":
            return ConsumeResult(ConsumeOutcome.MISSING)
        if read.status == "invalid":
            assert read.rejection is not None
            return self._quarantine(attempt_id, f"codec:{read.rejection.reason}")
        assert read.receipt is not None
        verdict = judge(read.receipt) if judge is not None else None
        if verdict == DEFER:
            return ConsumeResult(ConsumeOutcome.DEFERRED)
        if verdict is not None and read.receipt.exit_code != verdict:
            return self._quarantine(attempt_id, DISAGREES_WITH_OBSERVED)
        return read.receipt

    def _settle(self, attempt_id: str, result: CompletionResult) -> ConsumeResult:
        """After the completion: a rejected receipt is quarantined, an applied (or consistent
        already-terminal) one is removed — its terminal state is committed by now."""
        if result.outcome is CompletionOutcome.REJECTED:
            assert result.rejection is not None
            return self._quarantine(attempt_id, str(result.rejection))
        outcome = (ConsumeOutcome.APPLIED if result.outcome is CompletionOutcome.APPLIED
                   else ConsumeOutcome.ALREADY_TERMINAL)
        return self._clean(attempt_id, outcome, result.status)

    def _clean(self, attempt_id: str, outcome: ConsumeOutcome, status: str | None) -> ConsumeResult:
        try:
            self._store.remove(attempt_id)
        except Exception as exc:  # noqa: BLE001 - retried next round
            # The terminal state is committed; a replay finds already_terminal and cleans.
            logger.warning("cleanup of attempt {} deferred: {}", attempt_id, type(exc).__name__)
            return ConsumeResult(outcome, status=status)
        crashpoint("consumer.after_delete")
        # No commit here (DESIGN.md §3.6): the row goes with a later write or by retention.
        self._journal.note_consumed(attempt_id)
        return ConsumeResult(outcome, status=status)

    def _quarantine(self, attempt_id: str, reason: str) -> ConsumeResult:
        try:
            if not self._journal.mark_quarantined(attempt_id, reason, now_ms()):
                # Not ours to judge: files unknown to the journal belong to `ql audit receipts`.
                return ConsumeResult(ConsumeOutcome.RETRY, reason="not_in_journal")
            crashpoint("consumer.quarantine.after_journal")
            try:
                self._store.quarantine(attempt_id)
            except QuarantineConflictError:
                # Deterministic, not transient: the quarantine slot already holds an earlier rejected
                # file of this attempt and nothing may be overwritten. The decision is persisted; this
                # file stays where it is and, like any rejected receipt, proves nothing — the caller
                # goes on to the identity check instead of retrying (and wedging the run) forever.
                logger.warning("receipt of attempt {} rejected ({}); quarantine slot taken, kept in place",
                               attempt_id, reason)
                return ConsumeResult(ConsumeOutcome.QUARANTINED, reason=reason, kept_in_place=True)
            except ReceiptStoreError:
                if reason != _NOT_A_FILE:
                    raise
                # Something that is not a file (a directory, a FIFO...) sits in the slot and cannot be
                # moved aside: reported every round, never retried for ever; the identity decides.
                logger.warning("receipt slot of attempt {} holds something that is not a file", attempt_id)
                return ConsumeResult(ConsumeOutcome.UNUSABLE, reason="not_regular_file")
        except Exception as exc:  # noqa: BLE001 - retried next round
            logger.warning("quarantine of attempt {} deferred: {}", attempt_id, type(exc).__name__)
            return ConsumeResult(ConsumeOutcome.RETRY, reason=type(exc).__name__)
        logger.info("receipt of attempt {} quarantined ({})", attempt_id, reason)
        if reason == DISAGREES_WITH_OBSERVED:
            self._audit(attempt_id, reason)
        return ConsumeResult(ConsumeOutcome.QUARANTINED, reason=reason)

    def _audit(self, attempt_id: str, reason: str) -> None:
        """The audit line of a receipt that contradicted kernel truth (after its quarantine: a crash
        in between loses the line, never the quarantined file or its journal reason)."""
        try:
            self._completion.audit(attempt_id, EventSpec(RECEIPT_REJECTED_EVENT, attempt_id=attempt_id,
                                                         reason=reason.upper()))
        except Exception as exc:  # noqa: BLE001 - the quarantine stands; the journal keeps its reason
            logger.warning("audit event of attempt {} not recorded: {}", attempt_id, type(exc).__name__)
