"""Submitting: persist before spawn (DESIGN.md §3.6), in two public steps.

A task's life is three commits: *create* (run, attempt, token hash, deadline, log artifact,
journal row — before any side effect), *spawned* (the durable handle) and *terminal*
(:class:`~ql_core.completion.CompletionService`). With a standby task (an executor that starts
its process before the run exists, so its handle is known first:
:class:`~ql_core.ports.executor.StandbyExecutor`) the create commit records the handle too — two
commits, one of them before the command starts.

- :func:`create` is the create commit. Any failure there means nothing is spawned (a standby task
  is dropped, having been given nothing): a ``PersistBeforeSpawnError``.
- :func:`start` hands the created run to its executor: the standby task gets its go-ahead, or the
  executor spawns the task held, its handle is committed, and only then is it released. Whatever
  fails after the create commit ends the run (``failed``, nothing ran), never leaves it starting.
- :func:`submit` is the whole of ``Runtime.submit``: checks, then create and start — or, on a node
  that runs no tasks but whose run store queues them (cluster-control), :func:`enqueue`.

The cluster worker uses :func:`create` with the ids its claim gave (:class:`RunIds`) and
:func:`start`, so a claimed attempt goes through exactly the local path.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .clock import boot_ms, now_ms
from .crashpoints import crashpoint
from .errors import PersistBeforeSpawnError, QlError, UsageError
from .ids import new_id
from .log import logger
from .logs import open_log_artifact
from .paths import log_relative_path, logs_root
from .ports.executor import SpawnRequest, check_handle
from .ports.journal import BulkQueueing, QueuedRun, QueueingBackend, TaskSpec
from .ports.receipt_store import ReceiptStoreError
from .records import NewRun
from .retrying import retrying
from .tokens import hash_token, new_token
from .value_class import lean_dataclass, value_class

# The modules each task's path uses are imported here, once, not in the functions: a function-level
# `from .x import y` runs the import machinery on every call (a spec lookup, a property in Python and
# two formatted AttributeErrors for a non-package module, ~11k instructions under callgrind), and every
# one of them is loaded by the time a task has run anyway (``ql run`` included; reading commands never
# import this module: tests/cli/test_quick_reads.py).

if TYPE_CHECKING:
    from .node import Node
    from .ports.executor import Executor, SpawnedTask

__all__ = ["Submission", "RunIds", "submit", "submit_many", "check_tasks", "create", "start", "take_standby",
           "enqueue", "check_submission", "MAX_SUBMIT_MANY"]

#: ``Runtime.submit_many`` takes at most this many tasks per call (a larger burst is several calls).
MAX_SUBMIT_MANY = 10_000
#: The keys a task of ``submit_many`` may have: :func:`submit`'s arguments.
_TASK_KEYS = frozenset({"command", "shell", "name", "timeout_s", "cwd", "env", "env_add", "log_max_bytes",
                        "max_attempts"})


# A dataclass (embedders get it), without generated methods (ql_core.value_class.lean_dataclass).
@lean_dataclass()
class Submission:
    """A submitted run. ``task`` is set while this process is the task's parent (the live path).

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

    def __init__(self, run_id: str, attempt_id: str | None, log_artifact_id: str | None, callback_sequence: int,
                 started_at_ms: int, deadline_at_ms: int | None, executor: str | None, token: str = "",
                 task: SpawnedTask | None = None, awaited: bool = False, started_boot_ms: int | None = None,
                 log_max_bytes: int | None = None) -> None:
        self.run_id = run_id
        self.attempt_id = attempt_id
        self.log_artifact_id = log_artifact_id
        self.callback_sequence = callback_sequence
        self.started_at_ms = started_at_ms
        self.deadline_at_ms = deadline_at_ms
        self.executor = executor
        self.token = token
        self.task = task
        self.awaited = awaited
        self.started_boot_ms = started_boot_ms
        self.log_max_bytes = log_max_bytes


@value_class(hidden=("token",))  # as @dataclass(frozen=True), without its import-time code generation
class RunIds:
    """Ids chosen before the create commit (a cluster claim's): the run, its attempt, its log
    artifact and the attempt's callback token (the lease token). Without them :func:`create`
    draws new ones."""
    __slots__ = ("run_id", "attempt_id", "log_artifact_id", "token")
    run_id: str
    attempt_id: str
    log_artifact_id: str
    token: str  # never in a log line or a traceback (left out of repr)

    def __init__(self, run_id: str, attempt_id: str, log_artifact_id: str, token: str) -> None:
        _set = object.__setattr__
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)
        _set(self, "log_artifact_id", log_artifact_id)
        _set(self, "token", token)


