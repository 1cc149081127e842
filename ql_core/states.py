"""Run and attempt states (DESIGN.md §2) and the exit codes ``ql run`` maps them to."""

from __future__ import annotations

__all__ = [
    "RUN_ACTIVE",
    "RUN_TERMINAL",
    "ATTEMPT_ACTIVE",
    "ATTEMPT_FINAL",
    "RECOVERABLE_ATTEMPT",
    "CANCEL_REASONS",
    "EXIT_TIMED_OUT",
    "EXIT_CANCELLED",
    "EXIT_LOST",
    "exit_status_for",
]

RUN_ACTIVE = frozenset({"queued", "running"})
RUN_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
#: Attempts that a recovery round pages through.
ATTEMPT_ACTIVE = frozenset({"starting", "running"})
#: ``blocked`` means "identity cannot be verified": nothing proves an end, so a
#: valid receipt published later still completes the attempt.
RECOVERABLE_ATTEMPT = ATTEMPT_ACTIVE | {"blocked"}
ATTEMPT_FINAL = RUN_TERMINAL
CANCEL_REASONS = frozenset({"user", "policy", "shutdown", "timeout"})

EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 130
EXIT_LOST = 75


def exit_status_for(status: str, exit_code: int | None) -> int:
    """The exit status of ``ql run`` for a terminal run (DESIGN.md §7)."""
    if status in ("succeeded", "failed"):
        return exit_code if exit_code is not None else 1
    if status == "timed_out":
        return EXIT_TIMED_OUT
    if status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_LOST
