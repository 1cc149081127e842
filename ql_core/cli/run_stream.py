"""``ql run`` on a cluster control node: the task runs on a worker; its output streams from the chunks
the worker ships to the artifact store, like a local run's from its file.

The stream is :func:`ql_core.follow.follow_artifact` (it sleeps until the store's notification —
``LISTEN ql_artifact`` — and looks at the run's state about once a second), pumped by ``ql run``
between its Ctrl-C checks. Memory: one chunk (at most 1 MiB) at a time. When the run ended and its
worker has not finalized the log, ``ql run`` waits for the rest at most :data:`RUN_UNFINALIZED_S`
(or ``log_follow_unfinalized_s`` when smaller), then says so and exits with the run's status: the
rest stays readable with ``ql logs RUN --offset N`` once the worker ships it.
"""

from __future__ import annotations

import errno
import sys
import time
from typing import Any

__all__ = ["ShippedStreamer", "RUN_UNFINALIZED_S", "PUMP_S"]

#: How long ``ql run`` waits, once the run ended, for a log its worker has not finalized.
RUN_UNFINALIZED_S = 10.0
#: The longest one pump blocks (waiting for the store's notification, or writing a busy stream):
#: how soon ``ql run`` sees a Ctrl-C.
PUMP_S = 0.5


class ShippedStreamer:
    """Copies the run's shipped log to our stdout as the worker commits it (see the module docstring).

    ``done``: the stream ended (the run ended and its log is drained, or given up on). ``stopped``:
    our stdout went away; the stream is still consumed (to know when it ended), nothing is written.
    """

    def __init__(self, rt: Any, run_id: str) -> None:
        from ql_core.follow import follow_artifact

        self._run_id = run_id
        self._store = rt.plugins.artifact_stores.create(rt.config.artifact_store, rt.context)
        self._unfinalized_s = min(RUN_UNFINALIZED_S, float(rt.config.profile.log_follow_unfinalized_s))
        self._follow = follow_artifact
        self._offset = 0
        #: The attempt our offset is of (None until the follower names it).
        self._attempt: str | None = None
        self._chunks: Any = None
        self._retry_at = 0.0
        self._gave_up = False
        self.done = False
        self.stopped = False

    def _stream(self) -> Any:
        """The follower, from our offset — of the attempt we streamed: one started again after the
        database was away finds the run maybe running a newer attempt, followed from its start."""
        if self._attempt is not None:
            ref = self._store.run_log(self._run_id)
            if ref is not None and ref.attempt_id not in (None, self._attempt):
                self._new_attempt(self._attempt, ref.attempt_id)
        return self._follow(self._store, self._run_id, offset=self._offset, follow=True, heartbeat_s=PUMP_S,
                            unfinalized_s=self._unfinalized_s, on_new_attempt=self._new_attempt)

    def pump(self, *, drain: bool = False) -> None:
        """Write what was committed; block at most about :data:`PUMP_S` waiting for more. (``drain``
        is the local streamer's word: this one is drained when ``done``.)"""
        from ql_core.cli.notes import note
        from ql_core.ports.artifact_store import ArtifactStoreError, ArtifactStoreUnavailable

        if self.done:
            return
        deadline = time.monotonic() + PUMP_S
        if self._chunks is None:
            if time.monotonic() < self._retry_at:
                time.sleep(max(0.0, min(PUMP_S, self._retry_at - time.monotonic())))
                return
        try:
            if self._chunks is None:
                self._chunks = self._stream()
            for chunk in self._chunks:
                if chunk.data:
                    self._offset = chunk.end
                    if not self.stopped:
                        self._write(chunk.data)
                if not chunk.data or time.monotonic() >= deadline:
                    return
        except ArtifactStoreUnavailable:
            # The control database did not answer: go on from the same byte a little later.
            self._chunks = None
            self._retry_at = time.monotonic() + 1.0
            return
        except ArtifactStoreError as exc:  # this role may not read logs, a schema mismatch: stop streaming
            self._gave_up = self.done = True
            self._chunks = None
            note(False, "not_streaming", f"ql: not streaming the task's output: {type(exc).__name__}; "
                                         f"the run goes on (ql logs {self._run_id})")
            return
        self.done = True

    def close(self) -> None:
        """End the stream (no connection left open); says so when the log was not finalized."""
        if self.done and not self._gave_up:
            self._note_unfinalized()
        if self._chunks is not None:
            self._chunks.close()
        self._store.close()

    def _write(self, data: bytes) -> None:
        from ql_core.cli.output import silence_stdout

        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (BrokenPipeError, ValueError):
            self.stopped = True
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EBADF):
                raise
            self.stopped = True
        if self.stopped:
            silence_stdout()  # the rest of our output (and Python's final flush) goes nowhere

    def _new_attempt(self, old: str | None, new: str) -> None:
        from ql_core.cli.notes import note

        self._attempt = new
        if old is None:
            return
        self._offset = 0
        note(False, "new_attempt", f"ql: attempt {old} of run {self._run_id} was lost; the run runs again as "
                                   f"attempt {new}: its output follows from its start")

    def _note_unfinalized(self) -> None:
        from ql_core.cli.notes import note
        from ql_core.ports.artifact_store import ArtifactStoreError

        try:
            ref = self._store.run_log(self._run_id)
            if ref is None or ref.attempt_id is None or not ref.attempt_started:
                return
            state = self._store.state(ref.attempt_id)
        except ArtifactStoreError:
            return
        if state is None or not state.finalized:
            note(False, "log_unfinalized", f"ql: the worker has not finalized the log of run {self._run_id}; "
                                           f"ql logs {self._run_id} reads what it ships later")
