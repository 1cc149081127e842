"""The executor seam: how a task is started, observed and signalled.

Core never looks inside a handle and never touches a process itself: every
process detail (a launcher, its special exit statuses, pids, groups, start
times, containers, remote jobs) belongs to the executor. Core stores the
handle as an opaque string and gives it back to the executor that made it —
the attempt records the executor's registered name, and recovery, cancel and
wait always go to that executor.

Contract (checked by :class:`ql_core.testing.ExecutorContract`):

- :meth:`Executor.spawn` prepares the task *detached from the host* and
  **held**: the command must not start until :meth:`Executor.release`, which
  core calls only after the task's durable handle is committed — and if the
  host dies before that, the command never starts at all. That is what lets
  recovery *prove* "never started" (host gone, no handle) instead of guessing.
  Once released, the task outlives the host process, writes its stdout/stderr
  to ``log_fd``, and on its end publishes a completion receipt
  (``request.token``, ``request.callback_sequence``, its true exit code,
  128+N when killed by signal N) through the receipt store's
  ``request.receipt_location``. ``spawn`` raises ``OSError``/``ValueError``
  only when nothing was started.
- ``SpawnedTask.handle`` is a JSON document of at most :data:`MAX_HANDLE_BYTES`
  bytes that identifies the task for ever (a pid alone does not); ``None``
  when identity could not be read — core then stops the task with
  :meth:`Executor.abort` and marks the attempt lost.
- :meth:`Executor.inspect` says ``running``/``exited``/``unverifiable``; it
  never guesses: identity it cannot read is ``unverifiable``.
- :meth:`Executor.signal` re-verifies identity immediately before signalling
  and signals the task's whole process group (or equivalent); never a bare pid.
- :meth:`Executor.wait` is the live fast path of the host that spawned the
  task: it returns the exit observation, or ``None`` on timeout. An
  observation without ``exit_code`` means "no trustworthy status" (e.g. the
  launcher itself was killed): core then lets recovery decide — never a guess.
- Acknowledged completion (optional): for a request with ``awaited=True`` the
  executor may hold the task's receipt back and say so with
  ``ExitObservation.held_receipt``. Core then commits the observed status and
  calls :meth:`Executor.acknowledge` with ``committed=True`` (the receipt is
  no longer needed) or ``committed=False`` (its commit failed: publish it).
  If the host dies first, the held receipt must be published as usual — so
  a held receipt costs nothing when the host lives and loses nothing when it
  dies. ``held_receipt`` may only be claimed for a status the executor got
  from the operating system (e.g. ``waitpid``), never from anything a task
  could write.

- Durations (optional): an executor may offer ``elapsed_ms(handle) -> int | None``, the time
  since the attempt's start measured on a clock that does not step (the local executor: the boot
  clock, from the start recorded in its handle, same boot only). Core then decides "deadline
  passed" from it instead of from two wall clocks; None means "cannot tell" (wall clock then).
- Standby tasks (optional, :class:`StandbyExecutor`): an executor may start a
  task's process *before its run exists* — holding nothing of any run, its
  durable handle already final. Core then records that handle in the run's
  create commit itself (one durable commit before the command starts instead
  of two) and hands the task its run with :meth:`StandbyExecutor.start`, which
  is also the go-ahead. A standby whose handle is committed but that never gets
  its run (the host died in between) must end without running anything and
  without a receipt: recovery then finds it gone, and the run ends ``lost``.

Threading: one executor instance serves a whole runtime; ``spawn``,
``inspect``, ``signal``, ``host_handle`` and ``standby`` may be called from several
threads at once; ``release``, ``start``, ``wait``, ``acknowledge`` and ``abort`` only by the
thread that spawned (or took) the task.
"""

from __future__ import annotations

import enum
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ql_core.lean_tuple import LeanNamedTuple
from ql_core.value_class import lean_dataclass, value_class

if TYPE_CHECKING:
    from .journal import TaskSpec

__all__ = [
    "MAX_HANDLE_BYTES",
    "IdentityState",
    "SignalOutcome",
    "SpawnRequest",
    "SpawnedTask",
    "ExitObservation",
    "Executor",
    "StandbyExecutor",
    "check_handle",
]

