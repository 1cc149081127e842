"""The invariant checker that runs after every cluster test really catches what it claims to."""

from __future__ import annotations

import pytest

from tests.cluster.support import Cluster, check_invariants

pytestmark = pytest.mark.postgres


def test_checker_catches_a_second_terminal_event_and_an_old_generation_completion(cluster: Cluster) -> None:
    (run_id,) = cluster.submit()
    w = cluster.worker()
    claimed, fence = cluster.running_attempt(w)
    cluster.complete(fence, 0)
    check_invariants(cluster.dsn)

    cluster.sql.execute("INSERT INTO ql_run_event (run_id, seq, type, status, at_ms) SELECT id, event_seq + 1,"
                        " 'run.lost', 'lost', 0 FROM ql_run WHERE id = %s", (run_id,))
    cluster.sql.execute("UPDATE ql_run SET event_seq = event_seq + 1 WHERE id = %s", (run_id,))
    with pytest.raises(AssertionError, match="more than one run.<terminal> event"):
        check_invariants(cluster.dsn)
    cluster.sql.execute("DELETE FROM ql_run_event WHERE run_id = %s AND type = 'run.lost'", (run_id,))
    cluster.sql.execute("UPDATE ql_run SET event_seq = event_seq - 1 WHERE id = %s", (run_id,))
    check_invariants(cluster.dsn)

    # As if the worker id had been registered again before this completion was accepted.
    cluster.sql.execute("UPDATE ql_worker SET generation = generation + 1, registered_at_ms = 0")
    with pytest.raises(AssertionError, match="old worker generation"):
        check_invariants(cluster.dsn)
    cluster.sql.execute("UPDATE ql_worker SET generation = generation - 1")

    cluster.sql.execute("UPDATE ql_run SET exit_code = 1 WHERE id = %s", (run_id,))
    with pytest.raises(AssertionError, match="false success"):
        check_invariants(cluster.dsn)
    cluster.sql.execute("UPDATE ql_run SET exit_code = 0 WHERE id = %s", (run_id,))
