"""Following a log, and the best-effort wake-ups that make followers and the supervisor react early.

Following
---------
:func:`follow_log` yields :class:`LogChunk` s (byte offset + bytes) from any
offset; with ``follow=True`` it goes on until the run is terminal and the file
is drained. Nothing exists while nobody follows (ADR-0007 gate 8): a follower
is a generator the caller drives — no thread, timer, buffer or open file
between two ``next()`` calls, and none at all for a plain read. The task
writes to its file, so a slow or stalled follower never slows it. A follower
also ends runs by itself: when no supervisor runs, it settles the attempt
(receipt, else process identity) through the same reconciliation code, so
``ql logs RUN --follow`` returns when the run ends. No byte past the log's
quota is ever yielded (see :mod:`ql_core.logs`).

Wake-ups
--------
A :class:`WakeupSource` (registered by a plugin through
``ql_register_wakeup_sources``; the built-in one is ``watchfiles``) tells core
that something changed below a few paths. Core uses it in two bounded places:

- :func:`start_supervisor_wakeups`: one daemon thread watching
  ``<data_dir>/receipts`` recursively; a new receipt wakes the supervisor's
  next round at once instead of at the end of its interval;
- a follower that has to wait watches *its own* log file and its receipt's
  shard directory (non-recursively) while it follows — and only then.

A wake-up only makes something happen earlier. The periodic scan and the
database index stay the truth (ADR-0007 §3.5): missed events, a missing
plugin or a failing watcher only cost latency. Profiles with
``file_watcher = "never"`` (edge, cluster-control) never start a watcher,
even when the plugin is configured, unless the environment says
``QL_FILE_WATCHER=force``; ``QL_FILE_WATCHER=off`` disables wake-ups anywhere.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .ids import UUID7_PATTERN, shard_of
from .logs import LOG_CHUNK_BYTES, enforce_log_quota, finalize_log, log_facts, read_log_chunk
from .node import node_of
from .paths import log_path, receipts_root
from .ports.artifact_store import MAX_CHUNK_BYTES
from .ports.wakeup import OnChange, WakeupSource, WakeupWatch

if TYPE_CHECKING:
    from .node import Node
    from .ports.artifact_store import ArtifactStore

__all__ = [
    "LogChunk",
    "follow_log",
    "follow_run_log",
    "follow_artifact",
    "wakeup_sources",
    "wakeup_policy",
    "start_supervisor_wakeups",
    "FILE_WATCHER_ENV",
]

#: How often a follower at the end of the log looks again (no wake-up source).
FOLLOW_POLL_S = 0.1
#: How often it checks the run's state (and tries to complete it), enforces the quota.
FOLLOW_STATE_S = 0.5
#: Debounce of the receipts watch: changes are batched for at most this long.
RECEIPT_DEBOUNCE_MS = 200
#: The watch's polling step: a single change is reported after one to two steps.
WATCH_STEP_MS = 50
#: Debounce of a follower's watch of its log (a busy log wakes it at most ~every step).
LOG_DEBOUNCE_MS = 100
#: Environment switch: "force" starts wake-ups even where the profile says never; "off" disables them.
FILE_WATCHER_ENV = "QL_FILE_WATCHER"


@dataclass(frozen=True, slots=True)
class LogChunk:
    """``data`` read at byte ``offset``; ``end`` is the offset to resume from.

    An empty ``data`` is a heartbeat (only with ``heartbeat_s``): nothing new yet.
    """

    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


# -- wake-up sources ----------------------------------------------------------------

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    from .log import logger

    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)


def wakeup_policy(node: Node) -> str:
    """Why wake-ups are (not) available: "on", "none" (no source configured), "off", "refused"."""
    node = node_of(node)  # a Runtime is accepted too: its node
    if not node.plugins.wakeup_sources.names():
        return "none"
    switch = os.environ.get(FILE_WATCHER_ENV, "").strip().lower()
    if switch == "off":
        return "off"
    if node.profile.file_watcher == "never" and switch != "force":
        return "refused"
    return "on"


def wakeup_sources(node: Node) -> list[WakeupSource]:
    """The configured wake-up sources this profile allows; [] means periodic scans only."""
    node = node_of(node)  # a Runtime is accepted too: its node
    policy = wakeup_policy(node)
    if policy == "refused":
        _warn_once("refused", f"wake-up sources {node.plugins.wakeup_sources.names()} not started: profile "
                              f"{node.profile.name!r} has file_watcher = never (use profile standalone, or set "
                              f"{FILE_WATCHER_ENV}=force); periodic scans only")
    if policy != "on":
        return []
    sources: list[WakeupSource] = []
    for name in node.plugins.wakeup_sources.names():
        try:
            sources.append(node.plugins.wakeup_sources.create(name, node.context))
        except Exception as exc:  # noqa: BLE001 - optional: degrade to periodic scans
            _warn_once(f"create:{name}", f"wake-up source {name!r} unavailable: {exc}; periodic scans only")
    return sources


def _start_watch(node: Node, paths: Sequence[Path], on_change: OnChange, **options: Any) -> WakeupWatch | None:
    for source in wakeup_sources(node):
        try:
            return source.watch(paths, on_change, **options)
        except Exception as exc:  # noqa: BLE001 - best effort
            _warn_once(f"watch:{source.name}:{options.get('thread_name')}",
                       f"wake-up source {source.name!r} could not watch ({type(exc).__name__}: {exc}); "
                       f"periodic scans only")
    return None


_RECEIPT_NAME = re.compile(rf"({UUID7_PATTERN.pattern})\.json")


def _is_receipt(root: Path, kind: str, path: str) -> bool:
    """A final receipt ``<root>/<xx>/<attempt_id>.json`` appeared (not a temp file, not quarantine)."""
    if kind == "deleted":
        return False
    p = Path(path)
    match = _RECEIPT_NAME.fullmatch(p.name)
    return (match is not None and p.parent.parent == root and p.parent.name == shard_of(match.group(1)))


def start_supervisor_wakeups(node: Node, supervisor: Any) -> WakeupWatch | None:
    """Wake ``supervisor`` (its ``wake()``) when a receipt appears; None if no source may run.

    The caller owns the returned watch: ``stop()`` it before stopping the
    supervisor. One daemon thread (plus the source's own native watcher),
    watching only ``<data_dir>/receipts`` recursively; batches are debounced
    (``RECEIPT_DEBOUNCE_MS``), so the supervisor is woken at most once per batch.
    """
    node = node_of(node)  # a Runtime is accepted too: its node
    if node.receipts is None:
        return None
    root = receipts_root(node.config.data_dir)

    def on_change(changes: set[tuple[str, str]]) -> None:
        if any(_is_receipt(root, kind, path) for kind, path in changes):
            supervisor.wake()

    return _start_watch(node, [root], on_change, recursive=True, debounce_ms=RECEIPT_DEBOUNCE_MS,
                        step_ms=WATCH_STEP_MS, thread_name="ql-wakeup-receipts")


class _FollowWaiter:
    """Where a follower waits between reads: its own watch if one could start, else a plain sleep.

    Created at a follower's first wait, closed when the follower ends.
    """

    def __init__(self, node: Node, log_id: str, attempt_id: str) -> None:
        self._event = threading.Event()
        self._receipt_seen = False
        self.watch: WakeupWatch | None = None
        if not node.plugins.wakeup_sources.names():
            return  # nothing configured: not even a policy look
        log_file = log_path(node.config.data_dir, log_id)
        shard_dir = receipts_root(node.config.data_dir) / shard_of(attempt_id)
        receipt = str(shard_dir / f"{attempt_id}.json")
        wanted = str(log_file)
        paths = [p for p in (log_file, shard_dir) if p.exists()]
        if not paths:
            return

        def on_change(changes: set[tuple[str, str]]) -> None:
            hit = False
            for kind, path in changes:
                if path == receipt and kind != "deleted":
                    self._receipt_seen = hit = True
                elif path == wanted:
                    hit = True
            if hit:
                self._event.set()

        self.watch = _start_watch(node, paths, on_change, recursive=False, debounce_ms=LOG_DEBOUNCE_MS,
                                  step_ms=WATCH_STEP_MS, thread_name=f"ql-follow-{log_id[-12:]}")

    @property
    def watched(self) -> bool:
        return self.watch is not None and self.watch.alive

    def take_receipt(self) -> bool:
        """Did the attempt's receipt appear since the last call?"""
        seen, self._receipt_seen = self._receipt_seen, False
        return seen

    def wait(self, timeout_s: float) -> None:
        if timeout_s > 0:
            self._event.wait(timeout_s)
        self._event.clear()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None


# -- following ------------------------------------------------------------------------


def follow_log(node: Node, run_id: str, *, offset: int = 0, follow: bool = False,
               chunk_bytes: int = LOG_CHUNK_BYTES, poll_s: float = FOLLOW_POLL_S,
               heartbeat_s: float | None = None) -> Iterator[LogChunk]:
    """Yield the log of ``run_id`` from byte ``offset``; with ``follow``, until the run is terminal and drained.

    - Chunks are contiguous: each starts at the previous one's ``end``; resume
      a broken stream with ``offset=last.end`` and nothing is lost or repeated.
    - An offset past the current end waits (``follow``) or yields nothing.
    - Never yields a byte at or past the log's quota (``log_max_bytes``).
    - With ``heartbeat_s``, an empty chunk is yielded after that long without
      data (lets a web host send keep-alives and notice a gone client).
    - While following a run that has not ended, it settles the attempt every
      ``FOLLOW_STATE_S`` (receipt, else identity — as a supervisor round would)
      and enforces the quota; when it sees the end it finalizes the log.
    A deleted log (retention) yields nothing. Raises ``NotFoundError`` for an
    unknown run (at the first ``next()``).
    """
    node = node_of(node)  # a Runtime is accepted too: its node
    if offset < 0:
        raise ValueError("offset must be >= 0")
    view = node.view(run_id)
    if view.log_artifact_id is None or not view.attempts:
        return
    log_id = view.log_artifact_id
    attempt_id = view.attempts[-1].attempt_id
    facts = log_facts(node, log_id)
    if facts is not None and facts.deleted:
        return
    max_bytes = facts.max_bytes if facts is not None else None
    data_dir = node.config.data_dir
    terminal = view.terminal
    next_state_look = 0.0
    last_yield = time.monotonic()
    waiter: _FollowWaiter | None = None
    try:
        while True:
            data = read_log_chunk(data_dir, log_id, offset, chunk_bytes, max_bytes=max_bytes)
            if data:
                yield LogChunk(offset, data)
                offset += len(data)
                last_yield = time.monotonic()
                continue
            if not follow or terminal:
                return
            now = time.monotonic()
            receipt_seen = waiter is not None and waiter.take_receipt()
            if receipt_seen or now >= next_state_look:
                next_state_look = now + FOLLOW_STATE_S
                terminal = _settle(node, run_id, attempt_id)
                if terminal:
                    _quietly(finalize_log, node, log_id)
                    continue  # drain what was written before the end
                if facts is not None and _quietly(enforce_log_quota, node, facts):
                    facts = facts._replace(truncated=True)
            if heartbeat_s is not None and now - last_yield >= heartbeat_s:
                yield LogChunk(offset, b"")
                last_yield = time.monotonic()
                continue
            if waiter is None:
                waiter = _FollowWaiter(node, log_id, attempt_id)
            timeout = next_state_look - now
            if not waiter.watched:
                timeout = min(timeout, poll_s)
            if heartbeat_s is not None:
                timeout = min(timeout, heartbeat_s - (now - last_yield))
            waiter.wait(timeout)
    finally:
        if waiter is not None:
            waiter.close()


def follow_run_log(node: Node, run_id: str, *, offset: int = 0, follow: bool = False,
                   heartbeat_s: float | None = None) -> Iterator[LogChunk]:
    """A run's log wherever it lives: on a cluster profile (``artifact_store`` set) the chunks the
    worker shipped to the artifact store (:func:`follow_artifact`), else this node's file
    (:func:`follow_log`). Same chunks, same byte offsets, same resume rule."""
    node = node_of(node)  # a Runtime is accepted too: its node
    name = node.config.artifact_store
    if not name:
        yield from follow_log(node, run_id, offset=offset, follow=follow, heartbeat_s=heartbeat_s)
        return
    store = node.plugins.artifact_stores.create(name, node.context)
    try:
        yield from follow_artifact(store, run_id, offset=offset, follow=follow, heartbeat_s=heartbeat_s,
                                   unfinalized_s=float(node.profile.log_follow_unfinalized_s))
    finally:
        store.close()


#: How often a follower of a shipped log looks again when its store cannot notify it of a change
#: (and how often it looks for the first attempt of a queued run: a claim sends no notification).
ARTIFACT_POLL_S = 0.25
#: How often a follower whose store notifies it (``ArtifactChangeWaiter``) still looks at the run's
#: state: a run can end without any change to its artifact (``lost``: its worker is gone).
ARTIFACT_STATE_S = 1.0


def follow_artifact(store: ArtifactStore, run_id: str, *, offset: int = 0, follow: bool = False,
                    chunk_bytes: int = MAX_CHUNK_BYTES, poll_s: float = ARTIFACT_POLL_S,
                    heartbeat_s: float | None = None, unfinalized_s: float = 120.0,
                    state_s: float = ARTIFACT_STATE_S,
                    on_new_attempt: Callable[[str | None, str], None] | None = None) -> Iterator[LogChunk]:
    """Yield a run's shipped log (its current attempt's artifact) from byte ``offset``.

    The byte offsets are the worker's local file's: resume with ``offset=last.end``. Without
    ``follow`` it yields what is committed now. With ``follow`` it goes on until the run is terminal
    and the artifact is finalized and drained — or, when the run ended but its worker has not
    finalized the log, until nothing new was committed for ``unfinalized_s`` (the worker is gone; a
    later ``--offset`` picks up what it ships when it restarts). Between reads it sleeps until the
    store says the artifact changed (:class:`~ql_core.ports.artifact_store.ArtifactChangeWaiter`:
    for PostgreSQL, ``LISTEN ql_artifact``), looking at the run's state at least every ``state_s``;
    a store that cannot notify is polled every ``poll_s``. Memory: one chunk at a time.

    ``on_new_attempt(old, new)``: when the run is running again as a new attempt (a lost attempt
    of a run with retries), follow the new one from its byte 0 — after calling this, so the caller
    can say so; the chunks' offsets then start again at 0. It is also called with ``old=None`` when
    the follower learns the attempt it starts with (at once, or when a worker claims a queued run),
    so the caller always knows which attempt the offsets are of. Without it the follower stays on
    the attempt it started with. Raises ``NotFoundError`` for an unknown run.
    """
    from .errors import NotFoundError
    from .ports.artifact_store import ArtifactChangeWaiter

    if offset < 0:
        raise ValueError("offset must be >= 0")
    ref = store.run_log(run_id)
    if ref is None:
        raise NotFoundError(f"run {run_id[:80]!r} not found in the cluster's control database")
    waiter = store if follow and isinstance(store, ArtifactChangeWaiter) else None
    attempt_id = ref.attempt_id
    if attempt_id is not None and on_new_attempt is not None:
        on_new_attempt(None, attempt_id)
    last_progress = last_yield = time.monotonic()
    fresh = True  # something may have been committed: read (at the start, after a wake-up or a poll)
    next_look = 0.0  # the next look at the run's state
    while True:
        if attempt_id is not None and fresh:
            data = store.read(attempt_id, offset, chunk_bytes)
            if data:
                yield LogChunk(offset, data)
                offset += len(data)
                last_progress = last_yield = time.monotonic()
                continue
        if not follow:
            return
        now = time.monotonic()
        if fresh or now >= next_look or attempt_id is None or ref.terminal:
            next_look = now + state_s
            ref = store.run_log(run_id)
            if ref is None:
                return  # forgotten by history retention while we followed
            if attempt_id is None:
                attempt_id = ref.attempt_id  # it was queued: follow its first attempt
                if attempt_id is not None and on_new_attempt is not None:
                    on_new_attempt(None, attempt_id)
            elif on_new_attempt is not None and ref.attempt_id is not None and ref.attempt_id != attempt_id:
                on_new_attempt(attempt_id, ref.attempt_id)
                attempt_id, offset, fresh = ref.attempt_id, 0, True
                last_progress = time.monotonic()
                continue
            state = store.state(attempt_id) if attempt_id is not None else None
            if state is not None and state.committed_bytes > offset:
                fresh = True
                continue  # committed between the read and this look (or no wake-up came): read it
            if ref.terminal:
                if attempt_id is None or (state is not None and state.finalized):
                    return
                if state is None and not ref.attempt_started:
                    return  # ended before its task ever started: no log will come
                if time.monotonic() - last_progress >= unfinalized_s:
                    return
        fresh = False
        now = time.monotonic()
        if heartbeat_s is not None and now - last_yield >= heartbeat_s:
            yield LogChunk(offset, b"")
            last_yield = time.monotonic()
            continue
        if waiter is None or attempt_id is None:
            timeout = poll_s  # no wake-up to wait for (none comes for a claim either)
        else:
            timeout = max(0.0, next_look - now)
        if ref.terminal:  # only waiting out unfinalized_s
            timeout = min(timeout, max(0.0, unfinalized_s - (now - last_progress)))
        if heartbeat_s is not None:
            timeout = min(timeout, max(0.0, heartbeat_s - (now - last_yield)))
        if waiter is not None:
            fresh = waiter.wait_for_change(attempt_id, timeout)
        else:
            time.sleep(timeout)
            fresh = True


def _settle(node: Node, run_id: str, attempt_id: str) -> bool:
    """Is the run over? If not, try to end it: its passed deadline, its receipt or its exited process."""
    view = node.view(run_id)
    if view.terminal:
        return True
    if node.consumer is not None:
        from .reconciler import settle

        settle(node, view)
        return node.view(run_id).terminal
    return False


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    """Log maintenance done by a follower never breaks the follow (the next round retries)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        from .log import logger

        logger.warning("follower: {} failed: {}", getattr(fn, "__name__", "?"), type(exc).__name__)
        return None
