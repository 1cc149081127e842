"""Client-side deadlines of control-database calls (:class:`CallDeadlines`, used by :mod:`.control_db`)."""

from __future__ import annotations

import os
import threading
import time

__all__ = ["CallDeadlines", "CALL_DEADLINES"]


class CallDeadlines:
    """One daemon thread that shuts down the socket of a control-database call past its deadline.

    libpq has no client-side query timeout, and a network that silently drops packets (or a proxy
    that stops forwarding) leaves a call waiting for ever: the server never sees the query, so its
    ``statement_timeout`` never fires. Shutting the socket down (never closing the descriptor, which
    libpq still owns) wakes the waiting call with a connection error at once; the client reconnects
    on its next call. Arming and firing share one lock, so a call that was disarmed is never cut.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}
        self._fired: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None
        #: The monotonic time the thread sleeps until (None: until notified, or not started).
        self._sleeps_until: float | None = None

    def arm(self, fd: int, timeout_s: float) -> int:
        with self._cond:
            self._next += 1
            token = self._next
            deadline = time.monotonic() + max(0.0, timeout_s)
            self._armed[token] = (deadline, fd)
            if self._thread is None or not self._thread.is_alive():
                self._sleeps_until = None
                self._thread = threading.Thread(target=self._loop, name="ql-call-deadlines", daemon=True)
                self._thread.start()
            elif self._sleeps_until is None or deadline < self._sleeps_until:
                self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Forget ``token``; True when its deadline fired (the call was cut)."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _loop(self) -> None:
        import socket

        with self._cond:
            while True:
                now = time.monotonic()
                due = [t for t, (deadline, _fd) in self._armed.items() if deadline <= now]
                for token in due:
                    _deadline, fd = self._armed.pop(token)
                    self._fired.add(token)
                    try:
                        dup = os.dup(fd)
                    except OSError:
                        continue
                    try:
                        sock = socket.socket(fileno=dup)  # owns the duplicate, closes it once
                    except OSError:
                        os.close(dup)
                        continue
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    finally:
                        sock.close()
                wait = min((d for d, _fd in self._armed.values()), default=None)
                self._sleeps_until = wait
                self._cond.wait(None if wait is None else max(0.0, wait - time.monotonic()))


#: The process's one deadline thread (every ControlDB call arms it).
CALL_DEADLINES = CallDeadlines()
