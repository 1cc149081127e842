"""Real processes racing to publish one attempt's receipt while another process keeps reading it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ql_core.ids import new_id, shard_of
from ql_core.receipts import FileReceiptStore, PublishOutcome, ReadStatus

PUBLISHERS = 8
ROUNDS = 3

PUBLISHER = textwrap.dedent(
    """
    import os, sys, time
    from ql_core.receipts import FileReceiptStore, Receipt
    root, ready, go, run_id, token, *attempt_ids = sys.argv[1:]
    store = FileReceiptStore(root)
    receipts = [Receipt(1, run_id, a, 1, token, 10, 20, 7) for a in attempt_ids]
    open(ready, "x").close()
    while not os.path.exists(go):
        time.sleep(0.0002)
    print(" ".join(store.publish(r).value for r in receipts))
    """
)

READER = textwrap.dedent(
    """
    import json, os, sys
    from ql_core.receipts import FileReceiptStore
    root, ready, stop, attempt_id = sys.argv[1:]
    store = FileReceiptStore(root)
    counts = {"missing": 0, "valid": 0, "invalid": 0}
    tokens, reasons = set(), set()
    open(ready, "x").close()
    while True:
        stopping = os.path.exists(stop)
        result = store.read(attempt_id)
        counts[result.status.value] += 1
        if result.receipt is not None:
            tokens.add(result.receipt.token)
        if result.rejection is not None:
            reasons.add(result.rejection.reason.value)
        if stopping:
            break
    print(json.dumps({"counts": counts, "tokens": sorted(tokens), "reasons": sorted(reasons)}))
    """
)


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_files(paths: list[Path], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, "child processes did not get ready"
        time.sleep(0.01)


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out


def race_one_round(root: Path, work: Path) -> None:
    store = FileReceiptStore(root)
    attempt_id, run_id = new_id(), new_id()
    tokens = [f"token{i}_" + os.urandom(16).hex() for i in range(PUBLISHERS)]
    go, stop = work / "go", work / "stop"
    readies = [work / f"ready{i}" for i in range(PUBLISHERS + 1)]

    reader = spawn(READER, str(root), str(readies[-1]), str(stop), attempt_id)
    publishers = [
        spawn(PUBLISHER, str(root), str(readies[i]), str(go), run_id, tokens[i], attempt_id)
        for i in range(PUBLISHERS)
    ]
    wait_for_files(readies)
    go.touch()
    outcomes = [finish(p).strip() for p in publishers]
    stop.touch()
    seen = json.loads(finish(reader))
    print(f"reader observations: {seen['counts']}")  # shown with -s: proof the race was watched

    assert sorted(outcomes) == ["already_exists"] * (PUBLISHERS - 1) + ["published"]
    winner = tokens[outcomes.index(PublishOutcome.PUBLISHED.value)]
    final = store.read(attempt_id)
    assert final.status is ReadStatus.VALID and final.receipt is not None
    assert final.receipt.token == winner
    assert seen["counts"]["invalid"] == 0, seen["reasons"]
    assert seen["counts"]["valid"] >= 1
    assert seen["tokens"] == [winner]  # the reader never saw a loser's (overwritten) receipt
    # No temp left; only this round's receipt of this attempt (an earlier round's attempt may
    # share the shard: 1 in 256).
    assert [n for n in os.listdir(root / shard_of(attempt_id)) if attempt_id in n] == [f"{attempt_id}.json"]


def test_racing_publishers_exactly_one_wins(tmp_path: Path) -> None:
    root = tmp_path / "receipts"
    for round_number in range(ROUNDS):
        work = tmp_path / f"round{round_number}"
        work.mkdir()
        race_one_round(root, work)


def test_racing_processes_share_new_shards(tmp_path: Path) -> None:
    """Every process creates the same fresh shard directories at once; all receipts land."""
    root = tmp_path / "receipts"
    # The last two hex digits are random bits, so forcing them keeps the ids valid UUIDv7s.
    attempt_ids = [new_id()[:-2] + ("ab", "cd")[i % 2] for i in range(PUBLISHERS * 4)]
    ids_by_process = [attempt_ids[i::PUBLISHERS] for i in range(PUBLISHERS)]
    go = tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(PUBLISHERS)]
    procs = [
        spawn(PUBLISHER, str(root), str(readies[i]), str(go), new_id(), "t" * 40, *ids)
        for i, ids in enumerate(ids_by_process)
    ]
    wait_for_files(readies)
    go.touch()
    for proc in procs:
        assert set(finish(proc).split()) == {"published"}
    store = FileReceiptStore(root)
    assert all(store.read(a).status is ReadStatus.VALID for a in attempt_ids)
    assert sorted(os.listdir(root)) == ["ab", "cd"]
    leftovers = [n for d in root.iterdir() for n in os.listdir(d) if not n.endswith(".json")]
    assert leftovers == []
