"""Runtime: the facade a host application embeds (and the ``ql`` command uses).

```python
from ql_core.config import load_config
from ql_core.runtime import Runtime

rt = Runtime.open(load_config(data_dir="/var/lib/myhost/ql"))
sub = rt.submit(["backup.sh", "--full"], timeout_s=3600)
print(rt.wait(sub).status)          # or leave it: the task outlives this process
```

docs/api.md is the contract of every public name here. The facade holds one
:class:`~ql_core.node.Node` (``rt.node``: the wired seams — config, profile, plugins, node id,
journal, executors, receipts, completion, consumer, canceller) and forwards each verb to the
module that owns the protocol:

====================  ================================================================
``submit``            :mod:`ql_core.submit` — persist before spawn (create, then start)
``wait``/``detach``   :mod:`ql_core.wait` — the live wait, re-attaching, acknowledging
``settle``            :func:`ql_core.reconciler.settle` — what a round does, for one run
``cancel``            :class:`ql_core.cancellation.Canceller` — intent first, then signals
``reconcile``         :class:`ql_core.reconciler.Reconciler` — bounded recovery rounds
``supervisor``        :class:`ql_core.supervisor.Supervisor` — rounds on a timer
``start_wakeups``     :func:`ql_core.follow.start_supervisor_wakeups`
====================  ================================================================

Internal services take the node (or the one collaborator they need), never the facade.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import submit as submitting, wait as waiting
from .config import Config
from .errors import NotFoundError
from .node import Node
from .records import RunView
from .submit import Submission

if TYPE_CHECKING:
    from .cancellation import Canceller, CancelRequest
    from .completion import CompletionResult, CompletionService
    from .consumer import ReceiptConsumer
    from .plugins import PluginHost
    from .profiles import Profile
    from .ports.context import RuntimeContext
    from .ports.executor import Executor, ExitObservation
    from .ports.journal import JournalBackend
    from .ports.receipt_store import ReceiptStore
    from .records import AttemptRecord, EventRecord
    from .supervisor import Supervisor

__all__ = ["Runtime", "Submission", "RunView"]


class _FromNode:
    """A read-only attribute of the facade that is its node's attribute of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, runtime: Runtime | None, owner: type | None = None) -> Any:
        return self if runtime is None else getattr(runtime.node, self.name)

    def __set__(self, runtime: Runtime, value: object) -> None:
        raise AttributeError(f"Runtime.{self.name} is the node's: set it on rt.node, not on the facade")


