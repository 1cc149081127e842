"""A control-loop round's reports in one transaction: starts, ``running`` reports, completions.

After its claim, a round of the control loop has up to three kinds of call to make: ``start`` for
the attempts it claimed (or whose earlier ``start`` got no answer), ``running`` for the attempts
spawned since the last round, and the completions in the outbox. Made one after another they were
three transactions (four with a claim) — each a commit at the control database and a round trip
here — for what a short task needs at once. :class:`RoundReport` sends them together
(:func:`.round_call.report_round`: one statement; each call still fenced on its own, and each
replay-safe), then hands every answer to the part that owns it, as the separate calls did:

- ``start``: :meth:`.runner.Runner.started` (spawn, hand back, or forget);
- ``running``: :meth:`.fence_guard.FenceGuard.running_answer` — before the completions' answers,
  and in the statement before the completions themselves, so an attempt that spawned and ended
  between two rounds gets its ``attempt.spawned`` event first, as it did a transaction earlier.
  Since revision 0017 an attempt whose completion is in the same round sends no ``running`` call:
  its spawn goes with its completion (``ql_spawn_complete_many`` makes both transitions, in that
  order), and the completion's answer is the spawn's too (fenced: the attempt is self-fenced first,
  as a fenced ``running`` answer did);
- completions: :meth:`.outbox_sender.OutboxSender.completions_answered` (the outbox rows marked
  answered only now, after the commit: a completion the worker reported is committed at the
  control plane before the worker forgets it).

No answer (:class:`~.control_db.TransientError`, which may or may not have committed): each part is
tried again as it would have been (``start`` after a second, the reports in a later round, the
completions after their backoff). A final error: each part on its own, as before, so one bad call
never holds the others back. A control database without one of the functions, or a role not granted
it: the separate calls from then on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ql_core.crashpoints import crashpoint

from .control_db import WORKER_BATCH, ControlDBError, TransientError
from .results import CompletionAnswer
from .round_call import report_round

if TYPE_CHECKING:
    from .control_session import ControlSession
    from .fence_guard import FenceGuard
    from .held_attempts import Held
    from .outbox_sender import OutboxSender
    from .round_call import RoundAnswers
    from .runner import Runner
    from .ship_table import ShipRow
    from .worker_tables import LeaseRow

__all__ = ["RoundReport"]

#: A missing function (42883) or grant (42501): the separate calls from then on.
_NOT_THERE = ("42883", "42501")


class RoundReport:
    """Makes a round's starts, ``running`` reports and completions in one statement (module docstring)."""

    def __init__(self, session: ControlSession, *, guard: FenceGuard, runner: Runner, outbox: OutboxSender) -> None:
        self.session = session
        self.guard = guard
        self.runner = runner
        self.outbox = outbox
        #: False once ``ql_spawn_complete_many`` (revision 0017) was missing or not granted: a round
        #: sends an attempt's ``running`` report before its completion, as before.
        self.completes_spawns = True

    def report(self) -> None:
        """The round's due starts, ``running`` reports and outbox rows."""
        starts = self.runner.pending_starts()
        # The outbox rows before the spawns: a runner queues its attempt's "spawned" before the
        # terminal commit that writes its outbox row, so every completion taken here has its spawn
        # in the list taken next (or reported in an earlier round).
        _answered, completions = self.outbox.take_due()
        db = self.session.db()
        together = db.reports_rounds and self.completes_spawns
        spawned = self.guard.take_spawned(ending={row.attempt_id for row in completions} if together else None)
        if not db.reports_rounds or (not starts and not spawned and not completions):
            self._separately(starts, spawned, completions)
            return
        while starts or spawned or completions:
            chunk_s, starts = starts[:WORKER_BATCH], starts[WORKER_BATCH:]
            chunk_c, completions = completions[:WORKER_BATCH], completions[WORKER_BATCH:]
            # A completion's spawn goes in its chunk (carried by it, or its running report just
            # before it): never a statement after the completion it precedes.
            ending = {row.attempt_id for row in chunk_c}
            mine = [held for held in spawned if held.attempt_id in ending]
            others = [held for held in spawned if held.attempt_id not in ending]
            room = max(0, WORKER_BATCH - len(mine))
            chunk_r, spawned = mine + others[:room], others[room:]
            if not self._together(chunk_s, chunk_r, chunk_c):
                self._separately(chunk_s + starts, chunk_r + spawned, chunk_c + completions)
                return

    def _together(self, starts: list[Held], spawned: list[Held], completions: list[LeaseRow]) -> bool:
        """One statement for these calls; False (nothing sent) when the database cannot take it."""
        empty: dict[str, ShipRow] = self.outbox.empty_logs(completions) if completions else {}
        calls = self.outbox.completion_calls(completions)
        proofs = [fence for (fence, _c), row in zip(calls, completions) if row.attempt_id in empty]
        shipper = self.outbox.shipper
        max_bytes = shipper.max_bytes if shipper is not None else 0
        db = self.session.db()
        # The spawns of the attempts whose completion is in this round go with it (revision 0017).
        ending = {row.attempt_id for row in completions} if self.completes_spawns else set()
        joint = {held.attempt_id: held for held in spawned if held.attempt_id in ending}
        alone = [held for held in spawned if held.attempt_id not in joint]
        running = self.guard.running_calls(alone)
        spawns = None
        if joint:
            spawns = [self.guard.spawned_at(joint[row.attempt_id]) if row.attempt_id in joint else None
                      for row in completions]
        if spawned:
            crashpoint("worker.running.before_call")
        try:
            answers: RoundAnswers
            answers, sent = self.session.call(lambda db: report_round(
                db, starts=[h.fence for h in starts], runnings=running, completions=calls,
                empties=proofs, max_bytes=max_bytes, spawns=spawns))
        except TransientError:
            for held in starts:
                held.start_retry = time.monotonic() + 1.0
            self.guard.report_later(spawned)
            self.outbox.retry_later(completions)
            return True
        except ControlDBError as exc:
            if exc.sqlstate in _NOT_THERE:
                if spawns is not None:  # before 0017 (or not granted): the running reports again
                    self.completes_spawns = False
                    return self._together(starts, spawned, completions)
                db.reports_rounds = False  # nothing committed: the separate calls
                return False
            self._separately(starts, spawned, completions)
            return True
        for held, res in zip(alone, answers.runnings):
            self.guard.running_answer(held, res, sent)
        for row, done in zip(completions, answers.completions):
            if row.attempt_id in joint and done.answer is CompletionAnswer.FENCED:
                self.guard.self_fence(joint[row.attempt_id], by_database=True)
        if completions:
            self.outbox.completions_answered(completions, answers.completions, empty,
                                             answers.empties if proofs else None)
        for held, res in zip(starts, answers.starts):
            self.runner.started(held, res, sent)
        return True

    def _separately(self, starts: list[Held], spawned: list[Held], completions: list[LeaseRow]) -> None:
        """Each kind in its own transactions, as before rounds were one statement."""
        self.runner.start_many(starts)
        self.guard.report_running_many(spawned)
        self.outbox.submit_completions(completions)
