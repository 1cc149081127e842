"""The outcome table (DESIGN.md §2) as plain data: core's Python and the database's
``ql_map_outcome`` must both give every row's expected answer.

Inputs: the run's committed cancel intent (``cancel_reason``, ``cancel_requested_at_ms``), its
``deadline_at_ms``, whether ql signalled this attempt for the intent (``signalled``), the claim's
``exit_code`` and (already clamped) ``finished_at_ms``. Times are relative milliseconds (only
their order matters). Expected: terminal ``status``, its ``reason``, and ``moot`` — whether a
committed cancel intent is recorded moot (event ``run.cancel_moot`` before the terminal events).

The rule. natural = succeeded if exit 0 else failed. Intents: a user/policy/shutdown cancel →
(cancel_requested_at_ms, cancelled, reason); the deadline, whenever set → (deadline_at_ms,
timed_out, timeout), committed or not; a timeout cancel without deadline → (cancel_requested_at_ms,
timed_out, timeout); an intent whose time is unknown (None) always applies. 1) signalled and a
cancel intent committed → that intent, never moot. 2) Else the intents with finished_at_ms >= their
time apply; the earliest wins, a tie goes to the committed cancel intent. 3) None applies →
natural, and a committed cancel intent is moot.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OUTCOME_CASES", "INPUT_KEYS", "EXPECTED_KEYS"]

INPUT_KEYS = ("cancel_reason", "cancel_requested_at_ms", "deadline_at_ms", "signalled", "exit_code",
              "finished_at_ms")
EXPECTED_KEYS = ("status", "reason", "moot")


def _case(id: str, cancel_reason: str | None, cancel_requested_at_ms: int | None, deadline_at_ms: int | None,
          signalled: bool, exit_code: int, finished_at_ms: int, status: str, reason: str | None,
          moot: bool) -> dict[str, Any]:
    return {"id": id, "cancel_reason": cancel_reason, "cancel_requested_at_ms": cancel_requested_at_ms,
            "deadline_at_ms": deadline_at_ms, "signalled": signalled, "exit_code": exit_code,
            "finished_at_ms": finished_at_ms, "status": status, "reason": reason, "moot": moot}


OUTCOME_CASES: list[dict[str, Any]] = [
    # id                                 cancel      at    deadline sig   exit fin    status       reason      moot
    _case("natural-success",             None,       None, None,  False, 0,   1000, "succeeded", None,       False),
    _case("natural-failure",             None,       None, None,  False, 3,   1000, "failed",    None,       False),
    _case("killed-by-signal-no-intent",  None,       None, None,  False, -15, 1000, "failed",    None,       False),
    _case("deadline-not-reached",        None,       None, 1000,  False, 0,   999,  "succeeded", None,       False),
    _case("deadline-not-reached-fail",   None,       None, 1000,  False, 1,   999,  "failed",    None,       False),
    _case("deadline-reached-exactly",    None,       None, 1000,  False, 0,   1000, "timed_out", "timeout",  False),
    _case("deadline-passed-uncommitted", None,       None, 1000,  False, 0,   1500, "timed_out", "timeout",  False),
    _case("timeout-intent-after-deadline", "timeout", 1100, 1000, False, 0,   1050, "timed_out", "timeout",  False),
    _case("timeout-intent-finished-first", "timeout", 1100, 1000, False, 0,   900,  "succeeded", None,       True),
    _case("timeout-intent-no-deadline-first", "timeout", 1000, None, False, 2, 999, "failed",    None,       True),
    _case("timeout-intent-no-deadline-at", "timeout", 1000, None, False, 0,   1000, "timed_out", "timeout",  False),
    _case("user-cancel-after",           "user",     1000, None,  False, 0,   1500, "cancelled", "user",     False),
    _case("user-cancel-finished-first",  "user",     1000, None,  False, 0,   500,  "succeeded", None,       True),
    _case("user-cancel-failed-first",    "user",     1000, None,  False, 1,   500,  "failed",    None,       True),
    _case("user-cancel-signalled",       "user",     1000, None,  True,  0,   500,  "cancelled", "user",     False),
    _case("policy-cancel-deadline-first", "policy",  1000, 800,   False, 0,   900,  "timed_out", "timeout",  False),
    _case("policy-cancel-both-deadline-earliest", "policy", 1000, 800, False, 0, 1200, "timed_out", "timeout", False),
    _case("shutdown-earliest",           "shutdown", 800,  1000,  False, 0,   1200, "cancelled", "shutdown", False),
    _case("shutdown-finished-first",     "shutdown", 1000, None,  False, 0,   999,  "succeeded", None,       True),
    _case("tie-goes-to-committed-cancel", "user",    1000, 1000,  False, 0,   1000, "cancelled", "user",     False),
    _case("signalled-cancel-beats-earlier-deadline", "user", 1000, 500, True, 0, 1200, "cancelled", "user",  False),
    _case("signalled-without-intent",    None,       None, 1000,  True,  0,   900,  "succeeded", None,       False),
    _case("signalled-without-intent-late", None,     None, 1000,  True,  143, 1100, "timed_out", "timeout",  False),
    _case("signalled-timeout-intent",    "timeout",  1100, 1000,  True,  0,   900,  "timed_out", "timeout",  False),
    _case("cancel-time-unknown-applies", "user",     None, None,  False, 0,   1000, "cancelled", "user",     False),
]