#: What ``env_add`` may name: a portable environment variable name (POSIX: letters, digits, ``_``).
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,255}"
#: At most this many variables in ``env_add``.
MAX_ENV_ADD = 256


def check_env_add(env_add: dict[str, str] | None) -> None:
    """``env_add``: a dict of at most :data:`MAX_ENV_ADD` portable names to str values (never echoed:
    the errors name the rule, not the variable)."""
    if env_add is None:
        return
    if not isinstance(env_add, dict):
        raise TypeError(f"env_add must be a dict of str to str, not a {type(env_add).__name__}")
    if len(env_add) > MAX_ENV_ADD:
        raise UsageError(f"env_add holds {len(env_add)} variables, more than {MAX_ENV_ADD}; pass large "
                         f"settings in a file instead")
    for key, value in env_add.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("env_add must map str to str; pass str(value)")
        if not re.fullmatch(_ENV_NAME, key):  # compiled at the first use (re's cache): most runs add none
            raise UsageError("an env_add name is not a portable variable name: use letters, digits and _ , "
                             "not starting with a digit (e.g. BUILD_ID)")


def check_submission(command: Sequence[str], *, shell: bool, env: dict[str, str] | None,
                     timeout_s: float | None, log_max_bytes: int | None,
                     env_add: dict[str, str] | None = None) -> None:
    """The checks of a submission, before anything is written: ``TypeError`` for an argument of the
    wrong type, ``UsageError`` for a wrong value — each naming the API parameter and the fix."""
    check_env_add(env_add)
    if isinstance(command, (str, bytes)):
        raise TypeError(f"command must be a list of arguments, not a {type(command).__name__}: pass "
                        f"[\"prog\", \"arg\", ...], or [\"sh\", \"-c\", \"...\"] (or shell=True with a one-item "
                        f"list) for a shell command line")
    for part in command or ():
        if not isinstance(part, str):
            raise TypeError(f"command must be a list of str: an argument is of type {type(part).__name__}; "
                            f"pass str(value)")
    if not command or (shell and len(command) != 1):
        raise UsageError("command must hold at least one argument (with shell=True: exactly one string)")
    if env is not None:
        if not isinstance(env, dict):
            raise TypeError(f"env must be a dict of str to str, not a {type(env).__name__}")
        for key, value in env.items():
            if not isinstance(key, str):
                raise TypeError(f"env must map str to str: a key is of type {type(key).__name__}; pass str(key)")
            if not isinstance(value, str):
                raise TypeError(f"env must map str to str: a value is of type {type(value).__name__}; "
                                f"pass str(value)")
    if any("\0" in part for part in command) or any("\0" in f"{k}{v}" for k, v in (env or {}).items()) \
            or any("\0" in v for v in (env_add or {}).values()):
        raise UsageError("a command argument or environment value contains a NUL byte; remove it")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))):
        raise TypeError(f"timeout_s must be a number of seconds (or None), not a {type(timeout_s).__name__}")
    if timeout_s is not None and not (0 < timeout_s <= 366 * 24 * 3600):
        raise UsageError("timeout_s must be a positive number of seconds (at most a year)")
    if log_max_bytes is not None:
        from .profiles import LIMIT_RANGES

        _kind, low, high = LIMIT_RANGES["log_max_bytes"]
        if (isinstance(log_max_bytes, bool) or not isinstance(log_max_bytes, int)
                or not low <= log_max_bytes <= high):
            raise UsageError(f"log_max_bytes must be an integer between {low:g} and {high:g}")


