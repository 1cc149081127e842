"""Named crash points: a test seam that ends the process hard at one protocol step.

Set ``QL_CRASH_POINT=<name>`` in a process's environment when it starts (it is read once, at
import: set it in a child process's environment, not in a running one); when execution
reaches ``crashpoint(<name>)`` the process exits immediately with
``os._exit(CRASH_EXIT_CODE)`` — no ``finally`` blocks, no atexit, no flush,
exactly like a SIGKILL at that instant (a committed transaction stays
committed, an open one is rolled back by the database).

Only used where a real fault cannot be produced at the exact step; every
name is listed in :data:`CRASH_POINTS` so tests can iterate all of them.
"""

from __future__ import annotations

import os

__all__ = ["CRASH_POINTS", "CRASH_EXIT_CODE", "crashpoint"]

CRASH_EXIT_CODE = 86

#: Every crash point in the code base, in protocol order.
CRASH_POINTS: tuple[str, ...] = (
    "create.before_commit",          # persist-before-spawn transaction open
    "spawn.after_log_created",       # log file created; launcher not forked (standby: not handed its run)
    "spawn.before_handle_commit",    # launcher held (no token yet), durable handle not yet committed
    "start.after_hand_over",         # a standby launcher was handed its run (the go-ahead), nothing after
    "receipt.publish.after_temp",    # temp written, not linked (Python publisher)
    "receipt.publish.after_link",    # final receipt visible, temp not yet removed
    "wait.after_exit",               # waiting host reaped a held task's status, nothing committed
    "completion.before_commit",      # terminal transaction open, not committed
    "wait.before_ack",               # held task's status committed, publisher not acknowledged
    "wait.after_ack",                # acknowledged: the publisher will publish nothing
    "consumer.after_commit",         # terminal committed, receipt not deleted
    "consumer.after_delete",         # receipt deleted, journal row not resolved
    "consumer.quarantine.after_journal",  # journal says quarantined, file not moved
    "receipt.quarantine.after_link",  # quarantine link made, original not unlinked
    "cancel.after_intent",           # cancel intent committed, nothing dispatched
    "cancel.after_signal",           # TERM sent, dispatch outcome not committed
    # the cluster worker (ql_plugins.cluster_fenced.worker), in the order of one attempt's life
    "worker.claim.after_answer",     # leases claimed at the control plane, not recorded locally
    "worker.start.after_answer",     # lease claimed -> starting committed, `launching` not written
    "worker.launch.before_spawn",    # `launching` written and mirrored locally, nothing spawned
    "worker.running.before_call",    # spawned, handle committed locally, `running` not reported
    "worker.outbox.before_insert",   # ended locally (terminal committed), outbox row not written
    "worker.outbox.after_submit",    # completion committed at the control plane, answer not recorded
    # the worker's log shipper (ql_plugins.cluster_fenced.log_shipper)
    "ship.after_append",             # a chunk committed in the artifact store, the shipper not told
    "ship.after_finalize",           # the artifact finalized in the store, not recorded locally
)


#: The step this process is to die at ("": none; no step is named so), read once. A task passes ~7
#: crash points, and ``os.environ.get`` of a missing name raises and catches a KeyError in ``os`` each time.
_ARMED: str = os.environ.get("QL_CRASH_POINT") or ""


def crashpoint(name: str) -> None:
    """Exit the process at once if ``QL_CRASH_POINT`` (as the process started) names this step."""
    if name == _ARMED:
        os._exit(CRASH_EXIT_CODE)
