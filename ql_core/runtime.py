"""Runtime: the facade a host application embeds (and the ``ql`` command uses).

```python
from ql_core.config import load_config
from ql_core.runtime import Runtime

rt = Runtime.open(load_config(data_dir="/var/lib/myhost/ql"))
sub = rt.submit(["backup.sh", "--full"], timeout_s=3600)
print(rt.wait(sub).status)          # or leave it: the task outlives this process
```
A task's life is three commits (DESIGN.md §3.6): *create* (run, attempt,
token hash, deadline, log artifact, journal row — before any side effect),
*spawned* (the durable process handle) and *terminal* (CompletionService).
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .clock import now_ms, now_ms_ceil
from .config import Config
from .crashpoints import crashpoint
from .errors import NotFoundError, PersistBeforeSpawnError, QlError, UsageError
from .ids import new_id
from .interfaces import RuntimeContext, SpawnRequest
from . import paths
from .paths import ensure_data_dir, log_relative_path, read_or_create_node_id
from .states import RUN_TERMINAL

if TYPE_CHECKING:
    import subprocess

    from .cancellation import Canceller, CancelRequest
    from .completion import CompletionResult, CompletionService
    from .consumer import ReceiptConsumer
    from .plugins import PluginHost

__all__ = ["Runtime", "Submission", "RunView", "EXECUTOR_TYPE"]

EXECUTOR_TYPE = "local_process"
#: How often a waiting host looks at its child, the clock and its cancel dispatch.
WAIT_TICK_S = 0.05
#: The launcher's exit status when it could not learn the command's (launcher.sh): no receipt follows.
LAUNCHER_LOST_STATUS = 125
#: How often a waiting host re-reads the run for a cancel intent or a passed deadline.
INTENT_POLL_S = 1.0


@dataclass
class Submission:
    """A started attempt. ``process`` is set while this runtime is the launcher's parent."""

    run_id: str
    attempt_id: str
    log_artifact_id: str
    callback_sequence: int
    started_at_ms: int
    deadline_at_ms: int | None
    token: str = field(repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RunView:
    """What ``ql status`` shows: low-sensitivity facts only."""

    run_id: str
    name: str | None
    status: str
    exit_code: int | None
    reason: str | None
    created_at_ms: int
    finished_at_ms: int | None
    deadline_at_ms: int | None
    cancel_reason: str | None
    log_artifact_id: str | None
    attempts: tuple[dict[str, Any], ...]

    @property
    def terminal(self) -> bool:
        return self.status in RUN_TERMINAL

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "status": self.status, "exit_code": self.exit_code,
                "reason": self.reason, "created_at_ms": self.created_at_ms, "finished_at_ms": self.finished_at_ms,
                "deadline_at_ms": self.deadline_at_ms, "cancel_reason": self.cancel_reason,
                "attempts": list(self.attempts)}