def submit(node: Node, command: Sequence[str], *, shell: bool = False, name: str | None = None,
           timeout_s: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
           log_max_bytes: int | None = None, max_attempts: int = 1, awaited: bool = False,
           env_add: dict[str, str] | None = None) -> Submission:
    """Persist the run, then spawn it (``Runtime.submit`` documents every argument)."""
    if node.closed:
        from .errors import RuntimeClosedError

        raise RuntimeClosedError("this runtime is closed: submit on a runtime from Runtime.open(config) that "
                                 "is not closed yet (nothing was submitted)")
    check_submission(command, shell=shell, env=env, timeout_s=timeout_s, log_max_bytes=log_max_bytes,
                     env_add=env_add)
    # A wrong-role use (ports.journal.RefusesSubmissions), refused before anything starts. Asked as
    # the attribute that protocol checks for: isinstance against a runtime-checkable Protocol costs
    # more than the rest of these checks together, on every submit.
    refused = getattr(node.journal, "submission_refused", None)
    if callable(refused):
        raise UsageError(refused())
    argv = tuple(command)
    if node.executor is None:
        return enqueue(node, argv, shell=shell, name=name, timeout_s=timeout_s, cwd=cwd, env=env,
                       max_attempts=max_attempts, env_add=env_add)
    if env_add:  # run here: added to the environment the task would get (``env``, else this host's)
        env = {**(env if env is not None else os.environ), **env_add}
    if max_attempts != 1:
        raise UsageError("retries (max_attempts > 1) exist only for runs queued to cluster workers")
    executor, _receipts = node.runner()
    standby = take_standby(node, executor, argv, shell=shell, cwd=cwd, env=env, awaited=awaited)
    sub = create(node, name=name, timeout_s=timeout_s, log_max_bytes=log_max_bytes, standby=standby)
    sub.awaited = awaited
    return start(node, sub, argv, shell=shell, cwd=cwd, env=env, standby=standby)


def submit_many(node: Node, tasks: Sequence[Mapping[str, Any]]) -> list[Submission]:
    """``Runtime.submit_many``: every task is checked before anything is written (one wrong task
    submits nothing), then the runs are queued in bulk where the run store can (a cluster-control
    node: a few transactions for thousands of runs), else submitted one by one."""
    if node.closed:
        from .errors import RuntimeClosedError

        raise RuntimeClosedError("this runtime is closed: submit on a runtime from Runtime.open(config) that "
                                 "is not closed yet (nothing was submitted)")
    tasks = list(tasks)
    check_tasks(tasks)
    if node.executor is not None or not isinstance(node.journal, BulkQueueing):
        return [submit(node, **task) for task in tasks]
    journal: Any = node.journal
    now = now_ms()
    runs = []
    for task in tasks:
        env, timeout_s = task.get("env"), task.get("timeout_s")
        runs.append(QueuedRun(run_id=new_id(), name=task.get("name"), created_at_ms=now,
                              spec=TaskSpec(command=tuple(task["command"]), shell=task.get("shell", False),
                                            cwd=task.get("cwd"), env=dict(env) if env else None,
                                            env_add=dict(task["env_add"]) if task.get("env_add") else None),
                              timeout_ms=int(timeout_s * 1000) if timeout_s is not None else None,
                              max_attempts=task.get("max_attempts", 1)))
    for events in retrying(lambda: journal.enqueue_many(runs), retries=node.profile.completion_retries):
        for event in events:
            node.notify(event)
    return [Submission(run_id=run.run_id, attempt_id=None, log_artifact_id=None, callback_sequence=0,
                       started_at_ms=run.created_at_ms, deadline_at_ms=None, executor=None) for run in runs]


def check_tasks(tasks: Sequence[Mapping[str, Any]]) -> None:
    """The checks :func:`submit_many` makes before anything is written: ``TypeError`` / ``UsageError``
    naming ``tasks[i]`` and the fix (``ql run --many`` checks a whole file with it first)."""
    if len(tasks) > MAX_SUBMIT_MANY:
        raise UsageError(f"submit_many takes at most {MAX_SUBMIT_MANY} tasks per call; split the burst")
    for i, task in enumerate(tasks):
        if not isinstance(task, Mapping) or "command" not in task:
            raise TypeError(f"tasks[{i}] must be a mapping of submit()'s arguments with a \"command\"")
        unknown = set(task) - _TASK_KEYS
        if unknown:
            raise TypeError(f"tasks[{i}] has keys submit() does not take; allowed: {', '.join(sorted(_TASK_KEYS))}")
        try:
            check_submission(task["command"], shell=task.get("shell", False), env=task.get("env"),
                             timeout_s=task.get("timeout_s"), log_max_bytes=task.get("log_max_bytes"),
                             env_add=task.get("env_add"))
        except (TypeError, UsageError) as exc:
            raise type(exc)(f"tasks[{i}]: {exc}") from None
        attempts = task.get("max_attempts", 1)
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise TypeError(f"tasks[{i}]: max_attempts must be an int, not a {type(attempts).__name__}")
        if not 1 <= attempts <= 100:
            raise UsageError(f"tasks[{i}]: max_attempts must be between 1 and 100")


