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
*spawned* (the durable handle) and *terminal* (CompletionService). With a
standby task (an executor that starts its process before the run exists, so
its handle is known first: :class:`~ql_core.ports.executor.StandbyExecutor`)
the create commit records the handle too — two commits, one of them before
the command starts.

The runtime wires the four seams selected in the config — executor, receipt
store, journal backend, wake-up sources — and never looks inside them: an
attempt records the name of the executor that started it, and recovery,
cancel and wait always go back to that executor.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .clock import boot_ms, elapsed_ms_ceil, now_ms
from .config import Config
from .crashpoints import crashpoint
from .errors import NotFoundError, PersistBeforeSpawnError, PluginError, QlError, UsageError
from .ids import new_id
from .log import logger
from . import paths
from .paths import ensure_data_dir, log_relative_path
from .ports.context import RuntimeContext
from .records import NewRun, RunView

if TYPE_CHECKING:
    from .cancellation import Canceller, CancelRequest
    from .completion import CompletionResult, CompletionService
    from .consumer import ReceiptConsumer
    from .plugins import PluginHost
    from .ports.executor import Executor, ExitObservation, SpawnedTask, SpawnRequest
    from .ports.journal import JournalBackend
    from .ports.receipt_store import ReceiptStore
    from .records import AttemptRecord, EventRecord

__all__ = ["Runtime", "Submission", "RunView"]

#: How often a waiting host re-reads the run for a cancel intent or a due KILL (it blocks in between).
INTENT_POLL_S = 1.0
#: How soon a waiting host retries an intent the run store was too busy to take.
BUSY_RETRY_S = 0.2
#: How often :meth:`Runtime.wait` looks at a run it is not the parent of (re-attached, or queued).
REATTACH_POLL_S = 0.2
#: How long a host that reaped an awaited task too late to place its end waits for the receipt it
#: then lets the task's publisher publish (it stops waiting as soon as the publisher is gone).
RELEASED_RECEIPT_WAIT_S = 10.0


def _remaining_s(sub: Submission) -> float:
    """Seconds until ``sub``'s deadline, on the boot clock from its committed start (a wall clock
    stepped while it runs moves nothing); the wall clock when the start has no boot-clock time."""
    assert sub.deadline_at_ms is not None
    timeout_ms = sub.deadline_at_ms - sub.started_at_ms
    if sub.started_boot_ms is not None:
        elapsed = elapsed_ms_ceil(sub.started_boot_ms)
        if elapsed is not None:
            return (timeout_ms - elapsed) / 1000
    return (sub.deadline_at_ms - now_ms()) / 1000


@dataclass
class Submission:
    """A submitted run. ``task`` is set while this runtime is the task's parent (the live path).

    A run queued for a cluster worker (``profile = "cluster-control"``) has no attempt yet:
    ``attempt_id``, ``log_artifact_id`` and ``executor`` are None until a worker claims it.
    """

    run_id: str
    attempt_id: str | None
    log_artifact_id: str | None
    callback_sequence: int
    started_at_ms: int
    deadline_at_ms: int | None
    #: The registered name of the executor that started it.
    executor: str | None
    token: str = field(default="", repr=False)
    task: SpawnedTask | None = field(default=None, repr=False)
    #: Spawned for a host that waits for it: its receipt is held back for our acknowledgement.
    awaited: bool = False
    #: CLOCK_BOOTTIME (ms) read with ``started_at_ms``: durations (the deadline) are measured from it.
    started_boot_ms: int | None = None
    #: The log artifact's quota (None: the profile's).
    log_max_bytes: int | None = None