#: The largest handle core stores (UTF-8 bytes of the JSON document).
MAX_HANDLE_BYTES = 512


class IdentityState(enum.StrEnum):
    """What a durable handle says about the task it names."""

    RUNNING = "running"
    EXITED = "exited"
    UNVERIFIABLE = "unverifiable"


class SignalOutcome(enum.StrEnum):
    """The result of a verified signal to a task."""

    SIGNALLED = "signalled"
    ALREADY_EXITED = "already_exited"
    BLOCKED = "blocked"


# A dataclass (executor wrappers change it with dataclasses.replace), without generated methods.
@lean_dataclass(frozen=True, slots=True)
class SpawnRequest:
    """Everything an executor needs to start one attempt; all of it was persisted before spawn."""

    run_id: str
    attempt_id: str
    callback_sequence: int
    #: The plaintext callback token: only for this execution's receipt; never into argv or env.
    token: str = field(repr=False)
    started_at_ms: int
    command: tuple[str, ...] = field(repr=False)
    shell: bool
    log_path: Path
    #: Where the task's receipt must be published: :meth:`ReceiptStore.prepare`'s answer, opaque to core.
    receipt_location: str
    cwd: str | None = field(default=None, repr=False)
    env: dict[str, str] | None = field(default=None, repr=False)
    #: The spawning host will :meth:`Executor.wait` for this task and acknowledge the status it
    #: committed: the executor may hold the receipt back until then (acknowledged completion).
    awaited: bool = False
    #: Protections the executor enforces *itself* while the task runs, host or no host, reader or
    #: none (the local executor's launcher does: docs/launcher.md, "Protections"). None: not set.
    #: The run's deadline as a duration from ``started_at_ms`` (``deadline_at_ms - started_at_ms``):
    #: at that point the task's process group gets TERM, and KILL ``cancel_grace_ms`` later.
    timeout_ms: int | None = None
    #: How long after a TERM (a cancel's or the deadline's) the task's group gets KILL.
    cancel_grace_ms: int | None = None
    #: The log artifact's quota: the log never grows much past it (about one second of output).
    log_max_bytes: int | None = None
    #: ``CLOCK_BOOTTIME`` (ms) read together with ``started_at_ms``, on this host (same boot as the
    #: task): durations are measured from it, so no wall-clock step moves the deadline, and the
    #: receipt's ``finishedAtMs`` is ``started_at_ms`` + the boot-clock duration.
    started_boot_ms: int | None = None

    def __init__(self, run_id: str, attempt_id: str, callback_sequence: int, token: str, started_at_ms: int,
                 command: tuple[str, ...], shell: bool, log_path: Path, receipt_location: str,
                 cwd: str | None = None, env: dict[str, str] | None = None, awaited: bool = False,
                 timeout_ms: int | None = None, cancel_grace_ms: int | None = None,
                 log_max_bytes: int | None = None, started_boot_ms: int | None = None) -> None:
        _set = object.__setattr__
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)
        _set(self, "callback_sequence", callback_sequence)
        _set(self, "token", token)
        _set(self, "started_at_ms", started_at_ms)
        _set(self, "command", command)
        _set(self, "shell", shell)
        _set(self, "log_path", log_path)
        _set(self, "receipt_location", receipt_location)
        _set(self, "cwd", cwd)
        _set(self, "env", env)
        _set(self, "awaited", awaited)
        _set(self, "timeout_ms", timeout_ms)
        _set(self, "cancel_grace_ms", cancel_grace_ms)
        _set(self, "log_max_bytes", log_max_bytes)
        _set(self, "started_boot_ms", started_boot_ms)


@value_class(frozen=False, hidden=("live",))  # as @dataclass(slots=True), without its code generation
class SpawnedTask:
    """A started task: its durable handle and, while the host is its parent, the executor's live object."""

    __slots__ = ("handle", "live")
    handle: str | None
    #: Executor-private (e.g. a ``Popen``); only :meth:`Executor.wait`/:meth:`Executor.abort` use it.
    live: Any

    def __init__(self, handle: str | None, live: Any = None) -> None:
        self.handle = handle
        self.live = live