def enqueue(node: Node, command: tuple[str, ...], *, shell: bool, name: str | None, timeout_s: float | None,
            cwd: str | None, env: dict[str, str] | None, max_attempts: int,
            env_add: dict[str, str] | None = None) -> Submission:
    """Queue the run for a worker (the run store must be able to: cluster-fenced). ``env_add`` goes
    with the spec: the worker adds it to the environment the task gets there."""
    if not isinstance(node.journal, QueueingBackend):
        node.runner()  # raises: this profile runs nothing and its store queues nothing
    if not 1 <= max_attempts <= 100:
        raise UsageError("max_attempts must be between 1 and 100")
    journal: Any = node.journal
    run = QueuedRun(run_id=new_id(), name=name, created_at_ms=now_ms(),
                    spec=TaskSpec(command=command, shell=shell, cwd=cwd, env=dict(env) if env else None,
                                  env_add=dict(env_add) if env_add else None),
                    timeout_ms=int(timeout_s * 1000) if timeout_s is not None else None,
                    max_attempts=max_attempts)
    for event in retrying(lambda: journal.enqueue(run), retries=node.profile.completion_retries):
        node.notify(event)
    return Submission(run_id=run.run_id, attempt_id=None, log_artifact_id=None, callback_sequence=0,
                      started_at_ms=run.created_at_ms, deadline_at_ms=None, executor=None)


def take_standby(node: Node, executor: Executor, command: tuple[str, ...], *, shell: bool, cwd: str | None,
                 env: dict[str, str] | None, awaited: bool) -> SpawnedTask | None:
    """A standby task for this run when the executor offers one and the run store can record its
    handle in the create commit; None: the classic path (spawn after the create commit). Given to
    :func:`create` and :func:`start` (``standby=``) — by :func:`submit`, and by a cluster worker
    for the attempts it claims."""
    if not node.takes_standby:
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


# -- step one: the create commit --------------------------------------------------------------
def create(node: Node, *, name: str | None = None, timeout_s: float | None = None,
           log_max_bytes: int | None = None, standby: SpawnedTask | None = None,
           ids: RunIds | None = None) -> Submission:
    """The *create* commit: run, attempt, token hash, deadline, log artifact and journal row (with
    ``standby``: the standby task's handle too, the attempt ``running``). Nothing is spawned here.

    Any failure means nothing will be: a standby task is dropped, having been given nothing, and a
    ``PersistBeforeSpawnError`` says so. ``ids``: the ids a cluster claim chose (else new ones).
    """
    executor, receipts = node.runner()
    assert node.config.executor is not None
    if ids is None:
        ids = RunIds(new_id(), new_id(), new_id(), new_token())  # 256 bits, 43 chars of [A-Za-z0-9_-]
    # The committed start, read on both clocks at once: stored times are wall-clock, durations
    # (the deadline, the finish time the launcher writes) count on the boot clock from here.
    now, boot = now_ms(), boot_ms()
    deadline = now + int(timeout_s * 1000) if timeout_s is not None else None
    new = NewRun(run_id=ids.run_id, attempt_id=ids.attempt_id, log_artifact_id=ids.log_artifact_id, name=name,
                 executor=node.config.executor, runtime_owner=node.node_id,
                 callback_token_hash=hash_token(ids.token), created_at_ms=now, deadline_at_ms=deadline,
                 log_relative_path=log_relative_path(ids.log_artifact_id),
                 log_max_bytes=log_max_bytes or node.profile.log_max_bytes,
                 receipt_ref=receipts.relative_ref(ids.attempt_id), host_handle=executor.host_handle())
    journal: Any = node.journal
    write = (lambda: journal.create(new)) if standby is None else (
        lambda: journal.create_running(new, handle=standby.handle))
    try:
        events = retrying(write, retries=node.profile.completion_retries)
    except Exception as exc:  # any failure of the create commit means: do not spawn
        if standby is not None:
            executor.abort(standby)
        raise PersistBeforeSpawnError(
            f"could not persist the run before spawning it, so nothing was started "
            f"({type(exc).__name__}: {exc}); check the data dir with `ql doctor` and retry") from exc
    for event in events:
        node.notify(event)
    return Submission(run_id=ids.run_id, attempt_id=ids.attempt_id, log_artifact_id=ids.log_artifact_id,
                      callback_sequence=1, started_at_ms=now, deadline_at_ms=deadline,
                      executor=node.config.executor, token=ids.token, started_boot_ms=boot,
                      log_max_bytes=new.log_max_bytes)


