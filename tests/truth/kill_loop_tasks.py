"""The kill loop's tasks: what each is asked to do, and the marks it leaves on the boot clock.

A task's run name records what it was asked — ``code=C dur=D timeout=T key=K`` (T = 0: no deadline)
— in the create commit, so its verdict can be judged whatever happened to its host. The task leaves
marks in ``MARKS/K.s`` (it started), ``K.t`` (a TERM reached it) and ``K.e`` (it slept its whole
duration and is about to exit), each holding ``/proc/uptime``: CLOCK_BOOTTIME, which no wall-clock
step moves, in centiseconds (floored). The loop judges deadlines against those marks, never
against any process's wall clock. On TERM the task exits 143, as a shell killed by TERM would
report.

Durations and timeouts never sit close together: a timeout is far below (0.1 s) or far above (3 s)
the task's duration, so "timed out or not" is never a judgement call; the 1.5 s task with a 0.1 s
deadline is there to show a deadline enforced late (its end mark would exist).

Imported by the test and, as a sibling module, by ``kill_host.py`` (run as a script).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Asked", "Marks", "choose", "parse_name", "read_marks", "script"]

DURATIONS = (0.0, 0.05, 0.2, 0.4, 0.8, 1.5)
CODES = (0, 0, 0, 1, 2, 3, 42, 255)
SHORT_TIMEOUT = 0.1
LONG_TIMEOUT = 3.0


@dataclass(frozen=True)
class Asked:
    """What one run was asked to do (``timeout`` 0: no deadline); ``key`` names its marks."""

    code: int
    duration: float
    timeout: float
    key: str

    @property
    def name(self) -> str:
        return f"code={self.code} dur={self.duration} timeout={self.timeout} key={self.key}"


@dataclass(frozen=True)
class Marks:
    """Boot-clock seconds (floored to 10 ms) at which the task started, got a TERM, slept its whole
    duration; None: that did not happen (or the task was killed while writing it)."""

    start: float | None = None
    term: float | None = None
    end: float | None = None


def choose(rng: random.Random, key: str) -> Asked:
    code = rng.choice(CODES)
    duration = rng.choice(DURATIONS)
    short = SHORT_TIMEOUT if duration >= 0.4 else LONG_TIMEOUT
    timeout = rng.choice([0.0, 0.0, 0.0, LONG_TIMEOUT, short])
    return Asked(code, duration, timeout, key)


def parse_name(name: str) -> Asked:
    parts = dict(part.split("=", 1) for part in name.split())
    return Asked(int(parts["code"]), float(parts["dur"]), float(parts["timeout"]), parts["key"])


def script(asked: Asked, marks: Path) -> str:
    """The task's ``sh -c`` string (marks is an absolute path without spaces or quotes)."""
    at = f"{marks}/{asked.key}"
    return (f"trap 'read t _ </proc/uptime; echo $t >{at}.t; exit 143' TERM; "
            f"read s _ </proc/uptime; echo $s >{at}.s; sleep {asked.duration}; "
            f"read e _ </proc/uptime; echo $e >{at}.e; exit {asked.code}")


def read_marks(marks: Path, key: str) -> Marks:
    def one(suffix: str) -> float | None:
        try:
            return float((marks / f"{key}.{suffix}").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None  # not written, or cut short by a SIGKILL of the task's group

    return Marks(one("s"), one("t"), one("e"))
