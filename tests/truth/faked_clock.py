"""Wall clocks stepped for real in the kill loop's `ql` processes: libfaketime, preloaded.

Only the wall clock is faked (``FAKETIME_DONT_FAKE_MONOTONIC=1``): a real clock step never moves
CLOCK_MONOTONIC or CLOCK_BOOTTIME. A process runs 1 h behind (``-1h``), 1 h ahead (``+1h``), or on the
shared *stepping* clock (``step``): its offset is read from a file at every call
(``FAKETIME_TIMESTAMP_FILE`` with ``FAKETIME_NO_CACHE=1``), which :meth:`Clocks.step` rewrites while
those processes run — a step in the middle of their work.

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails ``clock_nanosleep`` (EINVAL), which
is Python's ``time.sleep`` (and so subprocess's timed wait); its ``select`` is not affected. The faked
processes get a ``time.sleep`` made of ``select`` through a ``sitecustomize`` on their PYTHONPATH
(as in ``test_clock_steps.py``, commit c50aaa0): nothing the loop judges, only what lets Python run
there. The compiled launcher is static (libfaketime cannot reach it) and tasks are started without
``LD_PRELOAD``.

libfaketime 0.9.10 leaves a ``/dev/shm/faketime_shm_PID`` and ``sem.faketime_sem_PID`` behind for
each faked process that forks, and never removes them: :meth:`Clocks.remove_leftovers` removes
those of the given pids that appeared while the loop ran.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

__all__ = ["CLOCKS", "LIBFAKETIME", "Clocks", "faketime_available"]

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SHM = "/dev/shm"
#: The clocks a faked process may get.
CLOCKS = ("-1h", "+1h", "step")
#: The offsets the stepping clock moves between (each step changes it).
STEPS = ("+0", "-1h", "+1h", "-10m", "+10m")

SITECUSTOMIZE = """
import select, time

def _sleep(seconds):
    if seconds > 0:
        select.select([], [], [], seconds)

time.sleep = _sleep
"""


def faketime_available() -> bool:
    return shutil.which("faketime") is not None and os.path.exists(LIBFAKETIME)


class Clocks:
    """Faked-clock environments under ``directory`` (the shim and the stepping clock's file)."""

    def __init__(self, directory: Path, rng: random.Random) -> None:
        self._rng = rng
        self._shim = directory / "shim"
        self._shim.mkdir(parents=True)
        (self._shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self._shm_before = set(os.listdir(SHM)) if os.path.isdir(SHM) else set()
        self._file = directory / "stepping.offset"
        self.offset = "+0"
        self._write(self.offset)

    def _write(self, offset: str) -> None:
        # Whole-file replace: a reader never sees a half-written offset.
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(offset + "\n")
        os.replace(tmp, self._file)

    def env(self, base: dict[str, str], clock: str) -> dict[str, str]:
        """``base`` for a process on ``clock`` (one of :data:`CLOCKS`)."""
        path = os.pathsep.join(p for p in (str(self._shim), base.get("PYTHONPATH", "")) if p)
        env = dict(base, LD_PRELOAD=LIBFAKETIME, FAKETIME_DONT_FAKE_MONOTONIC="1", PYTHONPATH=path)
        if clock == "step":
            env.update(FAKETIME_TIMESTAMP_FILE=str(self._file), FAKETIME_NO_CACHE="1")
        else:
            env["FAKETIME"] = clock
        return env

    def remove_leftovers(self, pids: set[int]) -> int:
        """Remove libfaketime's shared-memory files of ``pids`` (processes of the loop's, all ended)
        that were not there before; returns how many."""
        removed = 0
        for pid in pids:
            for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
                if name not in self._shm_before:
                    try:
                        os.unlink(os.path.join(SHM, name))
                        removed += 1
                    except FileNotFoundError:
                        pass
        return removed

    def step(self) -> str:
        """Step the shared clock to another offset; returns it."""
        self.offset = self._rng.choice([s for s in STEPS if s != self.offset])
        self._write(self.offset)
        return self.offset
