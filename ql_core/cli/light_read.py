"""The read commands' light path: ``ql status``, ``list`` and ``events`` on an edge-sqlite data dir
answer from the SQLite file itself, without loading plugins (pluggy, entry points, executors).

:class:`LightReader` is the part of :class:`~ql_core.runtime.Runtime` those commands use — the
committed views, events and log paths, read through the edge-sqlite run store opened as readers
open it (nothing created or migrated). Everything else, above all :meth:`LightReader.settle` (a
reader settles a run it shows that has not ended, docs/cli.md), opens the full runtime on first
use and delegates to it, so the commands keep their reconcile-on-read semantics: only a data dir
whose shown runs have all ended is answered without plugins.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.records import EventRecord, RunView
    from ql_core.runtime import Runtime

__all__ = ["LightReader", "light_reader"]


def light_reader(config: Config) -> LightReader | None:
    """A light reader for ``config``, or None when its journal is not the built-in edge-sqlite one."""
    if config.journal != "edge-sqlite" or not config.is_sqlite or "edge-sqlite" in config.disabled_plugins:
        return None
    from ql_core.errors import NotFoundError
    from ql_core.paths import existing_data_dir, read_node_id

    data_dir = existing_data_dir(config.data_dir)
    if read_node_id(data_dir) is None:  # the same check and words as Node.open(create=False)
        raise NotFoundError(f"{data_dir} holds no ql data (no node_id): nothing has run with this data "
                            f"dir; check --data-dir / QL_DATA_DIR")
    if data_dir != config.data_dir:
        from dataclasses import replace

        config = replace(config, data_dir=data_dir)
    return LightReader(config)


class LightReader:
    """Committed reads of one edge-sqlite data dir; anything else goes to a full runtime."""

    def __init__(self, config: Config) -> None:
        from ql_plugins.edge_sqlite.store import SqliteJournal

        self.config = config
        self.profile = config.profile
        self._journal = SqliteJournal(config.database_url, busy_timeout_ms=config.profile.busy_timeout_ms,
                                      create=False, refuse_fresh=True)
        self._full: Runtime | None = None

    def _runtime(self) -> Runtime:
        if self._full is None:
            from ql_core.runtime import Runtime

            self._full = Runtime.open(self.config, create=False)
        return self._full

    def status(self, run_id: str) -> RunView:
        if self._full is not None:  # after a settle: the runtime's view (it may have written)
            return self._full.status(run_id)
        view = self._journal.view(run_id)
        if view is None:
            from ql_core.errors import NotFoundError

            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        return view

    def events(self, run_id: str) -> list[EventRecord]:
        if self._full is not None:
            return self._full.events(run_id)
        events = self._journal.events(run_id)
        if events is None:
            from ql_core.errors import NotFoundError

            raise NotFoundError(f"run {run_id!r} not found in {self.config.data_dir}; see `ql list`")
        return events

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunView]:
        if self._full is not None:
            return self._full.list_runs(status=status, limit=limit)
        return self._journal.list_views(status=status, limit=limit)

    def log_path(self, run_id: str) -> Path:
        from ql_core.paths import log_path

        view = self.status(run_id)
        assert view.log_artifact_id is not None
        return log_path(self.config.data_dir, view.log_artifact_id)

    def settle(self, view: RunView) -> None:
        self._runtime().settle(view)

    def __getattr__(self, name: str) -> Any:
        # node, plugins, context, ...: what only the full runtime has.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._runtime(), name)

    def close(self) -> None:
        self._journal.close()
        if self._full is not None:
            self._full.close()