class Runtime:
    """One node's ql runtime: plugins, run store, executor(s), receipts, completion."""

    def __init__(self, config: Config, *, plugins: PluginHost, node_id: str, create: bool = True,
                 data_dir_in_use: bool = False) -> None:
        self.config = config
        self.profile = config.profile
        self.plugins = plugins
        self.node_id = node_id
        self._data_dir_identity = _dir_identity(config.data_dir)
        self.context = RuntimeContext(config=config, node_id=node_id, existing_only=not create,
                                      data_dir_in_use=data_dir_in_use)
        self._executors: dict[str, Executor | None] = {}
        #: Can submitted tasks be standby tasks here (the executor and the run store both able)?
        self._takes_standby: bool | None = None
        self._lazy_lock = threading.RLock()
        # Every selected seam must be registered (one-line error naming what is installed) — checked
        # now; the executor and receipt store are *built* on first use, so a reader (`ql status`)
        # never imports the launcher, subprocess or the receipt codec.
        for key, registry in (("executor", plugins.executors), ("receipt_store", plugins.receipt_stores),
                              ("journal", plugins.journal_backends)):
            self._require_registered(key, registry, getattr(config, key))
        self.journal: JournalBackend = plugins.journal_backends.create(config.journal, self.context)
        if create:
            # A runtime that runs tasks builds them now, so a bad [plugin.<name>] table fails at start.
            _ = self.executor, self.receipts

    def _require_registered(self, key: str, registry: Any, name: str | None) -> None:
        from .plugins import explain_unregistered

        if name is not None and name not in registry.names():
            raise PluginError(explain_unregistered(key, name, self.config, self.plugins))

    @property
    def executor(self) -> Executor | None:
        """The selected executor (built on first use); None on a node that runs no tasks."""
        return self.executor_for(self.config.executor) if self.config.executor is not None else None

    @functools.cached_property
    def receipts(self) -> ReceiptStore | None:
        """The selected receipt store (built on first use); None on a node that runs no tasks."""
        if self.config.receipt_store is None:
            return None
        with self._lazy_lock:
            return self.plugins.receipt_stores.create(self.config.receipt_store, self.context)

    @functools.cached_property
    def completion(self) -> CompletionService:
        from .completion import CompletionService

        return CompletionService(self.journal, node_id=self.node_id, retries=self.profile.completion_retries,
                                 notify=self.plugins.notify_event,
                                 executor_known=lambda name: self.executor_for(name) is not None,
                                 elapsed=self.attempt_elapsed_ms)

    @functools.cached_property
    def consumer(self) -> ReceiptConsumer | None:
        from .consumer import ReceiptConsumer

        receipts = self.receipts
        return ReceiptConsumer(receipts, self.journal, self.completion) if receipts is not None else None

    @functools.cached_property
    def canceller(self) -> Canceller:
        from .cancellation import Canceller

        return Canceller(self.journal, self.executor_for, self.node_id, self.profile, self.plugins.notify_event)

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def open(cls, config: Config, *, create: bool = True, environ: dict[str, str] | None = None) -> Runtime:
        """Load the configured plugins and open the run store.

        ``create=True`` (submitting, recovering): create the data dir and its node id if missing and
        migrate the schema. ``create=False`` (reading: status, list, events, logs): open only what
        exists — a missing data dir or database is a :class:`~ql_core.errors.NotFoundError` naming the
        fix, nothing is created or migrated (the runtime may still settle an attempt it shows).
        """
        from .errors import NotFoundError
        from .paths import existing_data_dir, read_node_id

        if not create:
            data_dir = existing_data_dir(config.data_dir)
            found = read_node_id(data_dir)
            if found is None:
                raise NotFoundError(f"{data_dir} holds no ql data (no node_id): nothing has run with this data "
                                    f"dir; check --data-dir / QL_DATA_DIR")
            return cls._assemble(config, data_dir, environ, node_id=found, create=False, in_use=True)
        found = read_node_id(config.data_dir)  # first: an unreadable data dir is explained by who owns it
        data_dir = ensure_data_dir(config.data_dir)
        if found is None:
            # First use (or one racing ours): node id and run store are set up under one lock, so a
            # node id without a database only ever means a lost database.
            from .paths import first_use_lock, write_node_id

            with first_use_lock(data_dir):
                found = read_node_id(data_dir)
                if found is None:
                    rt = cls._assemble(config, data_dir, environ, node_id=new_id(), create=True, in_use=False)
                    try:
                        # Written only now that the run store exists: the node id is the mark of a
                        # data dir whose database was created.
                        write_node_id(data_dir, rt.node_id)
                    except BaseException:
                        rt.close()
                        raise
                    return rt
        return cls._assemble(config, data_dir, environ, node_id=found, create=True, in_use=True)

    @classmethod
    def _assemble(cls, config: Config, data_dir: Path, environ: dict[str, str] | None, *, node_id: str,
                  create: bool, in_use: bool) -> Runtime:
        """The runtime on ``data_dir`` (the canonical form of the configured one) with its plugins."""
        from dataclasses import replace

        from .plugins import load_plugin_host

        if data_dir != config.data_dir:
            config = replace(config, data_dir=data_dir)
        plugins = load_plugin_host(config.plugins, environ, optional=config.seam_plugins)
        return cls(config, plugins=plugins, node_id=node_id, create=create, data_dir_in_use=in_use)

    def close(self) -> None:
        """Close the run store and drop what executors keep ready (a standby launcher exits, having
        run nothing). Running tasks are not touched: they outlive the runtime."""
        with self._lazy_lock:
            executors = [e for e in self._executors.values() if e is not None]
        for executor in executors:
            close = getattr(executor, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - closing the store matters more
                    logger.warning("closing executor {} failed: {}", type(executor).__name__, type(exc).__name__)
        self.journal.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def executor_for(self, name: str) -> Executor | None:
        """The executor registered as ``name`` (built once), or None when it is not installed here."""
        with self._lazy_lock:
            if name not in self._executors:
                if name in self.plugins.executors.names():
                    self._executors[name] = self.plugins.executors.create(name, self.context)
                else:
                    self._executors[name] = None
            return self._executors[name]

    def attempt_elapsed_ms(self, attempt: AttemptRecord) -> int | None:
        """How long ``attempt`` has run since its committed start, measured by its executor on a
        clock that does not step (ports.executor, "Durations"); None when it cannot tell (no such
        method, no recorded start, another boot or another node): callers then use the wall clock."""
        if attempt.started_at_ms is None or not attempt.handle:
            return None
        measure = getattr(self.executor_for(attempt.executor), "elapsed_ms", None)
        if not callable(measure):
            return None
        try:
            elapsed = measure(attempt.handle)
        except Exception:  # noqa: BLE001 - a plugin's failure to measure: the wall clock decides
            return None
        return elapsed if isinstance(elapsed, int) and not isinstance(elapsed, bool) and elapsed >= 0 else None

    def deadline_passed(self, run_id: str) -> bool:
        """Has ``run_id``'s deadline passed? A duration: the current attempt's time since its
        committed start on its executor's clock that does not step, compared with the deadline's
        distance from that start — never two wall clocks (the submitter's, ours). The wall clock
        only when the executor cannot measure (then the task cannot have survived a reboot, or it
        runs elsewhere)."""
        run = self.journal.run(run_id)
        if run is None or run.deadline_at_ms is None:
            return False
        attempt = self.journal.attempt(run.current_attempt_id) if run.current_attempt_id else None
        if attempt is not None and attempt.started_at_ms is not None:
            elapsed = self.attempt_elapsed_ms(attempt)
            if elapsed is not None:
                return elapsed >= run.deadline_at_ms - attempt.started_at_ms
        return now_ms() >= run.deadline_at_ms

    def _require_executor(self) -> tuple[Executor, ReceiptStore]:
        if self.executor is None or self.receipts is None:
            raise UsageError(f"profile {self.profile.name!r} does not run local processes; "
                             f"submit from an edge, standalone or cluster-worker node")
        return self.executor, self.receipts

    # -- submit: persist before spawn ----------------------------------------------
    def submit(self, command: Sequence[str], *, shell: bool = False, name: str | None = None,
               timeout_s: float | None = None, cwd: str | None = None,
               env: dict[str, str] | None = None, log_max_bytes: int | None = None,
               max_attempts: int = 1, awaited: bool = False) -> Submission:
        """Persist the run, then spawn it. Nothing is spawned unless the create commit succeeded.

        ``awaited=True`` promises that this host will :meth:`wait` for the submission: the task's
        receipt is then held back and published only if this host dies before it committed the
        status it reaped (acknowledged completion, the cheapest safe path; :meth:`run` uses it).
        A host that stops waiting calls :meth:`detach` so the task publishes its receipt itself.

        ``log_max_bytes`` overrides the profile's per-attempt log quota for this run. On a node that
        runs no tasks but whose run store queues them (cluster-control), the run is queued for a
        worker instead (``max_attempts`` > 1 only for tasks safe to run again after a lost attempt).
        """
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
        if self.executor is None:
            return self._enqueue(tuple(command), shell=shell, name=name, timeout_s=timeout_s, cwd=cwd, env=env,
                                 max_attempts=max_attempts)
        if max_attempts != 1:
            raise UsageError("retries (max_attempts > 1) exist only for runs queued to cluster workers")
        executor, _receipts = self._require_executor()
        standby = self._standby(executor, tuple(command), shell=shell, cwd=cwd, env=env, awaited=awaited)
        sub = self._create_run(name=name, timeout_s=timeout_s, log_max_bytes=log_max_bytes, standby=standby)
        sub.awaited = awaited
        if standby is not None:
            return self._start_standby(executor, sub, standby, tuple(command), shell=shell, cwd=cwd, env=env)
        return self._spawn(executor, sub, tuple(command), shell=shell, cwd=cwd, env=env)

    def run(self, command: Sequence[str], *, on_tick: Callable[[], None] | None = None,
            **options: Any) -> RunView:
        """Submit ``command`` and wait for its end: :meth:`submit` (``awaited``) plus :meth:`wait`."""
        return self.wait(self.submit(command, awaited=True, **options), on_tick=on_tick)

    def detach(self, sub: Submission) -> None:
        """Stop being the waiting host of ``sub``: its task publishes its receipt when it ends, and
        recovery (a supervisor, ``ql reconcile``) completes it. Idempotent."""
        if sub.task is not None and sub.awaited and sub.executor is not None:
            executor = self.executor_for(sub.executor)
            if executor is not None:
                executor.acknowledge(sub.task, committed=False)
        sub.awaited = False

    def _enqueue(self, command: tuple[str, ...], *, shell: bool, name: str | None, timeout_s: float | None,
                 cwd: str | None, env: dict[str, str] | None, max_attempts: int) -> Submission:
        """Queue the run for a worker (the run store must be able to: cluster-fenced)."""
        from .ports.journal import QueuedRun, QueueingBackend, TaskSpec
        from .retrying import retrying

        if not isinstance(self.journal, QueueingBackend):
            self._require_executor()  # raises: this profile runs nothing and its store queues nothing
        if not 1 <= max_attempts <= 100:
            raise UsageError("max_attempts must be between 1 and 100")
        journal: Any = self.journal
        run = QueuedRun(run_id=new_id(), name=name, created_at_ms=now_ms(),
                        spec=TaskSpec(command=command, shell=shell, cwd=cwd, env=dict(env) if env else None),
                        timeout_ms=int(timeout_s * 1000) if timeout_s is not None else None,
                        max_attempts=max_attempts)
        for event in retrying(lambda: journal.enqueue(run), retries=self.profile.completion_retries):
            self.plugins.notify_event(event)
        return Submission(run_id=run.run_id, attempt_id=None, log_artifact_id=None, callback_sequence=0,
                          started_at_ms=run.created_at_ms, deadline_at_ms=None, executor=None)

    def _standby(self, executor: Executor, command: tuple[str, ...], *, shell: bool, cwd: str | None,
                 env: dict[str, str] | None, awaited: bool) -> SpawnedTask | None:
        """A standby task for this run when the executor offers one and the run store can record its
        handle in the create commit; None: the classic path (spawn after the create commit)."""
        from .ports.executor import StandbyExecutor, check_handle
        from .ports.journal import RunningCreate, TaskSpec

        if self._takes_standby is None:  # the configured executor and the run store never change
            self._takes_standby = isinstance(executor, StandbyExecutor) and isinstance(self.journal, RunningCreate)
        if not self._takes_standby:
            return None
        task = executor.standby(TaskSpec(command=command, shell=shell, cwd=cwd, env=env),  # type: ignore[attr-defined]
                                awaited=awaited)
        if task is None:
            return None
        try:
            handle = check_handle(task.handle)
        except ValueError:
            handle = None
        if handle is None:  # identity unreadable: the classic path decides what happens then
            executor.abort(task)
            return None
        return task

    def _create_run(self, *, name: str | None, timeout_s: float | None, log_max_bytes: int | None = None,
                    standby: SpawnedTask | None = None) -> Submission:
        """The *create* commit. Any failure here means: nothing is spawned (a standby task is dropped,
        having been given nothing)."""
        from .retrying import retrying
        from .tokens import hash_token, new_token

        executor, receipts = self._require_executor()
        assert self.config.executor is not None
        run_id, attempt_id, log_id = new_id(), new_id(), new_id()
        token = new_token()  # 256 bits, 43 chars of [A-Za-z0-9_-]
        # The committed start, read on both clocks at once: stored times are wall-clock, durations
        # (the deadline, the finish time the launcher writes) count on the boot clock from here.
        now, boot = now_ms(), boot_ms()
        deadline = now + int(timeout_s * 1000) if timeout_s is not None else None
        new = NewRun(run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id, name=name,
                     executor=self.config.executor, runtime_owner=self.node_id,
                     callback_token_hash=hash_token(token), created_at_ms=now, deadline_at_ms=deadline,
                     log_relative_path=log_relative_path(log_id),
                     log_max_bytes=log_max_bytes or self.profile.log_max_bytes,
                     receipt_ref=receipts.relative_ref(attempt_id), host_handle=executor.host_handle())
        journal: Any = self.journal
        write = (lambda: journal.create(new)) if standby is None else (
            lambda: journal.create_running(new, handle=standby.handle))
        try:
            events = retrying(write, retries=self.profile.completion_retries)
        except Exception as exc:  # any failure of the create commit means: do not spawn
            if standby is not None:
                executor.abort(standby)
            raise PersistBeforeSpawnError(
                f"could not persist the run before spawning it, so nothing was started "
                f"({type(exc).__name__}: {exc}); check the data dir with `ql doctor` and retry") from exc
        for event in events:
            self.plugins.notify_event(event)
        return Submission(run_id=run_id, attempt_id=attempt_id, log_artifact_id=log_id, callback_sequence=1,
                          started_at_ms=now, deadline_at_ms=deadline, executor=self.config.executor, token=token,
                          started_boot_ms=boot, log_max_bytes=new.log_max_bytes)

    def _prepare_locations(self, sub: Submission, *, drop: Callable[[], None] | None = None) -> tuple[str, int]:
        """The receipt location and the open log artifact of ``sub`` (after its create commit). On
        failure nothing runs: ``drop`` discards a standby task, and the run is marked failed."""
        from .logs import open_log_artifact
        from .ports.receipt_store import ReceiptStoreError

        assert self.receipts is not None and sub.attempt_id is not None and sub.log_artifact_id is not None
        reason = "RECEIPT_LOCATION_UNAVAILABLE"
        try:
            location = self.receipts.prepare(sub.attempt_id)
            reason = "LOG_ARTIFACT_UNAVAILABLE"
            log_fd = open_log_artifact(self.config.data_dir, sub.log_artifact_id)
            crashpoint("spawn.after_log_created")
        except (OSError, QlError, ValueError, ReceiptStoreError) as exc:
            if drop is not None:
                drop()
            ended = self.completion.end_never_ran(sub.attempt_id, reason=reason)
            # A store's own message is written for users (the OS error, the path); others by name.
            detail = (getattr(exc, "strerror", None) or (isinstance(exc, ReceiptStoreError) and str(exc))
                      or type(exc).__name__)
            raise QlError(f"cannot prepare the log or receipt location in {self.config.data_dir} ({detail}); "
                          f"nothing ran and run {sub.run_id} is marked {ended.status or 'failed'}; "
                          f"run `ql doctor`") from None
        return location, log_fd

    def _request(self, sub: Submission, location: str, command: tuple[str, ...], *, shell: bool,
                 cwd: str | None, env: dict[str, str] | None) -> SpawnRequest:
        from .ports.executor import SpawnRequest

        assert sub.attempt_id is not None and sub.log_artifact_id is not None
        return SpawnRequest(run_id=sub.run_id, attempt_id=sub.attempt_id,
                            callback_sequence=sub.callback_sequence, token=sub.token,
                            started_at_ms=sub.started_at_ms, command=command, shell=shell,
                            log_path=paths.log_path(self.config.data_dir, sub.log_artifact_id),
                            receipt_location=location, cwd=cwd, env=env, awaited=sub.awaited,
                            timeout_ms=(sub.deadline_at_ms - sub.started_at_ms
                                        if sub.deadline_at_ms is not None else None),
                            cancel_grace_ms=int(self.profile.cancel_grace_s * 1000),
                            log_max_bytes=sub.log_max_bytes or self.profile.log_max_bytes,
                            started_boot_ms=sub.started_boot_ms)

    def _start_standby(self, executor: Executor, sub: Submission, task: SpawnedTask, command: tuple[str, ...], *,
                       shell: bool, cwd: str | None, env: dict[str, str] | None) -> Submission:
        """A standby task whose handle the create commit holds: hand it its run (the go-ahead)."""
        assert sub.attempt_id is not None
        location, log_fd = self._prepare_locations(sub, drop=lambda: executor.abort(task))
        try:
            executor.start(task, self._request(sub, location, command, shell=shell, cwd=cwd, env=env),  # type: ignore[attr-defined]
                           log_fd=log_fd)
        except Exception as exc:  # noqa: BLE001 - whatever the executor raised, nothing was handed over
            # Nothing was handed over, so nothing runs: the run is closed, never left running —
            # failed, or cancelled/timed out when a committed intent's signal is why (it reached the
            # standby after the create commit and ended it: the submit then stands, the run ended).
            executor.abort(task)
            ended = self.completion.end_never_ran(sub.attempt_id, reason="SPAWN_FAILED")
            if ended.status in ("cancelled", "timed_out"):
                return sub
            if _launcher_gone(exc):
                # The standby died, or stopped taking messages, between being taken and the hand-over
                # (killed, a full or broken channel): the run truthfully ended failed, nothing ran.
                # That is no error of the caller's, and a host must never die of it: submit stands.
                logger.warning("run {}: its standby launcher was gone before the hand-over ({}); nothing ran, "
                               "the run is marked {}", sub.run_id, _errno_name(exc), ended.status or "failed")
                return sub
            raise QlError(f"cannot start the task ({_spawn_failure(exc)}); nothing ran and run {sub.run_id} "
                          f"is marked failed") from None
        finally:
            os.close(log_fd)
        crashpoint("start.after_hand_over")
        sub.task = task
        return sub

    def _spawn(self, executor: Executor, sub: Submission, command: tuple[str, ...], *, shell: bool,
               cwd: str | None, env: dict[str, str] | None) -> Submission:
        location, log_fd = self._prepare_locations(sub)
        try:
            task = executor.spawn(self._request(sub, location, command, shell=shell, cwd=cwd, env=env), log_fd=log_fd)
        except Exception as exc:
            # Nothing runs: the create commit is closed with a terminal state, never left "starting".
            assert sub.attempt_id is not None
            self.completion.end_never_ran(sub.attempt_id, reason="SPAWN_FAILED")
            raise QlError(f"cannot start the task ({_spawn_failure(exc)}); nothing ran and run {sub.run_id} "
                          f"is marked failed") from None
        finally:
            os.close(log_fd)
        sub.task = task
        self._record_spawned(executor, sub, task)
        try:
            executor.release(task)  # only now may the command start: its handle is durable
        except OSError as exc:
            if not _launcher_gone(exc):
                raise
            # The launcher died before its go-ahead (its channel is broken): it never got the token,
            # so its command never started. The run ends so, and the host goes on.
            sub.task = None
            executor.abort(task)
            assert sub.attempt_id is not None
            ended = self.completion.end_never_ran(sub.attempt_id, reason="SPAWN_FAILED")
            logger.warning("run {}: its launcher was gone before its go-ahead ({}); nothing ran, the run is "
                           "marked {}", sub.run_id, _errno_name(exc), ended.status or "failed")
        return sub

    def _record_spawned(self, executor: Executor, sub: Submission, task: SpawnedTask) -> None:
        """Second commit: the durable handle. Without it the task must not run (ADR-0007 §2.2)."""
        from .ports.executor import check_handle

        try:
            handle = check_handle(task.handle)
            if handle is None:
                raise QlError("the executor could not read the task's identity")
            self.completion.record_spawned(sub.attempt_id, handle=handle, started_at_ms=sub.started_at_ms)
        except Exception as exc:  # noqa: BLE001 - compensate: the command must never start
            executor.abort(task)
            try:
                self.completion.end_never_ran(sub.attempt_id, reason="HANDLE_NOT_SAVED")
            except Exception:  # noqa: BLE001 - recovery will classify it
                pass
            raise QlError(f"the task's durable handle could not be saved ({type(exc).__name__}), so its command "
                          f"was never started; run {sub.run_id} marked failed") from None

    # -- wait: the live fast path -------------------------------------------------------
    def wait(self, sub: Submission | str, *, on_tick: Callable[[], None] | None = None,
             tick_s: float = INTENT_POLL_S) -> RunView:
        """Block until the run ends and return its final view.

        With the :class:`Submission` this runtime spawned (the live path) it blocks on the child,
        then completes through the same path recovery uses. Between wake-ups (at most every
        ``tick_s``, and exactly at the deadline) it commits a timeout intent when the deadline
        passed and dispatches a cancel intent's signals (TERM, KILL after the grace).

        With a run id (re-attaching after this host restarted) or a queued submission it watches
        the run instead, settling this node's attempt from its receipt or process identity and
        enforcing its deadline, as a supervisor round would. ``on_tick`` runs at each wake-up (a
        CLI streams the log there).
        """
        if isinstance(sub, str) or sub.task is None:
            return self._watch(sub if isinstance(sub, str) else sub.run_id, on_tick=on_tick)
        assert sub.executor is not None and sub.attempt_id is not None and sub.log_artifact_id is not None
        executor = self.executor_for(sub.executor)
        assert executor is not None
        try:
            observed = self._wait_live(sub, executor, on_tick=on_tick, tick_s=tick_s)
        except BaseException:
            self.detach(sub)  # we stop waiting: the task publishes its own receipt
            raise
        if on_tick is not None:
            on_tick()
        self.complete_from_wait(sub, observed)
        view = self.status(sub.run_id)
        if not view.terminal:
            # Our child (the launcher) is gone but the run is not over: its command runs on in its
            # process group, or its end is still being proven. Watch it like a re-attached host.
            view = self._watch(sub.run_id, on_tick=on_tick)
        self._finalize_log(sub.log_artifact_id)
        return view

    def _wait_live(self, sub: Submission, executor: Executor, *, on_tick: Callable[[], None] | None,
                   tick_s: float) -> ExitObservation:
        """Block on our child until it exits, enforcing the deadline and dispatching intents.

        A run store that stays busy (another process holds the write lock past the retries) does not
        end the wait: the intent or its dispatch is tried again after a short pause — the task is
        still ours to watch, and recovery enforces the persisted deadline as well."""
        from .ports.journal import StoreBusyError, ConflictError

        intent = False
        while True:
            self._check_data_dir()
            if on_tick is not None:
                on_tick()
            busy = False
            try:
                if not intent:
                    intent = self._has_intent(sub.run_id)
                if not intent and sub.deadline_at_ms is not None and _remaining_s(sub) <= 0:
                    # In-memory timer: a fast path only; the launcher and recovery enforce the
                    # persisted deadline too.
                    self.canceller.request(sub.run_id, "timeout")
                    intent = True
                if intent:
                    self.canceller.dispatch_one(sub.run_id)
            except (StoreBusyError, ConflictError) as exc:
                busy = True
                logger.warning("run {}: the run store is busy ({}); the deadline and intents are retried",
                               sub.run_id, type(exc).__name__)
            timeout = BUSY_RETRY_S if busy else tick_s
            if not intent and not busy and sub.deadline_at_ms is not None:
                timeout = min(timeout, max(0.0, _remaining_s(sub)))
            observed = executor.wait(sub.task, timeout)
            if observed is not None:
                return observed

    def _check_data_dir(self) -> None:
        """Fail loudly if the data dir was deleted or replaced under us: never recreate a history."""
        if _dir_identity(self.config.data_dir) != self._data_dir_identity:
            raise QlError(f"the data dir {self.config.data_dir} was deleted or replaced while this runtime used "
                          f"it: its run history is gone there. Restore it from a backup; the task may still be "
                          f"running (its log and receipt went with the directory)")

    def _watch(self, run_id: str, *, on_tick: Callable[[], None] | None) -> RunView:
        """Wait for a run this runtime is not the parent of: look, settle, sleep, until it is terminal."""
        from .ports.journal import ConflictError, StoreBusyError

        while True:
            self._check_data_dir()
            if on_tick is not None:
                on_tick()
            view = self.status(run_id)
            if view.terminal:
                return view
            try:
                self.settle(view)
            except (StoreBusyError, ConflictError) as exc:  # another writer holds the store: next time
                logger.warning("run {}: the run store is busy ({}); retrying", run_id, type(exc).__name__)
            view = self.status(run_id)
            if view.terminal:
                if on_tick is not None:
                    on_tick()
                return view
            time.sleep(REATTACH_POLL_S)

    def settle(self, view: RunView) -> None:
        """Try to end a non-terminal run shown to a reader: its passed deadline becomes a timeout intent
        (and its signals are dispatched), and this node's attempt is settled from its receipt or its
        process identity — what a supervisor round would do for it, bounded to this one run."""
        if view.terminal or self.consumer is None or view.current_attempt is None:
            return
        if view.deadline_at_ms is not None and view.cancel_reason is None and self.deadline_passed(view.run_id):
            self.canceller.request(view.run_id, "timeout")
        if view.cancel_reason is not None or view.deadline_at_ms is not None:
            self.canceller.dispatch_one(view.run_id)
        self.recover_attempt(view.current_attempt.attempt_id)

    def _has_intent(self, run_id: str) -> bool:
        run = self.journal.run(run_id)
        return run is not None and run.cancel_reason is not None

    def complete_from_wait(self, sub: Submission, observed: ExitObservation) -> CompletionResult | None:
        """End the attempt from what this host saw when it reaped the task.

        The status the host reaped is kernel truth: the receipt is applied only when it agrees; one
        that disagrees (forged by a same-user task) is quarantined and an ``attempt.receipt_rejected``
        audit event records it (the consumer does, on every path) before the observed outcome is
        committed. Without a receipt (publication failed), the observation alone decides.
        """
        from .consumer import ConsumeOutcome
        from .ports.journal import EventSpec
        from .receipts.codec import Receipt

        assert self.consumer is not None and sub.attempt_id is not None
        if observed.held_receipt and observed.exit_code is not None:
            return self._complete_held(sub, observed)
        consumed = self.consumer.consume(sub.attempt_id, observed_exit_code=observed.exit_code)
        if consumed.outcome in (ConsumeOutcome.APPLIED, ConsumeOutcome.ALREADY_TERMINAL):
            return None
        if observed.exit_code is None:
            # The executor cannot vouch for the task's status (its launcher died, or lost the
            # status): say so in an event, then recovery decides — the command may run on (the
            # waiter keeps watching it), and without a receipt it ends lost, or in the intent's
            # state when our dispatcher signalled it — never a guess.
            if observed.detail:
                self.completion.note(sub.attempt_id, EventSpec("attempt.observation_lost", attempt_id=sub.attempt_id,
                                                               reason=observed.detail[:80]))
            self.recover_attempt(sub.attempt_id)
            return None
        observation = Receipt(schema_version=1, run_id=sub.run_id, attempt_id=sub.attempt_id,
                              callback_sequence=sub.callback_sequence, token=sub.token,
                              started_at_ms=sub.started_at_ms,
                              finished_at_ms=max(observed.finished_at_ms, sub.started_at_ms),
                              exit_code=observed.exit_code)
        result = self.completion.complete(observation, executor=sub.executor)
        if consumed.outcome in (ConsumeOutcome.MISSING, ConsumeOutcome.UNUSABLE):
            # No receipt will ever come (the launcher is gone): the row rides out with the next create
            # commit or retention — no extra commit here.
            self.journal.note_consumed(sub.attempt_id)
        return result

    def _complete_held(self, sub: Submission, observed: ExitObservation) -> CompletionResult | None:
        """Acknowledged completion: commit the status the host reaped, then tell the task's
        publisher it has nothing to publish. Any failure before the acknowledgement leaves the
        receipt to the publisher (and the run to the receipt path): the host dying at any step
        never loses the true status and never commits a second one.

        A receipt already in the slot is looked at first (one failed open when there is none, the
        usual case): the publisher's own, published because this host was too slow to answer
        (stopped, say) and agreeing with what we reaped, completes the run as any receipt; any
        other is a forgery, quarantined with an ``attempt.receipt_rejected`` event, and what we
        reaped is committed."""
        from .consumer import ConsumeOutcome
        from .receipts.codec import Receipt

        assert sub.task is not None and sub.executor is not None and sub.attempt_id is not None
        assert self.consumer is not None
        executor = self.executor_for(sub.executor)
        assert executor is not None and observed.exit_code is not None
        crashpoint("wait.after_exit")
        consumed = self.consumer.consume(sub.attempt_id, observed_exit_code=observed.exit_code)
        if consumed.outcome in (ConsumeOutcome.APPLIED, ConsumeOutcome.ALREADY_TERMINAL):
            executor.acknowledge(sub.task, committed=True)  # its publisher published already
            sub.awaited = False
            return None
        if self._intent_not_beaten(sub, observed.finished_at_ms):
            # Our finish time only says "it ended before we reaped it". Reaped late (this host was
            # stopped, or waiting for another run), that bound lies past a deadline or a cancel the
            # task may have beaten. The publisher holds the launcher's own finish time: let it
            # publish, and apply that receipt (checked against what we reaped).
            executor.acknowledge(sub.task, committed=False)
            sub.awaited = False
            if self._consume_released(sub, executor, observed.exit_code):
                return None
            # No receipt came (its publisher is gone): what we reaped decides, on our bound.
        observation = Receipt(schema_version=1, run_id=sub.run_id, attempt_id=sub.attempt_id,
                              callback_sequence=sub.callback_sequence, token=sub.token,
                              started_at_ms=sub.started_at_ms,
                              finished_at_ms=max(observed.finished_at_ms, sub.started_at_ms),
                              exit_code=observed.exit_code)
        from .ports.journal import ConflictError, StoreBusyError

        try:
            result = self.completion.complete(observation, executor=sub.executor)
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
        crashpoint("wait.before_ack")
        executor.acknowledge(sub.task, committed=True)
        sub.awaited = False
        crashpoint("wait.after_ack")
        # No receipt will ever come: the journal row rides out with the next create commit or
        # retention — no extra commit here.
        self.journal.note_consumed(sub.attempt_id)
        return result

    def _intent_not_beaten(self, sub: Submission, finished_at_ms: int) -> bool:
        """Would an intent — the deadline, a committed cancel — apply to a task that ended at
        ``finished_at_ms`` (the host's upper bound of its end)?"""
        if sub.deadline_at_ms is not None and finished_at_ms >= sub.deadline_at_ms:
            return True
        run = self.journal.run(sub.run_id)
        return run is not None and run.cancel_reason is not None

    def _consume_released(self, sub: Submission, executor: Executor, exit_code: int) -> bool:
        """After an awaited task's publisher was told "no ok": apply the receipt it publishes (one
        that disagrees with ``exit_code`` is quarantined), waiting while it is still there to publish
        (its launcher's group still has a member), at most :data:`RELEASED_RECEIPT_WAIT_S`. True when
        the run has ended from a receipt."""
        from .consumer import ConsumeOutcome
        from .ports.executor import IdentityState

        assert sub.task is not None and sub.attempt_id is not None and self.consumer is not None
        end = time.monotonic() + RELEASED_RECEIPT_WAIT_S
        while True:
            publishing = executor.inspect(sub.task.handle) is IdentityState.RUNNING
            consumed = self.consumer.consume(sub.attempt_id, observed_exit_code=exit_code)
            if consumed.outcome in (ConsumeOutcome.APPLIED, ConsumeOutcome.ALREADY_TERMINAL):
                return True
            if not publishing or time.monotonic() >= end:
                return False
            time.sleep(0.01)

    # -- queries --------------------------------------------------------------------
    def status(self, run_id: str) -> RunView:
        view = self.journal.view(run_id)
        if view is None:
            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        return view

    def events(self, run_id: str) -> list[EventRecord]:
        events = self.journal.events(run_id)
        if events is None:
            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        return events

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunView]:
        return self.journal.list_views(status=status, limit=limit)

    # -- cancellation -----------------------------------------------------------------
    def cancel(self, run_id: str, reason: str = "user") -> CancelRequest:
        """Commit the cancel intent, then dispatch TERM (KILL follows after the grace)."""
        from .cancellation import CancelRequest

        from .ports.journal import QueueingBackend

        if self.executor is None and isinstance(self.journal, QueueingBackend):
            # A control node: the worker holding the run's lease learns the intent and signals.
            result = CancelRequest(self.journal.request_cancel(run_id, reason))
        else:
            result = self.canceller.request(run_id, reason)
        if result is CancelRequest.NOT_FOUND:
            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        if result in (CancelRequest.REQUESTED, CancelRequest.ALREADY_REQUESTED) and self.executor is not None:
            # On a node that runs no tasks the intent is all: the node running the task signals it.
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

    # -- logs and wake-ups (see ql_core.follow / ql_core.logs) -------------------------------
    def start_wakeups(self, supervisor: Any) -> Any:
        """Start the configured wake-up source for ``supervisor`` (a new receipt wakes its round).

        Returns the running watch (call its ``stop()`` before stopping the
        supervisor), or None when no source is configured or the profile refuses one.
        """
        from .follow import start_supervisor_wakeups

        return start_supervisor_wakeups(self, supervisor)

    def _finalize_log(self, log_artifact_id: str) -> None:
        """After the fast path's terminal commit: cut the log to its quota (best effort)."""
        from .follow import _quietly
        from .logs import finalize_log

        _quietly(finalize_log, self, log_artifact_id)

    def log_path(self, run_id: str) -> Path:
        view = self.status(run_id)
        assert view.log_artifact_id is not None
        return paths.log_path(self.config.data_dir, view.log_artifact_id)


def _dir_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


#: What sending a launcher its go-ahead (a standby its run) fails with when the launcher, not the
#: host or the caller, is the cause: it died (EPIPE, ECONNRESET, ENOTCONN, ECONNREFUSED) or its
#: channel takes nothing now (EAGAIN, ENOBUFS). Nothing was delivered, so nothing ran.
_LAUNCHER_GONE = frozenset((errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED, errno.EAGAIN,
                            errno.EWOULDBLOCK, errno.ENOBUFS))


def _launcher_gone(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _LAUNCHER_GONE


def _errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, type(exc).__name__) if isinstance(code, int) else type(exc).__name__


def _spawn_failure(exc: BaseException) -> str:
    """A one-line cause for a failed spawn that names the fix (never the command itself)."""
    import errno

    if isinstance(exc, OSError):
        if exc.errno == errno.E2BIG:
            return "the argument list or environment is too long for the system (E2BIG); shorten it"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"{exc.strerror}: check --cwd and that /bin/sh exists"
        if exc.errno == errno.EACCES:
            return f"{exc.strerror}: check the permissions of --cwd"
        return exc.strerror or type(exc).__name__
    return type(exc).__name__