class Runtime:
    """One node's ql runtime: database, plugins, executor, receipts, completion."""

    def __init__(self, config: Config, *, engine: Any, plugins: PluginHost, node_id: str) -> None:
        from .cancellation import Canceller
        from .completion import CompletionService
        from .consumer import ReceiptConsumer

        self.config = config
        self.profile = config.profile
        self.engine = engine
        self.plugins = plugins
        self.node_id = node_id
        self.context = RuntimeContext(config=config, node_id=node_id)
        self.executor = (plugins.executors.create(EXECUTOR_TYPE, self.context)
                         if config.profile.spawns_local_processes else None)
        self.receipts = plugins.receipt_stores.create("file", self.context) if self.executor else None
        self.journal = plugins.journal_backends.create(_journal_name(plugins), self.context)
        self.completion: CompletionService = CompletionService(
            engine, node_id=node_id, retries=self.profile.completion_retries, notify=plugins.notify_event)
        self.consumer: ReceiptConsumer | None = (
            ReceiptConsumer(engine, self.receipts, self.journal, self.completion, executor_type=EXECUTOR_TYPE)
            if self.receipts is not None else None)
        self.canceller: Canceller = Canceller(engine, self.executor, node_id, self.profile, plugins.notify_event)

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def open(cls, config: Config, *, environ: dict[str, str] | None = None) -> Runtime:
        """Create the data dir, migrate the schema, load the configured plugins."""
        from .db.engine import create_db_engine
        from .db.migrate import upgrade
        from .plugins import load_plugin_host

        data_dir = ensure_data_dir(config.data_dir)
        if data_dir != config.data_dir:
            from dataclasses import replace

            config = replace(config, data_dir=data_dir)
        node_id = read_or_create_node_id(data_dir)
        engine = create_db_engine(config.database_url, busy_timeout_ms=config.profile.busy_timeout_ms)
        upgrade(engine)
        plugins = load_plugin_host(config.plugins, environ)
        return cls(config, engine=engine, plugins=plugins, node_id=node_id)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_executor(self) -> Any:
        if self.executor is None or self.receipts is None:
            raise UsageError(f"profile {self.profile.name!r} does not run local processes; "
                             f"submit from an edge, standalone or cluster-worker node")
        return self.executor

    # -- submit: persist before spawn ----------------------------------------------
    def submit(self, command: Sequence[str], *, shell: bool = False, name: str | None = None,
               timeout_s: float | None = None, cwd: str | None = None,
               env: dict[str, str] | None = None, log_max_bytes: int | None = None) -> Submission:
        """Persist the run, then spawn it. Nothing is spawned unless the create commit succeeded.

        ``log_max_bytes`` overrides the profile's per-attempt log quota for this run.
        """
        executor = self._require_executor()
        if not command or (shell and len(command) != 1):
            raise UsageError("give a command: `ql run -- CMD [ARG...]` (with --shell: exactly one string)")
        if any("\0" in part for part in command) or any("\0" in f"{k}{v}" for k, v in (env or {}).items()):
            raise UsageError("a command argument or environment value contains a NUL byte; remove it")
        if timeout_s is not None and not (0 < timeout_s <= 366 * 24 * 3600):
            raise UsageError("--timeout must be a positive number of seconds (at most a year)")
        if log_max_bytes is not None:
            from .profiles import LIMIT_RANGES

            _kind, low, high = LIMIT_RANGES["log_max_bytes"]
            if (isinstance(log_max_bytes, bool) or not isinstance(log_max_bytes, int)
                    or not low <= log_max_bytes <= high):
                raise UsageError(f"log_max_bytes must be an integer between {low:g} and {high:g}")
        sub = self._create(name=name, timeout_s=timeout_s, log_max_bytes=log_max_bytes)
        return self._spawn(executor, sub, tuple(command), shell=shell, cwd=cwd, env=env)

    def _create(self, *, name: str | None, timeout_s: float | None,
                log_max_bytes: int | None = None) -> Submission:
        from .completion import hash_token
        from .db.models import LogArtifact, Run, RunAttempt, RunEvent
        from .transitions import with_retries

        run_id, attempt_id, log_id = new_id(), new_id(), new_id()
        token = secrets.token_urlsafe(32)  # 256 bits, 43 chars of [A-Za-z0-9_-]
        now = now_ms()
        deadline = now + int(timeout_s * 1000) if timeout_s is not None else None

        def work(session: Any) -> None:
            session.add(Run(id=run_id, name=name, status="queued", current_attempt_id=attempt_id,
                            created_at_ms=now, updated_at_ms=now, deadline_at_ms=deadline, event_seq=1))
            session.flush()
            session.add(RunAttempt(id=attempt_id, run_id=run_id, executor_type=EXECUTOR_TYPE,
                                   runtime_owner=self.node_id, status="starting", log_artifact_id=log_id,
                                   callback_token_hash=hash_token(token), callback_sequence=0,
                                   deadline_at_ms=deadline, created_at_ms=now))
            session.add(LogArtifact(id=log_id, run_id=run_id, attempt_id=attempt_id,
                                    relative_path=log_relative_path(log_id),
                                    max_bytes=log_max_bytes or self.profile.log_max_bytes, created_at_ms=now))
            session.add(RunEvent(run_id=run_id, seq=1, type="run.created", attempt_id=attempt_id, at_ms=now))
            self.journal.register(session, run_id=run_id, attempt_id=attempt_id,
                                  receipt_ref=self.receipts.relative_ref(attempt_id), now_ms=now)
            crashpoint("create.before_commit")

        try:
            with_retries(self.engine, work, retries=self.profile.completion_retries)
        except Exception as exc:  # any failure of the create commit means: do not spawn
            raise PersistBeforeSpawnError(
                f"could not persist the run before spawning it, so nothing was started "
                f"({type(exc).__name__}); check the database ({self.config.data_dir}) and retry") from exc
        from .interfaces import RunEventInfo

        self.plugins.notify_event(RunEventInfo(run_id=run_id, seq=1, type="run.created", attempt_id=attempt_id))
        return Submission(run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id, callback_sequence=1,
                          started_at_ms=now, deadline_at_ms=deadline, token=token)

    def _spawn(self, executor: Any, sub: Submission, command: tuple[str, ...], *, shell: bool,
               cwd: str | None, env: dict[str, str] | None) -> Submission:
        from .logs import open_log_artifact

        shard_dir = Path(self.receipts.ensure_shard_dir(sub.attempt_id))
        request = SpawnRequest(run_id=sub.run_id, attempt_id=sub.attempt_id,
                               callback_sequence=sub.callback_sequence, token=sub.token,
                               started_at_ms=sub.started_at_ms, command=command, shell=shell,
                               log_path=paths.log_path(self.config.data_dir, sub.log_artifact_id),
                               receipt_shard_dir=shard_dir, cwd=cwd, env=env)
        try:
            log_fd = open_log_artifact(self.config.data_dir, sub.log_artifact_id)
        except OSError as exc:
            self.completion.end_without_receipt(sub.attempt_id, status="failed", reason="LOG_ARTIFACT_UNAVAILABLE")
            raise QlError(f"cannot create the log file in {self.config.data_dir}/logs "
                          f"({exc.strerror}); run `ql doctor`") from None
        try:
            task = executor.spawn(request, log_fd=log_fd)
        except Exception as exc:
            # Nothing runs: the create commit is closed with a terminal state, never left "starting".
            self.completion.end_without_receipt(sub.attempt_id, status="failed", reason="SPAWN_FAILED")
            detail = exc.strerror if isinstance(exc, OSError) else type(exc).__name__
            raise QlError(f"cannot start the task ({detail}); run {sub.run_id} marked failed "
                          f"(check --cwd and that /bin/sh exists)") from None
        finally:
            os.close(log_fd)
        sub.process = task.process
        self._record_spawned(executor, sub, task)
        return sub

    def _record_spawned(self, executor: Any, sub: Submission, task: Any) -> None:
        """Second commit: the durable handle. Without it the task must not run (ADR-0007 §2.2)."""
        from .transitions import EventSpec, change_attempt, change_run, load_attempt, load_run, with_retries

        handle = executor.capture_handle(task)

        def work(session: Any) -> list[Any]:
            attempt = load_attempt(session, sub.attempt_id)
            run = load_run(session, sub.run_id)
            if attempt is None or run is None or attempt.status != "starting":
                return []  # already ended (e.g. a fast task completed through recovery): nothing to add
            now = now_ms()
            change_attempt(session, attempt, {"status": "running", "started_at_ms": sub.started_at_ms,
                                              "boot_id": handle["boot_id"], "pid": handle["pid"],
                                              "pgid": handle["pgid"], "process_start_time": handle["start_time"]})
            events = change_run(session, run, {"status": "running"},
                                [EventSpec("attempt.spawned", attempt_id=attempt.id, status="running")], now)
            crashpoint("spawn.before_handle_commit")
            return events

        try:
            if handle is None:
                raise QlError("the launcher's identity could not be read")
            events = with_retries(self.engine, work, retries=self.profile.completion_retries)
        except Exception as exc:  # noqa: BLE001 - compensate: stop the task, mark it lost
            self._compensate(sub)
            raise QlError(f"the task started but its process handle could not be saved "
                          f"({type(exc).__name__}); it was stopped and run {sub.run_id} marked lost") from None
        for event in events:
            self.plugins.notify_event(event)

    def _compensate(self, sub: Submission) -> None:
        process = sub.process
        if process is not None:
            # We are the parent and have not reaped it: its pid (= its group) cannot be reused.
            for signum, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(process.pid, signum)
                    process.wait(timeout=wait_s)
                    break
                except ProcessLookupError:
                    break
                except Exception:  # noqa: BLE001 - escalate to KILL
                    continue
        try:
            self.completion.end_without_receipt(sub.attempt_id, status="lost", reason="HANDLE_NOT_SAVED")
        except Exception:  # noqa: BLE001 - recovery will classify it
            pass

    # -- wait: the live fast path -------------------------------------------------------
    def wait(self, sub: Submission, *, on_tick: Callable[[], None] | None = None,
             poll_s: float = WAIT_TICK_S) -> RunView:
        """Wait for our child, then complete through the same path recovery uses."""
        if sub.process is None:
            raise UsageError("this runtime is not the task's parent; use follow/status instead")
        import subprocess

        intent = False
        next_db_look = 0.0
        while True:
            if on_tick is not None:
                on_tick()
            if time.monotonic() >= next_db_look:
                # The database is looked at about once a second, not every tick.
                next_db_look = time.monotonic() + INTENT_POLL_S
                intent = intent or self._has_intent(sub.run_id)
                if not intent and sub.deadline_at_ms is not None and now_ms() >= sub.deadline_at_ms:
                    # In-memory timer: a fast path only; recovery enforces the persisted deadline too.
                    self.canceller.request(sub.run_id, "timeout")
                    intent = True
                if intent:
                    self.canceller.dispatch_one(sub.run_id)
            try:
                returncode = sub.process.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                continue
        if on_tick is not None:
            on_tick()
        self.complete_from_wait(sub, returncode)
        self._finalize_log(sub.log_artifact_id)
        return self.status(sub.run_id)

    def _has_intent(self, run_id: str) -> bool:
        from .db.engine import session_scope
        from .db.models import Run

        with session_scope(self.engine, write=False) as session:
            run = session.get(Run, run_id)
            return run is not None and run.cancel_reason is not None

    def complete_from_wait(self, sub: Submission, returncode: int) -> CompletionResult | None:
        """Consume the receipt; if publication failed, the waited status is a trusted live observation."""
        from .consumer import ConsumeOutcome
        from .receipts.codec import Receipt

        assert self.consumer is not None
        consumed = self.consumer.consume(sub.attempt_id)
        if consumed.outcome in (ConsumeOutcome.APPLIED, ConsumeOutcome.ALREADY_TERMINAL):
            return None
        if returncode < 0 or returncode == LAUNCHER_LOST_STATUS:
            # The launcher itself died of a signal, or told us it lost the command's status: its
            # own exit says nothing about the command's. Without a receipt, recovery decides
            # (lost, or the intent's state when our dispatcher signalled it) — never a guess.
            self.recover_attempt(sub.attempt_id)
            return None
        exit_code = returncode
        observation = Receipt(schema_version=1, run_id=sub.run_id, attempt_id=sub.attempt_id,
                              callback_sequence=sub.callback_sequence, token=sub.token,
                              started_at_ms=sub.started_at_ms,
                              finished_at_ms=max(now_ms_ceil(), sub.started_at_ms), exit_code=exit_code)
        result = self.completion.complete(observation, executor_type=EXECUTOR_TYPE)
        if consumed.outcome is ConsumeOutcome.MISSING:
            # No receipt will ever come (the launcher is gone): the row rides out with the next create
            # commit or retention — no extra commit here.
            self.journal.note_consumed(sub.attempt_id)
        return result

    # -- queries --------------------------------------------------------------------
    def status(self, run_id: str) -> RunView:
        from sqlmodel import select

        from .db.engine import session_scope
        from .db.models import Run, RunAttempt

        with session_scope(self.engine, write=False) as session:
            run = session.get(Run, run_id)
            if run is None:
                raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
            attempts = list(session.exec(select(RunAttempt).where(RunAttempt.run_id == run_id)
                                         .order_by(RunAttempt.attempt_no)))
        return _view(run, attempts)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        from sqlmodel import select

        from .db.engine import session_scope
        from .db.models import Run, RunEvent

        with session_scope(self.engine, write=False) as session:
            if session.get(Run, run_id) is None:
                raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
            rows = session.exec(select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.seq))
            return [{"run_id": e.run_id, "seq": e.seq, "type": e.type, "attempt_id": e.attempt_id,
                     "status": e.status, "exit_code": e.exit_code, "reason": e.reason, "at_ms": e.at_ms}
                    for e in rows]

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunView]:
        from sqlmodel import col, select

        from .db.engine import session_scope
        from .db.models import Run, RunAttempt

        with session_scope(self.engine, write=False) as session:
            stmt = select(Run).order_by(col(Run.created_at_ms).desc(), col(Run.id).desc()).limit(limit)
            if status:
                stmt = stmt.where(Run.status == status)
            runs = list(session.exec(stmt))
            ids = [r.id for r in runs]
            attempts: dict[str, list[RunAttempt]] = {}
            if ids:
                for a in session.exec(select(RunAttempt).where(col(RunAttempt.run_id).in_(ids))):
                    attempts.setdefault(a.run_id, []).append(a)
        return [_view(r, attempts.get(r.id, [])) for r in runs]

    # -- cancellation -----------------------------------------------------------------
    def cancel(self, run_id: str, reason: str = "user") -> CancelRequest:
        """Commit the cancel intent, then dispatch TERM (KILL follows after the grace)."""
        from .cancellation import CancelRequest

        result = self.canceller.request(run_id, reason)
        if result is CancelRequest.NOT_FOUND:
            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        if result in (CancelRequest.REQUESTED, CancelRequest.ALREADY_REQUESTED):
            self.canceller.dispatch_one(run_id)
        return result

    # -- recovery -------------------------------------------------------------------
    def recover_attempt(self, attempt_id: str) -> dict[str, int]:
        """Settle one attempt now (receipt, else identity) — what a round does, for one."""
        from .reconciler import Reconciler

        return Reconciler(self).check_attempt(attempt_id).as_dict()

    def reconcile(self, *, max_rounds: int = 100_000) -> dict[str, int]:
        """One full startup pass in bounded rounds; returns the counts."""
        from .reconciler import Reconciler

        report, _rounds = Reconciler(self).full_pass(max_rounds=max_rounds)
        return report.as_dict()

    def supervisor(self, *, interval_s: float | None = None) -> Any:
        """A :class:`~ql_core.supervisor.Supervisor` for this runtime (call ``start()``/``stop()``)."""
        from .supervisor import Supervisor

        return Supervisor(self, interval_s=interval_s)

    # -- logs and wake-ups (issue 7; see ql_core.follow / ql_core.logs) ----------------------
    def start_wakeups(self, supervisor: Any) -> Any:
        """Start the configured wake-up source for ``supervisor`` (a new receipt wakes its round).

        Returns the running watch (call its ``stop()`` before stopping the
        supervisor), or None when no source is configured or the profile refuses one.
        """
        from .follow import start_supervisor_wakeups

        return start_supervisor_wakeups(self, supervisor)

    def _finalize_log(self, log_artifact_id: str) -> None:
        """After the fast path's terminal commit: cut the log to its quota, record its size (best effort)."""
        from .follow import _quietly
        from .logs import finalize_log

        _quietly(finalize_log, self, log_artifact_id)

    def log_path(self, run_id: str) -> Path:
        view = self.status(run_id)
        assert view.log_artifact_id is not None
        return paths.log_path(self.config.data_dir, view.log_artifact_id)


def _journal_name(plugins: PluginHost) -> str:
    names = plugins.journal_backends.names()
    if not names:
        from .errors import PluginError

        raise PluginError("no receipt-journal backend is registered; enable the 'edge-sqlite' plugin "
                          "(part of the edge and standalone profiles); cluster profiles need the "
                          "'cluster-fenced' plugin, which this version does not ship yet")
    return names[0]


def _view(run: Any, attempts: list[Any]) -> RunView:
    return RunView(
        run_id=run.id, name=run.name, status=run.status, exit_code=run.exit_code, reason=run.reason,
        created_at_ms=run.created_at_ms, finished_at_ms=run.finished_at_ms, deadline_at_ms=run.deadline_at_ms,
        cancel_reason=run.cancel_reason,
        log_artifact_id=attempts[-1].log_artifact_id if attempts else None,
        attempts=tuple({"attempt_id": a.id, "status": a.status, "exit_code": a.exit_code, "reason": a.reason,
                        "executor_type": a.executor_type, "pid": a.pid} for a in attempts),
    )
