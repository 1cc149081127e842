"""The node: the wired seams of one ql node, and nothing else.

A :class:`Node` holds what one data dir's process needs to run, watch and recover tasks — the
config and its profile, the loaded plugins, the node id, the run store (journal backend), the
executors, the receipt store, and the services built over them (completion, receipt consumer,
canceller, the observers behind ``notify``). It has no verbs of its own beyond building those,
measuring an attempt's time on its executor's clock, and checking that its data dir is still the
one it opened.

The protocols live beside it and take the node: :mod:`ql_core.submit` (persist, then spawn),
:mod:`ql_core.wait` (the live wait and re-attaching), :mod:`ql_core.reconciler` and
:mod:`ql_core.supervisor` (recovery), :mod:`ql_core.logs` and :mod:`ql_core.follow` (logs and
wake-ups); the cluster worker takes the node too. :class:`~ql_core.runtime.Runtime` is the
public facade a host embeds: it opens a node and forwards its verbs to those protocols.

Seams are built on first use (a reader, ``ql status``, never imports the launcher, subprocess or
the receipt codec) but checked at once: every selected seam must be registered, and a node that
runs tasks builds its executor and receipt store when it opens, so a bad ``[plugin.<name>]``
table fails at start. An attempt records the name of the executor that started it; recovery,
cancel and wait always go back to that executor (:meth:`Node.executor_for`).
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Config
from .errors import NotFoundError, PluginError, QlError, UsageError
from .ids import new_id
from .log import logger
from .paths import ensure_data_dir, existing_data_dir, read_node_id
from .ports.context import RuntimeContext

if TYPE_CHECKING:
    from .cancellation import Canceller
    from .completion import CompletionService
    from .consumer import ReceiptConsumer
    from .plugins import PluginHost
    from .ports.context import RunEventInfo
    from .ports.executor import Executor
    from .ports.journal import JournalBackend
    from .ports.receipt_store import ReceiptStore
    from .records import AttemptRecord, RunView

__all__ = ["Node", "node_of"]

#: ``Node._executors`` has no entry for that name yet (None is an entry: not installed here).
_UNBUILT = object()


class Node:
    """One node's seams: config, profile, plugins, node id, journal, executors, receipts, services."""

    #: Set by :meth:`close`: submitting afterwards is a :class:`~ql_core.errors.RuntimeClosedError`.
    closed = False

    def __init__(self, config: Config, *, plugins: PluginHost, node_id: str, create: bool = True,
                 data_dir_in_use: bool = False) -> None:
        self.config = config
        self.profile = config.profile
        self.plugins = plugins
        self.node_id = node_id
        self.context = RuntimeContext(config=config, node_id=node_id, existing_only=not create,
                                      data_dir_in_use=data_dir_in_use)
        self._data_dir_identity = _dir_identity(config.data_dir)
        self._executors: dict[str, Executor | None] = {}
        #: :meth:`runner`'s answer once both exist (they never change): asked several times per task.
        self._runner: tuple[Executor, ReceiptStore] | None = None
        self._lazy_lock = threading.RLock()
        # Every selected seam must be registered (one-line error naming what is installed) — checked
        # now; the executor and receipt store are *built* on first use.
        for key, registry in (("executor", plugins.executors), ("receipt_store", plugins.receipt_stores),
                              ("journal", plugins.journal_backends)):
            self._require_registered(key, registry, getattr(config, key))
        self.journal: JournalBackend = plugins.journal_backends.create(config.journal, self.context)
        if create:
            # A node that runs tasks builds them now, so a bad [plugin.<name>] table fails at start.
            _ = self.executor, self.receipts

    def _require_registered(self, key: str, registry: Any, name: str | None) -> None:
        from .plugins import explain_unregistered

        if name is not None and name not in registry.names():
            raise PluginError(explain_unregistered(key, name, self.config, self.plugins))

    # -- opening and closing ------------------------------------------------------------------
    @classmethod
    def open(cls, config: Config, *, create: bool = True, environ: dict[str, str] | None = None) -> Node:
        """Load the configured plugins and open the run store (``Runtime.open`` documents ``create``)."""
        # Before anything is created: a misspelled [plugin.lcoal] table must stop an embedding host
        # as it stops every command, not be ignored (its tasks would run as root).
        from .plugins import check_config_plugins

        check_config_plugins(config, environ)
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
                    node = cls._assemble(config, data_dir, environ, node_id=new_id(), create=True, in_use=False)
                    try:
                        # Written only now that the run store exists: the node id is the mark of a
                        # data dir whose database was created.
                        write_node_id(data_dir, node.node_id)
                    except BaseException:
                        node.close()
                        raise
                    return node
        return cls._assemble(config, data_dir, environ, node_id=found, create=True, in_use=True)

    @classmethod
    def _assemble(cls, config: Config, data_dir: Path, environ: dict[str, str] | None, *, node_id: str,
                  create: bool, in_use: bool) -> Node:
        """The node on ``data_dir`` (the canonical form of the configured one) with its plugins."""
        from dataclasses import replace

        from .plugins import load_plugin_host

        if data_dir != config.data_dir:
            config = replace(config, data_dir=data_dir)
        plugins = load_plugin_host(config.plugins, environ, optional=config.seam_plugins)
        return cls(config, plugins=plugins, node_id=node_id, create=create, data_dir_in_use=in_use)

    def close(self) -> None:
        """Close the run store and drop what executors keep ready (a standby launcher exits, having
        run nothing). Running tasks are not touched: they outlive the node."""
        self.closed = True
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

    # -- the seams ------------------------------------------------------------------------------
    @property
    def executor(self) -> Executor | None:
        """The selected executor (built on first use); None on a node that runs no tasks."""
        return self.executor_for(self.config.executor) if self.config.executor is not None else None

    def executor_for(self, name: str) -> Executor | None:
        """The executor registered as ``name`` (built once), or None when it is not installed here."""
        # Built once and never replaced: a plain dict read needs no lock (several calls per task).
        built = self._executors.get(name, _UNBUILT)
        if built is not _UNBUILT:
            return built  # type: ignore[return-value]
        with self._lazy_lock:
            if name not in self._executors:
                if name in self.plugins.executors.names():
                    self._executors[name] = self.plugins.executors.create(name, self.context)
                else:
                    self._executors[name] = None
            return self._executors[name]

    @functools.cached_property
    def receipts(self) -> ReceiptStore | None:
        """The selected receipt store (built on first use); None on a node that runs no tasks."""
        if self.config.receipt_store is None:
            return None
        with self._lazy_lock:
            return self.plugins.receipt_stores.create(self.config.receipt_store, self.context)

    def runner(self) -> tuple[Executor, ReceiptStore]:
        """The executor and receipt store of a node that runs local processes (a ``UsageError``
        naming the profiles that do, on one that does not)."""
        if self._runner is not None:
            return self._runner
        executor, receipts = self.executor, self.receipts
        if executor is None or receipts is None:
            raise UsageError(f"profile {self.profile.name!r} does not run local processes; "
                             f"submit from an edge, standalone or cluster-worker node")
        self._runner = (executor, receipts)
        return self._runner

    @functools.cached_property
    def takes_standby(self) -> bool:
        """Can submitted tasks be standby tasks here (the executor and the run store both able)?
        Read once: the configured executor and the run store never change."""
        from .ports.executor import StandbyExecutor
        from .ports.journal import RunningCreate

        return isinstance(self.executor, StandbyExecutor) and isinstance(self.journal, RunningCreate)

    def notify(self, event: RunEventInfo) -> None:
        """Hand a committed event to the observers (``ql_run_event`` hook implementations)."""
        self.plugins.notify_event(event)

    @functools.cached_property
    def completion(self) -> CompletionService:
        from .completion import CompletionService

        return CompletionService(self.journal, node_id=self.node_id, retries=self.profile.completion_retries,
                                 notify=self.plugins.notify_event,
                                 executor_known=lambda name: self.executor_for(name) is not None,
                                 elapsed=self.attempt_elapsed_ms)

    @functools.cached_property
    def consumer(self) -> ReceiptConsumer | None:
        """The receipt consumer; None on a node that keeps no receipts (it runs no tasks)."""
        from .consumer import ReceiptConsumer

        receipts = self.receipts
        return ReceiptConsumer(receipts, self.journal, self.completion) if receipts is not None else None

    @functools.cached_property
    def canceller(self) -> Canceller:
        from .cancellation import Canceller

        return Canceller(self.journal, self.executor_for, self.node_id, self.profile, self.plugins.notify_event,
                         elapsed=self.attempt_elapsed_ms)

    # -- facts ------------------------------------------------------------------------------------
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

    def view(self, run_id: str) -> RunView:
        """The committed view of ``run_id``; a ``NotFoundError`` naming ``ql list`` when there is none."""
        view = self.journal.view(run_id)
        if view is None:
            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        return view

    def check_data_dir(self) -> None:
        """Fail loudly if the data dir was deleted or replaced under us: never recreate a history."""
        if _dir_identity(self.config.data_dir) != self._data_dir_identity:
            raise QlError(f"the data dir {self.config.data_dir} was deleted or replaced while this runtime used "
                          f"it: its run history is gone there. Restore it from a backup; the task may still be "
                          f"running (its log and receipt went with the directory)")


def node_of(owner: Any) -> Node:
    """The node behind ``owner``: a :class:`Node` itself, or the ``node`` of a Runtime facade.

    For the few public functions documented as taking the runtime (``follow_log(rt, ...)``,
    ``enforce_log_retention(rt, ...)``, ``QlMetrics.attach(rt)``): they work on its node."""
    node = owner if isinstance(owner, Node) else getattr(owner, "node", None)
    if not isinstance(node, Node):
        raise TypeError(f"expected a ql Node or Runtime, got {type(owner).__name__}")
    return node


def _dir_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
