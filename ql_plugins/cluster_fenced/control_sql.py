"""The control database's function calls, prebuilt: one statement per call of :class:`.control_db.ControlDB`.

Each is a ``SELECT`` of one fenced PL/pgSQL function (the revisions under ``migrations/versions``
define them). Array parameters travel in binary (``%b``): psycopg dumps a list in text format element
by element through Python, quoting each one (~20 us per array of 32 ids, and the server parses the
text back); binary skips both. Scalars stay ``%s``.
"""

from __future__ import annotations

__all__ = ["SUBMIT", "CANCEL", "REGISTER", "HEARTBEAT", "DEREGISTER", "DRAIN", "CLAIM", "START", "RUNNING",
           "RENEW", "COMPLETE", "END", "START_MANY", "RUNNING_MANY", "RENEW_MANY", "COMPLETE_MANY",
           "COMPLETE_AND_EMPTY_LOGS", "SWEEP", "MAP_OUTCOME", "FENCE_ARRAYS", "LEASE_COLUMNS"]

SUBMIT = "SELECT answer, created_at_ms, db_now_ms FROM ql_submit(%s, %s, %s, %b::bytea[], %s, %s)"
CANCEL = "SELECT answer, status, db_now_ms FROM ql_request_cancel(%s, %s)"
REGISTER = "SELECT generation, lease_expires_at_ms, db_now_ms FROM ql_register(%s, %s, %s, %s, %s)"
HEARTBEAT = "SELECT answer, lease_expires_at_ms, db_now_ms FROM ql_heartbeat(%s, %s, %s, %s)"
DEREGISTER = "SELECT answer, db_now_ms FROM ql_deregister(%s, %s, %s)"
DRAIN = "SELECT answer, db_now_ms FROM ql_drain(%s, %s, %s)"
CLAIM = ("SELECT answer, run_id, attempt_id, attempt_no, lease_generation, lease_token, spec_key_id,"
         " spec_ordinal, sealed_spec, timeout_ms, lease_expires_at_ms, db_now_ms"
         " FROM ql_claim(%s, %s, %s, %s, %s, %s, %b::text[], %b::text[], %s)")
LEASE_COLUMNS = ("answer, reason, lease_expires_at_ms, db_now_ms, cancel_reason, cancel_requested_at_ms,"
                 " deadline_at_ms")
START = f"SELECT {LEASE_COLUMNS} FROM ql_start(%s, %s, %s, %s, %s, %s)"
RUNNING = f"SELECT {LEASE_COLUMNS} FROM ql_running(%s, %s, %s, %s, %s, %s, %s)"
RENEW = f"SELECT {LEASE_COLUMNS} FROM ql_renew(%s, %s, %s, %s, %s, %s, %s)"
COMPLETE = ("SELECT answer, status, reason, fence_reason, db_now_ms"
            " FROM ql_complete(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
END = ("SELECT answer, outcome, fence_reason, db_now_ms"
       " FROM ql_end_without_completion(%s, %s, %s, %s, %s, %s, %s, %s, %s)")
# The batched functions of revision 0011 (one statement per batch; each call inside is the single
# function above). Arrays: element i is call i; rows come back with ord = i (1-based).
FENCE_ARRAYS = "%b::text[], %b::bigint[], %b::text[], %b::text[], %b::bigint[], %b::text[]"
START_MANY = f"SELECT ord, {LEASE_COLUMNS} FROM ql_start_many({FENCE_ARRAYS})"
RUNNING_MANY = f"SELECT ord, {LEASE_COLUMNS} FROM ql_running_many({FENCE_ARRAYS}, %b::bigint[])"
RENEW_MANY = f"SELECT ord, {LEASE_COLUMNS} FROM ql_renew_many({FENCE_ARRAYS}, %s::bigint)"
COMPLETE_MANY = ("SELECT ord, answer, status, reason, fence_reason, db_now_ms FROM ql_complete_many("
                 f"{FENCE_ARRAYS}, %b::integer[], %b::bigint[], %b::bigint[], %b::boolean[], %b::text[])")
#: Revision 0016: the empty, final logs of completed attempts as finalized 0-byte artifacts.
#: ONE statement (one transaction, one round trip, one prepared plan): the completions' rows (kind 0),
#: then the empty logs' (kind 1: ord, answer, -, -, fence_reason, -). UNION ALL runs both in full.
COMPLETE_AND_EMPTY_LOGS = (
    "SELECT 0 AS kind, ord, answer, status, reason, fence_reason, db_now_ms FROM ql_complete_many("
    f"{FENCE_ARRAYS}, %b::integer[], %b::bigint[], %b::bigint[], %b::boolean[], %b::text[])"
    " UNION ALL SELECT 1, ord, answer, NULL, NULL, fence_reason, NULL"
    f" FROM ql_artifact_empty_many({FENCE_ARRAYS}, %s::bigint)")
SWEEP = ("SELECT requeued, lost, retried, timeouts, leases_deleted, specs_deleted, skipped, db_now_ms"
         " FROM ql_sweep(%s, %s)")
MAP_OUTCOME = "SELECT status, reason, moot FROM ql_map_outcome(%s, %s, %s, %s, %s, %s)"
