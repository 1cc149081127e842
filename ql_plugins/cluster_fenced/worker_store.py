"""``WorkerJournal``: a cluster worker's run store — local first, the control plane through the outbox.

On profile ``cluster-worker`` the journal backend is the worker's own edge store
(:class:`~ql_plugins.edge_sqlite.store.SqliteJournal` at ``<data_dir>/worker.db``) to which every
:class:`~ql_core.ports.journal.JournalBackend` method is delegated unchanged: the local runtime's
executor, receipt store, consumer, reconciler, CompletionService and canceller work on the attempts
this worker runs exactly as on an edge node. Each claimed attempt is mirrored there with the
control plane's run and attempt ids, and the lease token as its callback token (the control plane
already stores that token's digest as the attempt's ``callback_token_hash``).

Two additions:

- the worker's lease/outbox table (:mod:`.worker_tables`) in the same file;
- every *terminal* local transition of a claimed attempt puts that attempt's payload into the outbox
  in the same commit (:mod:`.worker_local`), and wakes the worker after it. The local terminal row
  already holds everything the completion needs (the receipt's exit code and times), durably
  (``synchronous=FULL``), so the receipt may go. An outbox row missing after a terminal commit (a
  data dir of an earlier release, which wrote it in a commit of its own) is rebuilt on restart
  (:meth:`WorkerJournal.rebuild_outbox`) from that row.

The local outcome is only provisional: the control plane's answer is authoritative, and it is not
written back into the local store (the local store records what the process did; ``ql status`` on a
control profile shows what the cluster decided). ``create`` refuses runs that were not claimed from
the control plane: a worker runs only what it claims.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from ql_core.crashpoints import crashpoint
from ql_core.errors import ConfigError
from ql_core.log import logger
from ql_core.ports.journal import StoreError

from .outbox import DbClock, Payload, build_payload, signalled_by
from .worker_tables import WorkerLeases

if TYPE_CHECKING:
    from ql_core.ports.context import RunEventInfo, RuntimeContext
    from ql_core.ports.journal import Decide, DispatchClaim, EventSpec, Transition
    from ql_core.records import (
        AttemptRecord,
        DispatchRecord,
        EventRecord,
        JournalEntry,
        LogFacts,
        NewRun,
        RunRecord,
        RunView,
    )

    from .settings import ClusterSettings

__all__ = ["WorkerJournal", "WORKER_DB"]

T = TypeVar("T")
WORKER_DB = "worker.db"


def _check_private(data_dir: Path) -> None:
    """The lease tokens live in this data dir: it must be 0700 (and worker.db 0600)."""
    mode = stat.S_IMODE(os.stat(data_dir).st_mode)
    if mode & 0o077:
        raise ConfigError(f"a cluster worker keeps its lease tokens in {data_dir}, which is {mode:o}: "
                          f"chmod 700 {data_dir} (and keep worker.db 0600)")
    db = data_dir / WORKER_DB
    if db.exists() and stat.S_IMODE(os.stat(db).st_mode) & 0o077:
        raise ConfigError(f"{db} is readable by others: chmod 600 {db}")


class WorkerJournal:
    """The cluster-worker run store (registered as ``cluster-fenced`` on profile cluster-worker)."""

    name = "cluster-fenced"

    def __init__(self, data_dir: Path, *, control_url: str, settings: ClusterSettings, profile: Any,
                 create: bool = True, refuse_fresh: bool = False) -> None:
        from .worker_local import WorkerLocalStore

        self.data_dir = Path(data_dir)
        self.control_url = control_url
        self.settings = settings
        self.profile = profile
        _check_private(self.data_dir)
        path = self.data_dir / WORKER_DB
        #: The database clock as this worker's calls measured it (outbox times are stated in it).
        self.clock = DbClock()
        self.local = WorkerLocalStore(f"sqlite:///{path}", clock=self.clock, busy_timeout_ms=profile.busy_timeout_ms,
                                      create=create, refuse_fresh=refuse_fresh)
        try:
            self.leases = WorkerLeases(path, busy_timeout_ms=profile.busy_timeout_ms, create=create)
        except BaseException:
            self.local.close()
            raise
        #: Called (no arguments) after an attempt went into the outbox: wakes the worker loop.
        self.on_outbox: Callable[[str], None] | None = None

    @classmethod
    def from_context(cls, context: RuntimeContext, settings: ClusterSettings) -> WorkerJournal:
        # A worker.db that is missing or empty after a worker ran here (its lock file exists) would
        # lose the outbox: refused. Before that (killed during its very first start) nothing was
        # claimed yet, so a fresh store is safe.
        from .settings import profile_of

        ran_here = (Path(context.data_dir) / "worker.lock").exists()
        return cls(context.data_dir, control_url=context.config.database_url, settings=settings,
                   profile=profile_of(context.config), create=not context.existing_only,
                   refuse_fresh=context.data_dir_in_use and ran_here)

    def close(self) -> None:
        self.leases.close()
        self.local.close()

    # -- the worker service ------------------------------------------------------------------------
    def run_worker(self, runtime: object, stop: threading.Event) -> int:
        from .worker import Worker

        return Worker(runtime, self, stop).run()

    # -- the outbox ----------------------------------------------------------------------------------
    def outbox_from_local(self, attempt_id: str) -> Payload | None:
        """The claimed attempt ended locally: fix its payload in the outbox (once). None: not ours to send."""
        row = self.leases.get(attempt_id)
        if row is None or row.state not in ("claimed", "launching"):
            return None
        attempt = self.local.attempt(attempt_id)
        if attempt is None or attempt.status not in ("succeeded", "failed", "cancelled", "timed_out", "lost"):
            return None
        payload = build_payload(attempt, signalled_by(self.local.dispatch(attempt.run_id), attempt.id), row,
                                self.clock)
        crashpoint("worker.outbox.before_insert")
        if not self.leases.to_outbox(attempt_id, payload):
            return None
        if self.on_outbox is not None:
            self.on_outbox(attempt_id)
        return payload

    def outbox_direct(self, attempt_id: str, payload: Payload) -> bool:
        """An attempt that has no local run (nothing was created locally): its payload as given."""
        if not self.leases.to_outbox(attempt_id, payload):
            return False
        if self.on_outbox is not None:
            self.on_outbox(attempt_id)
        return True

    def rebuild_outbox(self) -> int:
        """After a restart: attempts that ended locally but whose outbox row was never written."""
        added = 0
        for row in self.leases.unanswered():
            if row.state in ("claimed", "launching") and self.outbox_from_local(row.attempt_id) is not None:
                added += 1
        return added

    def _after(self, attempt_id: str, change: Transition | None) -> None:
        if change is None or not change.terminal:
            return
        if self.local.take_outboxed(attempt_id):
            # The outbox row was written in the terminal commit itself (.worker_local): wake the sender.
            if self.on_outbox is not None:
                self.on_outbox(attempt_id)
            return
        try:  # not written there (not a claimed attempt, or its payload could not be built then)
            self.outbox_from_local(attempt_id)
        except Exception as exc:  # noqa: BLE001 - the worker's restart scan rebuilds it
            logger.warning("outbox row of attempt {} deferred: {}", attempt_id, type(exc).__name__)

    # -- create: only claimed attempts ---------------------------------------------------------------
    def submission_refused(self) -> str:
        """``ql run`` (or ``Runtime.submit``) on a worker: a usage error naming the role and the fix."""
        return ("this node is a cluster worker (profile cluster-worker): it runs only what it claims from the "
                "control plane; submit on a control node instead (a config with profile = \"cluster-control\", "
                "e.g. ql --config control.toml run ...)")

    def create(self, new: NewRun) -> list[RunEventInfo]:
        if self.leases.get(new.attempt_id) is None:
            raise StoreError("a cluster worker runs only what it claims from the control plane; submit with "
                             "profile cluster-control (ql --profile cluster-control run ...)")
        return self.local.create(new)

    def create_running(self, new: NewRun, *, handle: str) -> list[RunEventInfo]:
        if self.leases.get(new.attempt_id) is None:
            raise StoreError("a cluster worker runs only what it claims from the control plane; submit with "
                             "profile cluster-control (ql --profile cluster-control run ...)")
        return self.local.create_running(new, handle=handle)

    # -- decided changes: delegated, terminal ones feed the outbox -------------------------------------
    def transition(self, attempt_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        applied: list[Transition | None] = []

        def wrapped(snap: Any) -> Any:
            result, change = decide(snap)
            applied[:] = [change]
            return result, change

        result, events = self.local.transition(attempt_id, wrapped)
        if events:
            self._after(attempt_id, applied[0] if applied else None)
        return result, events

    def run_transition(self, run_id: str, decide: Decide[T]) -> tuple[T, list[RunEventInfo]]:
        applied: list[tuple[str | None, Transition | None]] = []

        def wrapped(snap: Any) -> Any:
            result, change = decide(snap)
            applied[:] = [(snap.attempt.id if snap.attempt is not None else None, change)]
            return result, change

        result, events = self.local.run_transition(run_id, wrapped)
        if events and applied and applied[0][0] is not None:
            self._after(applied[0][0], applied[0][1])  # type: ignore[arg-type]
        return result, events

    # -- everything else: the local store ---------------------------------------------------------------
    def note_consumed(self, attempt_id: str) -> None:
        self.local.note_consumed(attempt_id)

    def run(self, run_id: str) -> RunRecord | None:
        return self.local.run(run_id)

    def attempt(self, attempt_id: str) -> AttemptRecord | None:
        return self.local.attempt(attempt_id)

    def view(self, run_id: str) -> RunView | None:
        return self.local.view(run_id)

    def list_views(self, *, status: str | None, limit: int) -> list[RunView]:
        return self.local.list_views(status=status, limit=limit)

    def events(self, run_id: str) -> list[EventRecord] | None:
        return self.local.events(run_id)

    def page_active_attempts(self, owner: str, after: str, limit: int) -> list[AttemptRecord]:
        return self.local.page_active_attempts(owner, after, limit)

    def due_deadlines(self, owner: str, now_ms: int, limit: int) -> list[str]:
        return self.local.due_deadlines(owner, now_ms, limit)

    def page_journal(self, after: str, limit: int) -> list[JournalEntry]:
        return self.local.page_journal(after, limit)

    def journal_entry(self, attempt_id: str) -> JournalEntry | None:
        return self.local.journal_entry(attempt_id)

    def register_journal(self, entries: Mapping[str, tuple[str, str]], now_ms: int) -> int:
        return self.local.register_journal(entries, now_ms)

    def mark_quarantined(self, attempt_id: str, reason: str, now_ms: int) -> bool:
        return self.local.mark_quarantined(attempt_id, reason, now_ms)

    def mark_terminal_seen(self, attempt_ids: list[str], now_ms: int) -> None:
        self.local.mark_terminal_seen(attempt_ids, now_ms)

    def resolve(self, attempt_ids: list[str]) -> int:
        return self.local.resolve(attempt_ids)

    def requeue_quarantined(self, attempt_id: str, seen_updated_at_ms: int, now_ms: int) -> bool:
        return self.local.requeue_quarantined(attempt_id, seen_updated_at_ms, now_ms)

    def dispatch(self, run_id: str) -> DispatchRecord | None:
        return self.local.dispatch(run_id)

    def due_dispatches(self, owner: str, limit: int) -> list[str]:
        return self.local.due_dispatches(owner, limit)

    def claim_dispatch(self, run_id: str, owner: str, lease_ms: int) -> DispatchClaim | None:
        return self.local.claim_dispatch(run_id, owner, lease_ms)

    def finish_dispatch(self, claim: DispatchClaim, values: Mapping[str, object]) -> bool:
        return self.local.finish_dispatch(claim, values)

    def log_facts(self, log_id: str) -> LogFacts | None:
        return self.local.log_facts(log_id)

    def mark_log_truncated(self, log_id: str, event: EventSpec) -> list[RunEventInfo]:
        return self.local.mark_log_truncated(log_id, event)

    def record_log_sizes(self, sizes: Mapping[str, int]) -> None:
        self.local.record_log_sizes(sizes)

    # -- TerminalLogSize: a runner that reaped its task with an empty log (most print nothing) has its
    # size (0) written in the terminal commit instead of a commit of its own after it ----------------
    def offer_log_size(self, attempt_id: str, log_id: str, size: int) -> None:
        self.local.offer_log_size(attempt_id, log_id, size)

    def withdraw_log_size(self, attempt_id: str) -> None:
        self.local.withdraw_log_size(attempt_id)

    def page_live_logs(self, owner: str, after: str, limit: int) -> list[LogFacts]:
        return self.local.page_live_logs(owner, after, limit)

    def ended_logs(self, owner: str, *, unsized: bool = False, created_before_ms: int | None = None,
                   sized: bool = False, limit: int) -> list[LogFacts]:
        logs = self.local.ended_logs(owner, unsized=unsized, created_before_ms=created_before_ms, sized=sized,
                                     limit=limit)
        if unsized:
            return logs  # finalizing (cut to the quota, size recorded) is what the shipper waits for
        # The other two asks are for deletion (age, total size): never a log the shipper has not
        # finalized in the artifact store yet — a worker cut off from the database keeps its logs.
        keep = self.leases.unshipped_logs([f.id for f in logs])
        return [f for f in logs if f.id not in keep]

    def ended_log_bytes(self, owner: str) -> int:
        return self.local.ended_log_bytes(owner)

    def mark_log_deleted(self, log_id: str, now_ms: int, size_bytes: int) -> None:
        self.local.mark_log_deleted(log_id, now_ms, size_bytes)

    # -- history retention (HistoryRetention): the local store forgets old runs, never unanswered ones ----
    def history_candidates(self, owner: str, *, finished_before_ms: int, keep_newest: int,
                           limit: int) -> dict[str, list[str]]:
        found = self.local.history_candidates(owner, finished_before_ms=finished_before_ms, keep_newest=keep_newest,
                                              limit=limit)
        out: dict[str, list[str]] = {}
        for run_id, logs in found.items():
            view = self.local.view(run_id)
            attempts = view.attempts if view is not None else ()
            rows = [self.leases.get(a.attempt_id) for a in attempts]
            if any(r is not None and r.state != "answered" for r in rows):
                continue  # its outbox row is built from these rows until the control plane answered
            out[run_id] = logs
        return out

    def purge_runs(self, run_ids: list[str]) -> int:
        return self.local.purge_runs(run_ids)
