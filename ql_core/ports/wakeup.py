"""The wake-up seam: best-effort "something changed below these paths" notifications.

A wake-up only makes something happen *earlier*: the periodic scan and the
database index stay the source of truth (ADR-0007 §3.5). A source that is
missing, refused by the profile (``file_watcher = "never"``) or failing only
makes ql slower. Core uses it to wake the supervisor when a receipt appears
and to wake a log follower when its log grows. Contract: :class:`ql_core.testing.WakeupSourceContract`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Literal, Protocol, Sequence, runtime_checkable

__all__ = ["ChangeKind", "OnChange", "WakeupWatch", "WakeupSource"]

ChangeKind = Literal["added", "modified", "deleted"]
#: Called from the watcher's thread with a debounced batch of ``(kind, absolute path)``.
OnChange = Callable[[set[tuple[str, str]]], None]


@runtime_checkable
class WakeupWatch(Protocol):
    """A running watch: one daemon thread, stopped explicitly."""

    @property
    def alive(self) -> bool:
        """True while the watch thread runs."""

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop watching; wait at most ``timeout_s`` for the thread. True if it has ended."""


@runtime_checkable
class WakeupSource(Protocol):
    """Best-effort change notifications for a few paths (never a source of truth)."""

    name: str

    def watch(self, paths: Sequence[Path], on_change: OnChange, *, recursive: bool,
              debounce_ms: int, step_ms: int, thread_name: str) -> WakeupWatch:
        """Start a daemon thread that calls ``on_change`` after changes below ``paths``.

        ``recursive=False`` watches directories' direct entries (and files
        themselves). Changes are batched: a batch ends when nothing new arrived
        for ``step_ms`` or after ``debounce_ms``. ``on_change`` runs in the
        watch thread; its exceptions are logged, never propagated. Raises
        ``OSError`` (e.g. a path is missing, the inotify limit is reached) or
        :class:`~ql_core.errors.PluginError` when the watch cannot start; if it
        fails later, the thread logs it and ends.
        """