class ExitObservation(LeanNamedTuple):
    """What the spawning host saw when its task ended.

    ``exit_code`` is the task's own status (0-255; 128+N for signal N), or
    ``None`` when the executor cannot vouch for it (its launcher died, or
    reported that it lost the status): then only a receipt or recovery decides.
    ``finished_at_ms`` is an upper bound of the true end (read after reaping).
    """

    exit_code: int | None
    finished_at_ms: int
    #: Why there is no exit code, as a low-sensitivity reason code (e.g. ``LAUNCHER_KILLED_BY_SIGNAL_9``);
    #: core records it in an ``attempt.observation_lost`` event.
    detail: str | None = None
    #: The task's receipt is held back for :meth:`Executor.acknowledge` (awaited tasks only):
    #: core commits ``exit_code`` itself instead of looking for a receipt.
    held_receipt: bool = False


@runtime_checkable
class Executor(Protocol):
    """Starts tasks and later tells, from a stored handle, whether they still run."""

    def spawn(self, request: SpawnRequest, *, log_fd: int) -> SpawnedTask:
        """Prepare the task detached from the host, held until :meth:`release`; raise (OSError,
        ValueError) only if nothing was started."""
        ...

    def release(self, task: SpawnedTask) -> None:
        """The task's handle is committed: let its command start (spawning host only, once)."""
        ...

    def inspect(self, handle: str | None) -> IdentityState:
        """``running`` / ``exited`` / ``unverifiable`` for a stored handle (None: unverifiable)."""
        ...

    def signal(self, handle: str | None, signum: int) -> SignalOutcome:
        """Re-verify identity, then signal the task's process group; None handle: ``blocked``."""
        ...

    def wait(self, task: SpawnedTask, timeout_s: float | None) -> ExitObservation | None:
        """Block until the spawned task ends (or ``timeout_s`` passes: None). Spawning host only."""
        ...

    def acknowledge(self, task: SpawnedTask, *, committed: bool) -> None:
        """After :meth:`wait` returned ``held_receipt``: ``committed=True`` once core committed that
        status (drop the held receipt), ``False`` when it could not (publish it now). Spawning host
        only, at most once; executors that never hold a receipt do nothing here."""
        ...

    def abort(self, task: SpawnedTask) -> None:
        """A task this host spawned must never run (its handle could not be saved): make sure its
        command never starts (or stop it if it did) and reap it."""
        ...

    def host_handle(self) -> str | None:
        """A handle of the *calling process itself* (same format), so recovery can prove it is gone."""
        ...


@runtime_checkable
class StandbyExecutor(Executor, Protocol):
    """An executor that can start tasks ahead of their runs (see the module docstring)."""

    def standby(self, spec: TaskSpec, *, awaited: bool) -> SpawnedTask | None:
        """Called before a run's create commit: a task that is already running and identified
        (``handle`` final) but holds nothing of any run, for a run of ``spec`` — or None when this
        executor has none for it (core then spawns the classic way). The task belongs to the
        caller: it is given its run with :meth:`start`, or dropped with :meth:`Executor.abort`."""
        ...

    def start(self, task: SpawnedTask, request: SpawnRequest, *, log_fd: int) -> None:
        """Called once the run's create commit (which holds ``task.handle``) is durable: hand the
        task its run and let its command start. Raises (OSError, ValueError) only when nothing
        was handed over — the task has nothing and will run nothing; core then aborts it."""
        ...

    def close(self) -> None:
        """The runtime closes: drop any task kept ready for a later :meth:`standby`. Idempotent."""
        ...


def check_handle(handle: str | None) -> str | None:
    """Validate what an executor returned as a handle: None, or a str of at most 512 UTF-8 bytes."""
    if handle is None:
        return None
    if not isinstance(handle, str) or len(handle.encode("utf-8")) > MAX_HANDLE_BYTES:
        raise ValueError(f"an executor handle must be a JSON string of at most {MAX_HANDLE_BYTES} bytes")
    return handle
