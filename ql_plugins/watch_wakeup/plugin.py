"""The ``watchfiles`` plugin: a wake-up source built on the watchfiles package (inotify & co).

Enable it with ``plugins = ["watchfiles"]`` in ``ql.toml`` and install the
extra: ``pip install 'ql-runner[watch]'``. It only makes things happen *earlier*:

- ``ql supervise`` (or a host calling ``rt.start_wakeups(supervisor)``) wakes
  its next round when a receipt appears under ``<data_dir>/receipts``, instead
  of waiting for the scan interval;
- a log follower wakes when its log grows or its receipt appears.

The periodic scan and the database index are untouched: without this plugin,
or when it fails, everything works at scan-interval latency. Profiles with
``file_watcher = "never"`` (edge) refuse to start it unless
``QL_FILE_WATCHER=force`` (see :mod:`ql_core.follow`).

This module is import-light (``ql plugins`` imports it): watchfiles itself is
imported only when a runtime builds the source. It uses watchfiles' public
``watch()`` generator (its native watcher polls a stop flag every ``step_ms``),
so ``WATCHFILES_FORCE_POLLING`` works for file systems without notifications.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ql_core.hookspecs import RegisterWakeupSource, hookimpl

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.ports import OnChange, RuntimeContext, WakeupSource

__all__ = ["ql_register_wakeup_sources", "ql_check_config", "WatchfilesSource", "WatchfilesWatch", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'ql-runner[watch]'"
#: watchfiles' change codes (watchfiles.Change) -> ql's names.
_KINDS = {1: "added", 2: "modified", 3: "deleted"}
#: The native watcher returns at least this often (it also checks the stop flag every step).
_RUST_TIMEOUT_MS = 1000


def _watchfiles() -> Any:
    try:
        import watchfiles
    except ImportError as exc:
        from ql_core.errors import PluginError

        raise PluginError(f"the watchfiles package is not installed ({exc}); {INSTALL_HINT}") from None
    return watchfiles


class WatchfilesWatch:
    """One daemon thread iterating ``watchfiles.watch``; ``stop()`` ends it (and the native watcher)."""

    def __init__(self, watchfiles: Any, paths: Sequence[Path], on_change: OnChange, *, recursive: bool,
                 debounce_ms: int, step_ms: int, thread_name: str) -> None:
        self._watchfiles = watchfiles
        self._paths = [str(p) for p in paths]
        self._recursive = recursive
        self._on_change = on_change
        self._debounce_ms = debounce_ms
        self._step_ms = step_ms
        self._stop = threading.Event()
        self.batches = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        from ql_core.log import logger

        try:
            # watch_filter=None: every change (the default filter drops names like *.swp);
            # WATCHFILES_FORCE_POLLING in the environment switches to polling (network file systems).
            for raw in self._watchfiles.watch(
                    *self._paths, watch_filter=None, debounce=self._debounce_ms, step=self._step_ms,
                    stop_event=self._stop, rust_timeout=_RUST_TIMEOUT_MS, yield_on_timeout=False,
                    recursive=self._recursive, raise_interrupt=False, ignore_permission_denied=True):
                if self._stop.is_set():
                    break
                self.batches += 1
                changes = {(_KINDS.get(int(code), "modified"), path) for code, path in raw}
                try:
                    self._on_change(changes)
                except Exception as exc:  # noqa: BLE001 - a callback error never kills the watch
                    logger.warning("wake-up callback failed: {}", type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - best effort: periodic scans carry on
            self.error = type(exc).__name__
            logger.warning("watchfiles wake-up stopped: {}: {}; periodic scans only", type(exc).__name__, exc)

    def stop(self, timeout_s: float = 2.0) -> bool:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()


class WatchfilesSource:
    """A :class:`~ql_core.follow.WakeupSource` backed by watchfiles (inotify on Linux)."""

    name = "watchfiles"

    def __init__(self) -> None:
        self._watchfiles = _watchfiles()  # fails early, with the install hint, if watchfiles is missing

    def watch(self, paths: Sequence[Path], on_change: OnChange, *, recursive: bool,
              debounce_ms: int, step_ms: int, thread_name: str) -> WatchfilesWatch:
        if not paths:
            raise ValueError("nothing to watch")
        for path in paths:
            os.stat(path)  # FileNotFoundError now, not later in the thread
        return WatchfilesWatch(self._watchfiles, paths, on_change, recursive=recursive, debounce_ms=debounce_ms,
                               step_ms=step_ms, thread_name=thread_name)


def _source(context: RuntimeContext) -> WakeupSource:
    return WatchfilesSource()


@hookimpl
def ql_register_wakeup_sources(register: RegisterWakeupSource) -> None:
    register("watchfiles", _source)


@hookimpl
def ql_check_config(config: Config) -> None:
    """A config that enables this plugin without the watchfiles package is refused by every command
    (``ql doctor`` included), not found out by ``ql supervise`` logging that wake-ups are off."""
    import importlib.util

    if config.plugin_settings.get("watchfiles"):
        from ql_core.errors import ConfigError

        raise ConfigError(f"[plugin.watchfiles] takes no settings (got {', '.join(sorted(config.plugin_settings['watchfiles']))}); "
                          f"remove the table")
    if importlib.util.find_spec("watchfiles") is None:
        from ql_core.errors import PluginError

        raise PluginError(f"plugin 'watchfiles' is enabled but the watchfiles package is not installed: "
                          f"{INSTALL_HINT}, or remove 'watchfiles' from plugins in {config.source}")
