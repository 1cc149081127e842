"""`ql run --detach --many FILE` on the control node: a cron burst queued a transaction per batch,
the ids printed in the file's order as each batch commits, and a batch the database refuses leaves
exactly the lines before it submitted — the error names the first line that was not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ql_core.cli.run_many import BATCH
from tests.cluster.worker_support import Harness, wait_for

pytestmark = pytest.mark.postgres


def _file(path: Path, tasks: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def test_a_burst_is_queued_in_batches_in_order_and_a_worker_runs_every_line(harness: Harness) -> None:
    n = BATCH + 44  # two transactions
    secret = "s3cr3t-of-a-burst-line"
    tasks: list[dict[str, object]] = [{"command": ["sh", "-c", f"exit {i % 3}"], "name": f"burst-{i}"}
                                      for i in range(n)]
    tasks[7] = {"command": ["sh", "-c", 'test "$QL_T_LINE" = s3cr3t-of-a-burst-line'], "name": "burst-7",
                "env": {"QL_T_LINE": secret}, "retries": 1, "timeout": 120}
    out = harness.ql("--json", "run", "--detach", "--many", str(_file(harness.root / "burst.jsonl", tasks)))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["line"] for line in lines] == list(range(1, n + 1))
    assert {(line["status"], line["attempt_id"]) for line in lines} == {("queued", None)}
    rows = harness.sql.execute("SELECT id, name, status, max_attempts FROM ql_run").fetchall()
    by_id = {r["id"]: r for r in rows}
    assert len(rows) == n and [by_id[line["run_id"]]["name"] for line in lines] == [f"burst-{i}" for i in range(n)]
    assert by_id[lines[7]["run_id"]]["max_attempts"] == 2
    harness.start_worker("a", slots=4)
    ends = [harness.wait_status(line["run_id"]) for line in lines]
    expected = [(0 if i == 7 else i % 3) for i in range(n)]
    assert [e["exit_code"] for e in ends] == expected, harness.logs()
    texts = [out.stdout, out.stderr, json.dumps(harness.events(lines[7]["run_id"]), default=str)]
    assert not any(secret in t for t in texts + [p.log.read_text() for p in harness.procs])
    wait_for(lambda: {r["state"] for r in harness.lease_rows("a")} == {"answered"},
             what="every outbox row to get its final answer", diagnose=harness.logs)


def test_a_refused_batch_leaves_the_lines_before_it_submitted_and_says_where_to_resume(harness: Harness) -> None:
    # A real refusal by the database: a trigger rejects the run named "poison" (the second batch's third line).
    harness.sql.execute("""
        CREATE FUNCTION bench_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.name = 'poison' THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER bench_poison BEFORE INSERT ON ql_run FOR EACH ROW EXECUTE FUNCTION bench_poison();""")
    n = 2 * BATCH + 10
    tasks: list[dict[str, object]] = [{"command": ["true"], "name": f"r-{i}"} for i in range(n)]
    tasks[BATCH + 2]["name"] = "poison"
    out = harness.ql("run", "--detach", "--many", str(_file(harness.root / "burst.jsonl", tasks)))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    printed = out.stdout.split()
    assert len(printed) == BATCH  # the first batch committed and was printed; nothing after it
    assert f"line {BATCH + 1} and the {n - BATCH - 1} after it were not" in out.stderr, out.stderr
    names = {r["id"]: r["name"] for r in harness.sql.execute("SELECT id, name FROM ql_run").fetchall()}
    assert set(names) == set(printed) and sorted(names.values()) == sorted(f"r-{i}" for i in range(BATCH))
    harness.sql.execute("DROP TRIGGER bench_poison ON ql_run")
    # Resubmitting exactly the rest queues each remaining line once.
    rest = _file(harness.root / "rest.jsonl", tasks[BATCH:])
    again = harness.ql("run", "--detach", "--many", str(rest))
    assert again.returncode == 0 and len(again.stdout.split()) == n - BATCH, again.stderr
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_run").fetchone()["n"] == n