class Runtime:
    """One node's ql runtime: the public verbs over its :class:`~ql_core.node.Node`."""

    def __init__(self, node: Node) -> None:
        self.node = node

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def open(cls, config: Config, *, create: bool = True, environ: dict[str, str] | None = None) -> Runtime:
        """Load the configured plugins and open the run store.

        ``create=True`` (submitting, recovering): create the data dir and its node id if missing and
        migrate the schema. ``create=False`` (reading: status, list, events, logs): open only what
        exists — a missing data dir or database is a :class:`~ql_core.errors.NotFoundError` naming the
        fix, nothing is created or migrated (the runtime may still settle an attempt it shows).
        """
        return cls(Node.open(config, create=create, environ=environ))

    def close(self) -> None:
        """Close the run store and drop what executors keep ready (a standby launcher exits, having
        run nothing). Running tasks are not touched: they outlive the runtime."""
        self.node.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the node's seams, under the names hosts have always read (read-only; see ``rt.node``) ---
    config: Config = _FromNode()
    profile: Profile = _FromNode()
    plugins: PluginHost = _FromNode()
    node_id: str = _FromNode()
    context: RuntimeContext = _FromNode()
    journal: JournalBackend = _FromNode()
    executor: Executor | None = _FromNode()
    receipts: ReceiptStore | None = _FromNode()
    completion: CompletionService = _FromNode()
    consumer: ReceiptConsumer | None = _FromNode()
    canceller: Canceller = _FromNode()

    def executor_for(self, name: str) -> Executor | None:
        """The executor registered as ``name`` (built once), or None when it is not installed here."""
        return self.node.executor_for(name)

    def attempt_elapsed_ms(self, attempt: AttemptRecord) -> int | None:
        """``attempt``'s time since its committed start on its executor's clock (None: cannot tell)."""
        return self.node.attempt_elapsed_ms(attempt)

    def deadline_passed(self, run_id: str) -> bool:
        """Has ``run_id``'s deadline passed, measured as a duration (``Canceller.deadline_passed``)?"""
        return self.node.canceller.deadline_passed(run_id)

    # -- submit: persist before spawn ----------------------------------------------
    def submit(self, command: Sequence[str], *, shell: bool = False, name: str | None = None,
               timeout_s: float | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
               env_add: dict[str, str] | None = None, log_max_bytes: int | None = None,
               max_attempts: int = 1, awaited: bool = False) -> Submission:
        """Persist the run, then spawn it. Nothing is spawned unless the create commit succeeded.

        ``awaited=True`` promises that this host will :meth:`wait` for the submission: the task's
        receipt is then held back and published only if this host dies before it committed the
        status it reaped (acknowledged completion, the cheapest safe path; :meth:`run` uses it).
        A host that stops waiting calls :meth:`detach` so the task publishes its receipt itself.

        ``log_max_bytes`` overrides the profile's log quota. On a node that runs no tasks but whose store
        queues them (cluster-control) the run is queued (``max_attempts`` > 1: tasks safe to run twice);
        ``env_add`` (``ql run --env``) adds to the task's environment where it runs (a worker's own)."""
        return submitting.submit(self.node, command, shell=shell, name=name, timeout_s=timeout_s, cwd=cwd, env=env,
                                 env_add=env_add, log_max_bytes=log_max_bytes, max_attempts=max_attempts,
                                 awaited=awaited)

    def submit_many(self, tasks: Sequence[dict[str, Any]]) -> list[Submission]:
        """Many runs at once (a cron burst), each a dict of :meth:`submit`'s arguments (docs/api.md)."""
        return submitting.submit_many(self.node, tasks)

    def run(self, command: Sequence[str], *, on_tick: Callable[[], None] | None = None,
            **options: Any) -> RunView:
        """Submit ``command`` and wait for its end: :meth:`submit` (``awaited``) plus :meth:`wait`."""
        return self.wait(self.submit(command, awaited=True, **options), on_tick=on_tick)

    def detach(self, sub: Submission) -> None:
        """Stop being the waiting host of ``sub``: its task publishes its receipt when it ends, and
        recovery (a supervisor, ``ql reconcile``) completes it. Idempotent."""
        waiting.detach(self.node, sub)

    # -- wait: the live fast path -------------------------------------------------------
    def wait(self, sub: Submission | str, *, on_tick: Callable[[], None] | None = None,
             tick_s: float = waiting.INTENT_POLL_S) -> RunView:
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
        return waiting.wait(self.node, sub, on_tick=on_tick, tick_s=tick_s)

    def complete_from_wait(self, sub: Submission, observed: ExitObservation) -> CompletionResult | None:
        """End the attempt from what this host reaped (:func:`ql_core.wait.complete_from_wait`)."""
        return waiting.complete_from_wait(self.node, sub, observed)

    def settle(self, view: RunView) -> None:
        """Try to end a non-terminal run shown to a reader: its passed deadline becomes a timeout intent
        (and its signals are dispatched), and this node's attempt is settled from its receipt or its
        process identity — what a supervisor round would do for it, bounded to this one run."""
        from .reconciler import settle

        settle(self.node, view)

    # -- queries --------------------------------------------------------------------
    def status(self, run_id: str) -> RunView:
        return self.node.view(run_id)

    def events(self, run_id: str) -> list[EventRecord]:
        events = self.node.journal.events(run_id)
        if events is None:
            raise NotFoundError(f"run {run_id!r} not found in {self.node.config.data_dir}; see `ql list`")
        return events

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunView]:
        return self.node.journal.list_views(status=status, limit=limit)

    def log_path(self, run_id: str) -> Path:
        from .paths import log_path

        view = self.status(run_id)
        assert view.log_artifact_id is not None
        return log_path(self.node.config.data_dir, view.log_artifact_id)

    # -- cancellation -----------------------------------------------------------------
    def cancel(self, run_id: str, reason: str = "user") -> CancelRequest:
        """Commit the cancel intent, then dispatch TERM (KILL follows after the grace)."""
        from .cancellation import CancelRequest
        from .ports.journal import QueueingBackend

        node = self.node
        if node.executor is None and isinstance(node.journal, QueueingBackend):
            # A control node: the worker holding the run's lease learns the intent and signals.
            result = CancelRequest(node.journal.request_cancel(run_id, reason))
        else:
            result = node.canceller.request(run_id, reason)
        if result is CancelRequest.NOT_FOUND:
            raise NotFoundError(f"run {run_id!r} not found in {node.config.data_dir}; see `ql list`")
        if result in (CancelRequest.REQUESTED, CancelRequest.ALREADY_REQUESTED) and node.executor is not None:
            # On a node that runs no tasks the intent is all: the node running the task signals it.
            node.canceller.dispatch_one(run_id)
        return result

    # -- recovery -------------------------------------------------------------------
    def recover_attempt(self, attempt_id: str) -> dict[str, int]:
        """Settle one attempt now (receipt, else identity) — what a round does, for one."""
        from .reconciler import recover_attempt

        return recover_attempt(self.node, attempt_id)

    def reconcile(self, *, max_rounds: int = 100_000) -> dict[str, int]:
        """One full startup pass in bounded rounds; returns the counts."""
        from .reconciler import Reconciler

        report, _rounds = Reconciler(self.node).full_pass(max_rounds=max_rounds)
        return report.as_dict()

    def supervisor(self, *, interval_s: float | None = None) -> Supervisor:
        """A :class:`~ql_core.supervisor.Supervisor` for this runtime (call ``start()``/``stop()``)."""
        from .supervisor import Supervisor

        return Supervisor(self.node, interval_s=interval_s)

    def start_wakeups(self, supervisor: Any) -> Any:
        """Start the configured wake-up source for ``supervisor``: its watch (stop it first), or None."""
        from .follow import start_supervisor_wakeups

        return start_supervisor_wakeups(self.node, supervisor)
