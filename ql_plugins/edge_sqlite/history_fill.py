"""Build a large run history fast, for tests and ``bench/bench_history.py`` (edge-sqlite only).

Writes through the store's own prebuilt statements (:mod:`ql_plugins.edge_sqlite.statements`):
the rows a create commit writes (run, attempt, log artifact, ``run.created``) and the rows the
terminal commit leaves (states ``succeeded``, exit code 0, finish time, the ``attempt.succeeded`` /
``run.succeeded`` events, the log's recorded size), with ``executemany`` in one transaction per
batch instead of three commits per task. No receipt-journal row is written: a consumed receipt's
row is gone. The ql_tally triggers run as for any write.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fill_history"]


def fill_history(store: Any, n: int, *, owner: str, start_ms: int, step_ms: int = 1, batch: int = 20_000,
                 log_bytes: int = 0, executor: str = "local") -> list[str]:
    """Append ``n`` succeeded runs created at ``start_ms``, ``start_ms + step_ms``, ...; their ids."""
    from ql_core.ids import new_id
    from ql_core.paths import log_relative_path
    from . import statements as sql

    run_ids: list[str] = []
    made = 0
    while made < n:
        count = min(batch, n - made)
        runs, attempts, logs, events, ended_runs, ended_attempts, sizes = [], [], [], [], [], [], []
        for i in range(made, made + count):
            at = start_ms + i * step_ms
            run_id, attempt_id, log_id = new_id(at), new_id(at), new_id(at)
            run_ids.append(run_id)
            runs.append((run_id, None, "succeeded", 4, attempt_id, at, at, None))
            attempts.append((attempt_id, run_id, executor, owner, "succeeded", log_id, "0" * 64, None, at, at,
                             None, None))
            logs.append((log_id, run_id, attempt_id, log_relative_path(log_id), 1 << 20, at))
            events += [(run_id, 1, "run.created", attempt_id, None, None, None, at),
                       (run_id, 2, "attempt.spawned", attempt_id, "running", None, None, at),
                       (run_id, 3, "attempt.succeeded", attempt_id, "succeeded", 0, None, at + 1),
                       (run_id, 4, "run.succeeded", attempt_id, "succeeded", 0, None, at + 1)]
            ended_runs.append((at + 1, run_id))
            ended_attempts.append((at + 1, attempt_id))
            sizes.append((log_bytes, log_id))
        with store.connections.write() as c:
            c.executemany(sql.INSERT_RUN, runs)
            c.executemany(sql.INSERT_ATTEMPT, attempts)
            c.executemany(sql.INSERT_LOG, logs)
            c.executemany(sql.INSERT_EVENT, events)
            c.executemany("UPDATE ql_run SET exit_code = 0, finished_at_ms = ? WHERE id = ?", ended_runs)
            c.executemany("UPDATE ql_run_attempt SET exit_code = 0, finished_at_ms = ? WHERE id = ?", ended_attempts)
            c.executemany(sql.SET_LOG_SIZE, sizes)
        made += count
    return run_ids
