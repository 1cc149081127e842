"""The portable identity source (``identity`` module doc): psutil's boot time and create time.

Used by default where there is no ``/proc`` (macOS, the BSDs) and forced on Linux by
``QL_IDENTITY_SOURCE=psutil`` so that this path stays proven on the machines that run the tests.

- boot identity: ``psutil.boot_time()`` in whole seconds; the same boot within ``BOOT_SLACK_S``
  (Linux derives it from the wall clock minus uptime, so it can move by a second under NTP);
- start time: ``Process(pid).create_time()`` in milliseconds; the same process within
  ``START_SLACK_MS``. Pid reuse inside that slack would need the whole pid space to wrap within
  two seconds, which no supported system does;
- process group: ``os.getpgid``; status zombie or dead means exited;
- the create time is read again after the group, so a pid that changed owner between the reads is
  not mistaken for the one whose group was read.

psutil is imported on first use. Where it is missing, identity is unverifiable (the caller blocks,
never signals, never guesses) and one log line says how to install it.
"""

from __future__ import annotations

import os
from types import ModuleType

from ql_core.log import logger

from .identity_source import IdentityUnreadable, ProcStat

__all__ = ["BOOT_SLACK_S", "START_SLACK_MS", "PSUTIL_SOURCE", "PsutilSource"]

BOOT_SLACK_S = 2
START_SLACK_MS = 2000
_INSTALL_HINT = "pip install 'psutil>=5.9' (the ql package requires it outside Linux)"


class PsutilSource:
    name = "psutil"

    def __init__(self) -> None:
        self._module: ModuleType | None = None
        self._warned = False

    def _psutil(self) -> ModuleType:
        if self._module is None:
            try:
                import psutil
            except ImportError as exc:
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "process identity: psutil is not installed, every task handle is "
                        "unverifiable until it is: {}",
                        _INSTALL_HINT,
                    )
                raise IdentityUnreadable("psutil is not installed") from exc
            self._module = psutil
        return self._module

    def boot(self) -> str | None:
        try:
            value = self._psutil().boot_time()
        except Exception:  # IdentityUnreadable, or anything psutil raises on an odd system
            return None
        if not isinstance(value, (int, float)) or value <= 0:
            return None
        return str(int(round(value)))

    def valid_boot(self, value: str) -> bool:
        return value.isascii() and value.isdigit() and len(value) <= 19

    def same_boot(self, stored: str, current: str) -> bool:
        return abs(int(stored) - int(current)) <= BOOT_SLACK_S

    def same_start(self, stored: int, current: int) -> bool:
        return abs(stored - current) <= START_SLACK_MS

    def _create_ms(self, psutil: ModuleType, pid: int) -> int:
        return int(round(psutil.Process(pid).create_time() * 1000))

    def stat(self, pid: int) -> ProcStat | None:
        psutil = self._psutil()
        try:
            proc = psutil.Process(pid)
            created = int(round(proc.create_time() * 1000))
            status = proc.status()
            pgrp = os.getpgid(pid)
            if self._create_ms(psutil, pid) != created:
                return None  # the pid now names another process: ours is gone
        except psutil.ZombieProcess:
            # Some systems cannot read a zombie's create time; a zombie has exited either way.
            return ProcStat(state="Z", pgrp=-1, start_time=-1)
        except (psutil.NoSuchProcess, ProcessLookupError):
            return None
        except psutil.AccessDenied as exc:
            raise IdentityUnreadable("access denied") from exc
        except OSError as exc:
            raise IdentityUnreadable(str(exc)) from exc
        gone = status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        return ProcStat(state="Z" if gone else "R", pgrp=pgrp, start_time=created)


PSUTIL_SOURCE = PsutilSource()