# -- step two: the hand-over ------------------------------------------------------------------
def start(node: Node, sub: Submission, command: Sequence[str], *, shell: bool = False, cwd: str | None = None,
          env: dict[str, str] | None = None, standby: SpawnedTask | None = None) -> Submission:
    """Start the run :func:`create` committed: ``standby`` (whose handle that commit holds) gets its
    go-ahead; without one the executor spawns the task held, its handle is committed (the second
    commit), then it is released. Returns ``sub`` with its ``task`` set while we are its parent.

    Whatever fails here ends the run (``failed``; cancelled/timed out when a committed intent is
    why), never leaves it starting: a ``QlError`` saying nothing ran, or — a launcher gone before
    its go-ahead, no fault of the caller's — a warning, and ``sub`` returns with no task.
    """
    executor, _receipts = node.runner()
    if standby is not None:
        return _start_standby(node, executor, sub, standby, tuple(command), shell=shell, cwd=cwd, env=env)
    return _spawn(node, executor, sub, tuple(command), shell=shell, cwd=cwd, env=env)


def _prepare_locations(node: Node, sub: Submission, *, drop: Callable[[], None] | None = None) -> tuple[str, int]:
    """The receipt location and the open log artifact of ``sub`` (after its create commit). On
    failure nothing runs: ``drop`` discards a standby task, and the run is marked failed."""
    assert node.receipts is not None and sub.attempt_id is not None and sub.log_artifact_id is not None
    reason = "RECEIPT_LOCATION_UNAVAILABLE"
    try:
        location = node.receipts.prepare(sub.attempt_id)
        reason = "LOG_ARTIFACT_UNAVAILABLE"
        log_fd = open_log_artifact(node.config.data_dir, sub.log_artifact_id)
        crashpoint("spawn.after_log_created")
    except (OSError, QlError, ValueError, ReceiptStoreError) as exc:
        if drop is not None:
            drop()
        ended = node.completion.end_never_ran(sub.attempt_id, reason=reason)
        # A store's own message is written for users (the OS error, the path); others by name.
        detail = (getattr(exc, "strerror", None) or (isinstance(exc, ReceiptStoreError) and str(exc))
                  or type(exc).__name__)
        raise QlError(f"cannot prepare the log or receipt location in {node.config.data_dir} ({detail}); "
                      f"nothing ran and run {sub.run_id} is marked {ended.status or 'failed'}; "
                      f"run `ql doctor`") from None
    return location, log_fd


def _request(node: Node, sub: Submission, location: str, command: tuple[str, ...], *, shell: bool,
             cwd: str | None, env: dict[str, str] | None) -> SpawnRequest:
    assert sub.attempt_id is not None and sub.log_artifact_id is not None
    profile = node.profile
    return SpawnRequest(run_id=sub.run_id, attempt_id=sub.attempt_id,
                        callback_sequence=sub.callback_sequence, token=sub.token,
                        started_at_ms=sub.started_at_ms, command=command, shell=shell,
                        # Where open_log_artifact created it (this version's layout: no lookup).
                        log_path=logs_root(node.config.data_dir) / log_relative_path(sub.log_artifact_id),
                        receipt_location=location, cwd=cwd, env=env, awaited=sub.awaited,
                        timeout_ms=(sub.deadline_at_ms - sub.started_at_ms
                                    if sub.deadline_at_ms is not None else None),
                        cancel_grace_ms=int(profile.cancel_grace_s * 1000),
                        log_max_bytes=sub.log_max_bytes or profile.log_max_bytes,
                        started_boot_ms=sub.started_boot_ms)


