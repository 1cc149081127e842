"""Following a log: chunks with their byte offsets, until the run ends and the file is drained.

Nothing exists while nobody follows: no thread, timer or buffer — a follower
is a generator the caller drives. The task writes to its file, so a slow or
stalled follower never slows it. A follower also ends runs by itself: when
no supervisor runs, it consumes the attempt's receipt (or classifies an
exited process) through the same reconciliation code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from .logs import LOG_CHUNK_BYTES, read_log_chunk

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["LogChunk", "follow_log"]

#: How often a follower at the end of the log looks again.
FOLLOW_POLL_S = 0.1
#: How often it checks the run's state (and tries to complete it).
FOLLOW_STATE_S = 0.5


@dataclass(frozen=True, slots=True)
class LogChunk:
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


def follow_log(rt: Runtime, run_id: str, *, offset: int = 0, follow: bool = False,
               chunk_bytes: int = LOG_CHUNK_BYTES, poll_s: float = FOLLOW_POLL_S) -> Iterator[LogChunk]:
    """Yield the log of ``run_id`` from ``offset``; with ``follow``, until the run is terminal and drained."""
    view = rt.status(run_id)
    if view.log_artifact_id is None:
        return
    log_id = view.log_artifact_id
    next_state_look = 0.0
    terminal = view.terminal
    while True:
        data = read_log_chunk(rt.config.data_dir, log_id, offset, chunk_bytes)
        if data:
            yield LogChunk(offset, data)
            offset += len(data)
            continue
        if not follow or terminal:
            return
        if time.monotonic() >= next_state_look:
            next_state_look = time.monotonic() + FOLLOW_STATE_S
            terminal = _settle(rt, run_id)
            if terminal:
                continue  # drain what was written before the end
        wake = getattr(rt, "log_wakeup", None)
        if wake is not None:
            wake(log_id, poll_s)
        else:
            time.sleep(poll_s)


def _settle(rt: Runtime, run_id: str) -> bool:
    """Is the run over? If not, try to end it from its receipt or its exited process."""
    view = rt.status(run_id)
    if view.terminal:
        return True
    if rt.consumer is not None and view.attempts:
        rt.recover_attempt(view.attempts[-1]["attempt_id"])
        return rt.status(run_id).terminal
    return False
