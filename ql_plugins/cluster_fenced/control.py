"""``ql control``: the control plane's bounded sweeper loop (DESIGN.md §9; ADR-0007 §2.6 lifecycle).

Every ``sweep_interval_s`` one round: at most ``sweep_pages_per_round`` calls of ``ql_sweep`` with
``sweep_page`` rows per step each — expired ``claimed`` leases back to the queue, expired
``starting``/``running`` leases ``lost`` (``LEASE_EXPIRED``, or a new attempt where the run's retry
policy allows), passed deadlines → timeout intents, retention of ended leases and leftover specs.
A round ends early when a call found less than a page of work. Then one call of the artifact
store's retention (shipped logs of runs that ended more than ``log_retention_s`` ago, at most
``artifact_sweep_page`` chunks). Each call is one transaction; the
next round starts only after the previous one ended (no overlap); a stop request is seen between
calls, so stopping takes at most one call (bounded by the statement timeout).

Several ``ql control`` processes may run at once: the sweep takes its candidates with ``FOR NO KEY
UPDATE SKIP LOCKED`` and re-checks them under the lock, so they split the work and never act twice.
The control database unreachable is logged and retried with a capped backoff; it never ends the loop.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

from ql_core import metrics
from ql_core.log import logger

__all__ = ["run_sweeper", "Sweeper"]


class Sweeper:
    """One ``ql control`` process's sweeper (its own connection)."""

    def __init__(self, url: str, profile: Any, *, on_round: Callable[[dict[str, int]], None] | None = None,
                 make_artifact_store: Callable[[], Any] | None = None) -> None:
        self.url = url
        self._make_artifact_store = make_artifact_store
        self._artifacts: Any = None
        self.profile = profile
        self.on_round = on_round
        self.totals: Counter[str] = Counter()
        self.rounds = 0
        self.failures = 0
        self._db: Any = None

    def _client(self) -> Any:
        from .control_db import ControlDB

        if self._db is None:
            timeout_ms = int(max(1.0, self.profile.control_call_timeout_s) * 1000)
            self._db = ControlDB.connect(self.url, statement_timeout_ms=timeout_ms,
                                         call_timeout_s=self.profile.control_call_timeout_s)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._artifacts is not None:
            self._artifacts.close()
            self._artifacts = None

    def _sweep_artifacts(self, counts: Counter[str]) -> None:
        """One bounded retention call of the artifact store (its errors are the store's own)."""
        from ql_core.ports.artifact_store import ArtifactStoreError

        if self._make_artifact_store is None:
            return
        try:
            if self._artifacts is None:
                self._artifacts = self._make_artifact_store()
            done = self._artifacts.sweep(retention_s=float(self.profile.log_retention_s),
                                         limit=int(self.profile.artifact_sweep_page))
        except ArtifactStoreError as exc:
            logger.warning("log retention failed this round: {}", exc)
            return
        counts["log_chunks_deleted"] += done.chunks_deleted
        counts["logs_deleted"] += done.artifacts_deleted

    def round(self, stop: threading.Event | None = None) -> dict[str, int]:
        """One bounded round; the counts of what it did."""
        page = int(self.profile.sweep_page)
        retention_ms = int(self.profile.lease_retention_s * 1000)
        counts: Counter[str] = Counter()
        for _ in range(int(self.profile.sweep_pages_per_round)):
            if stop is not None and stop.is_set():
                break
            done = self._client().sweep(page, retention_ms=retention_ms)
            for key in ("requeued", "lost", "retried", "timeouts", "leases_deleted", "specs_deleted", "skipped"):
                counts[key] += int(getattr(done, key))
            counts["calls"] += 1
            # Less than a page in every step: nothing is left for another call this round.
            if max(done.requeued + done.lost + done.retried, done.timeouts, done.leases_deleted,
                   done.specs_deleted) < page and done.skipped == 0:
                break
        if not (stop is not None and stop.is_set()):
            self._sweep_artifacts(counts)
        self.rounds += 1
        self.totals.update(counts)
        for key in ("requeued", "lost", "retried"):  # expired leases, for --metrics-listen (a no-op when off)
            metrics.count(key, counts[key])
        return dict(counts)

    def run(self, stop: threading.Event) -> int:
        """Rounds every ``sweep_interval_s`` until ``stop`` is set. Returns the exit status (0)."""
        from .control_db import ControlDBError

        backoff = self.profile.sweep_interval_s
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    counts = self.round(stop)
                except ControlDBError as exc:
                    self.failures += 1
                    logger.warning("sweep failed, retried in {:.1f}s: {}", backoff, exc)
                    self.close()
                    stop.wait(backoff)
                    backoff = min(backoff * 2, max(30.0, self.profile.sweep_interval_s))
                    continue
                backoff = self.profile.sweep_interval_s
                acted = {k: v for k, v in counts.items() if v and k != "calls"}
                if acted:
                    logger.info("sweep: {}", " ".join(f"{k}={v}" for k, v in sorted(acted.items())))
                if self.on_round is not None:
                    self.on_round(counts)
                remaining = self.profile.sweep_interval_s - (time.monotonic() - started)
                if remaining > 0:
                    stop.wait(remaining)
        finally:
            self.close()
        return 0


def run_sweeper(url: str, profile: Any, stop: threading.Event, *,
                make_artifact_store: Callable[[], Any] | None = None) -> int:
    logger.info("ql control: sweeping every {:g}s ({} rows per step, {} calls per round at most)",
                profile.sweep_interval_s, profile.sweep_page, profile.sweep_pages_per_round)
    return Sweeper(url, profile, make_artifact_store=make_artifact_store).run(stop)