def _start_standby(node: Node, executor: Executor, sub: Submission, task: SpawnedTask, command: tuple[str, ...],
                   *, shell: bool, cwd: str | None, env: dict[str, str] | None) -> Submission:
    """A standby task whose handle the create commit holds: hand it its run (the go-ahead)."""
    assert sub.attempt_id is not None
    location, log_fd = _prepare_locations(node, sub, drop=lambda: executor.abort(task))
    try:
        executor.start(task, _request(node, sub, location, command, shell=shell, cwd=cwd, env=env),  # type: ignore[attr-defined]
                       log_fd=log_fd)
    except Exception as exc:  # noqa: BLE001 - whatever the executor raised, nothing was handed over
        # Nothing was handed over, so nothing runs: the run is closed, never left running —
        # failed, or cancelled/timed out when a committed intent's signal is why (it reached the
        # standby after the create commit and ended it: the submit then stands, the run ended).
        executor.abort(task)
        ended = node.completion.end_never_ran(sub.attempt_id, reason="SPAWN_FAILED")
        if ended.status in ("cancelled", "timed_out"):
            return sub
        if _launcher_gone(exc):
            # The standby died, or stopped taking messages, between being taken and the hand-over
            # (killed, a full or broken channel): the run truthfully ended failed, nothing ran.
            # That is no error of the caller's, and a host must never die of it: submit stands.
            logger.warning("run {}: its standby launcher was gone before the hand-over ({}); nothing ran, "
                           "the run is marked {}", sub.run_id, _errno_name(exc), ended.status or "failed")
            return sub
        raise QlError(f"cannot start the task ({_spawn_failure(exc, shell=shell, cwd=cwd)}); nothing ran and run {sub.run_id} "
                      f"is marked failed") from None
    finally:
        os.close(log_fd)
    crashpoint("start.after_hand_over")
    sub.task = task
    return sub


def _spawn(node: Node, executor: Executor, sub: Submission, command: tuple[str, ...], *, shell: bool,
           cwd: str | None, env: dict[str, str] | None) -> Submission:
    location, log_fd = _prepare_locations(node, sub)
    try:
        task = executor.spawn(_request(node, sub, location, command, shell=shell, cwd=cwd, env=env), log_fd=log_fd)
    except Exception as exc:
        # Nothing runs: the create commit is closed with a terminal state, never left "starting".
        assert sub.attempt_id is not None
        node.completion.end_never_ran(sub.attempt_id, reason="SPAWN_FAILED")
        raise QlError(f"cannot start the task ({_spawn_failure(exc, shell=shell, cwd=cwd)}); nothing ran and run {sub.run_id} "
                      f"is marked failed") from None
    finally:
        os.close(log_fd)
    sub.task = task
    _record_spawned(node, executor, sub, task)
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
        ended = node.completion.end_never_ran(sub.attempt_id, reason="SPAWN_FAILED")
        logger.warning("run {}: its launcher was gone before its go-ahead ({}); nothing ran, the run is "
                       "marked {}", sub.run_id, _errno_name(exc), ended.status or "failed")
    return sub


def _record_spawned(node: Node, executor: Executor, sub: Submission, task: SpawnedTask) -> None:
    """Second commit: the durable handle. Without it the task must not run (ADR-0007 §2.2)."""
    try:
        handle = check_handle(task.handle)
        if handle is None:
            raise QlError("the executor could not read the task's identity")
        node.completion.record_spawned(sub.attempt_id, handle=handle, started_at_ms=sub.started_at_ms)
    except Exception as exc:  # noqa: BLE001 - compensate: the command must never start
        executor.abort(task)
        try:
            node.completion.end_never_ran(sub.attempt_id, reason="HANDLE_NOT_SAVED")
        except Exception:  # noqa: BLE001 - recovery will classify it
            pass
        raise QlError(f"the task's durable handle could not be saved ({type(exc).__name__}), so its command "
                      f"was never started; run {sub.run_id} marked failed") from None


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


def _spawn_failure(exc: BaseException, *, shell: bool = False, cwd: str | None = None) -> str:
    """A one-line cause for a failed spawn that names the fix (never the command itself; ``cwd`` is
    the caller's own path, named only when it is the cause). Spoken in the API's parameter names."""
    if isinstance(exc, OSError):
        if exc.errno == errno.E2BIG:
            return "the argument list or environment is too long for the system (E2BIG); shorten it"
        if cwd is not None and not os.path.isdir(cwd):
            what = "is not a directory" if os.path.lexists(cwd) else "does not exist"
            return f"the working directory (cwd) {cwd!r} {what}; give an existing directory"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return (f"{exc.strerror}: check that /bin/sh exists" if shell
                    else f"{exc.strerror}: the task's launcher could not be started; check `ql doctor`")
        if exc.errno == errno.EACCES:
            return (f"{exc.strerror}: check the permissions of the working directory (cwd)" if cwd is not None
                    else f"{exc.strerror}: the task's launcher could not be started; check `ql doctor`")
        return exc.strerror or type(exc).__name__
    return type(exc).__name__
