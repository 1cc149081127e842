"""Log retention and the supervisor's log round (ADR-0007 §2.3, docs/logs.md "Retention").

:func:`enforce_log_retention` deletes logs of *terminal* attempts of this node by age
(``log_retention_s``) and by total size (``log_total_max_bytes``), in pages until the round's
``retention_budget_ms`` is spent; the log of an active or blocked attempt is never deleted.
:class:`LogKeeper` is what a round runs: the quota pass over running logs
(:func:`ql_core.logs.enforce_log_quotas`), then retention. The files themselves (opening, cutting,
sizing, dropping) are :mod:`ql_core.logs`'.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterator

from .errors import UnsafePathError
from .logs import enforce_log_quotas, finalize_logs, unlink_log_file
from .records import LogFacts

if TYPE_CHECKING:
    from .node import Node

__all__ = ["LogKeeper", "delete_log", "delete_log_file", "enforce_log_retention"]


def delete_log_file(node: Node, log_artifact_id: str) -> None:
    """Remove one log file (never following a link, never a directory); gone already is fine."""
    unlink_log_file(node.config.data_dir, log_artifact_id)


def delete_log(node: Node, facts: LogFacts, now: int) -> None:
    """Delete an ended attempt's log: unlink first, then record: a crash in between leaves a row whose file is already gone."""
    unlink_log_file(node.config.data_dir, facts.id)
    node.journal.mark_log_deleted(facts.id, now, facts.size_bytes if facts.size_bytes is not None else 0)


def enforce_log_retention(node: Node, limit: int, *, deadline: float | None = None) -> Counter[str]:
    """A retention pass over this node's logs of *terminal* attempts, in pages of ``limit``.

    Three steps, oldest first, each read from a partial index (never a walk of history):
    1. size logs of ended attempts left unsized (a crash between the terminal commit and the
       sizing; normally the process that ended the run sized it);
    2. delete logs older than ``log_retention_s``;
    3. while the recorded total (``ql_tally``, kept by the store) exceeds ``log_total_max_bytes``,
       delete the oldest.
    Each step goes on to a next page while its pages come back full and ``time.monotonic()`` is
    before ``deadline`` (None: one page per step). Logs of running, starting or blocked attempts
    are never deleted (and not counted in the total: each is bounded by its own quota). Returns
    counts: ``log_finalized``, ``log_truncated``, ``log_expired``, ``log_evicted``, ``log_errors``
    and ``retention_more`` (the deadline stopped a step with work left).
    """
    from .clock import now_ms

    counts: Counter[str] = Counter()
    if limit <= 0:
        return counts
    owner = node.node_id

    def pages(fetch: Callable[[], list[LogFacts]]) -> Iterator[list[LogFacts]]:
        while True:
            rows = fetch()
            if rows:
                yield rows
            if len(rows) < limit:
                return
            if deadline is None or time.monotonic() >= deadline:
                counts["retention_more"] = 1
                return

    # 1. size: cut each to its quota, then record the page's sizes in one transaction
    seen: set[str] = set()
    for page in pages(lambda: node.journal.ended_logs(owner, unsized=True, limit=limit)):
        fresh = [f.id for f in page if f.id not in seen]
        if not fresh:
            break  # every log of the page failed before: next round
        seen.update(fresh)
        counts.update(finalize_logs(node, fresh))

    # 2. age
    now = now_ms()
    cutoff = now - int(node.profile.log_retention_s * 1000)
    failed: set[str] = set()
    for page in pages(lambda: node.journal.ended_logs(owner, created_before_ms=cutoff, limit=limit)):
        if all(f.id in failed for f in page):
            break
        for facts in page:
            if facts.id in failed:
                continue
            try:
                delete_log(node, facts, now)
                counts["log_expired"] += 1
            except (OSError, UnsafePathError) as exc:
                failed.add(facts.id)
                counts["log_errors"] += 1
                _warn(f"expired log {facts.id} not deleted this round: {type(exc).__name__}")

    # 3. total size
    excess = node.journal.ended_log_bytes(owner) - node.profile.log_total_max_bytes
    failed.clear()
    for page in pages(lambda: node.journal.ended_logs(owner, sized=True, limit=limit) if excess > 0 else []):
        if all(f.id in failed for f in page):
            break
        for facts in page:
            if excess <= 0:
                break
            if facts.id in failed:
                continue
            try:
                delete_log(node, facts, now)
            except (OSError, UnsafePathError) as exc:
                failed.add(facts.id)
                counts["log_errors"] += 1
                _warn(f"log {facts.id} not evicted this round: {type(exc).__name__}")
                continue
            counts["log_evicted"] += 1
            excess -= facts.size_bytes or 0
    return counts


class LogKeeper:
    """Log quota and retention for a periodic round; holds the quota pass's cursor.

    Wiring (in the reconciler's round, after the receipts)::

        counts = self.log_keeper.round(limit)     # limit = page_size * pages_per_round
        report.counts.update(counts)

    ``round`` never raises for a database or file-system problem of one log; it
    counts it (``log_errors``) and the next round retries.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.cursor = ""

    def round(self, limit: int, *, deadline: float | None = None) -> Counter[str]:
        counts, self.cursor = enforce_log_quotas(self.node, limit, cursor=self.cursor)
        counts.update(enforce_log_retention(self.node, limit, deadline=deadline))
        return counts


def _warn(message: str) -> None:
    from .log import logger

    logger.warning(message)
