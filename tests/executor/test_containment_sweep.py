"""The containment sweep is bounded and still reaches every leftover: real directories (a non-empty
one refuses ``rmdir`` as a cgroup with processes does)."""

from __future__ import annotations

import uuid
from pathlib import Path

from ql_executors.local_process.containment import sweep


def _cgroups(parent: Path, busy: int, empty: int) -> tuple[list[Path], list[Path]]:
    made = [], []
    for kind, count in enumerate((busy, empty)):
        for _ in range(count):
            d = parent / str(uuid.uuid4())
            d.mkdir()
            if kind == 0:
                (d / "cgroup.procs").write_text("123\n")  # "a process in it": rmdir fails
            made[kind].append(d)
    return made


def test_a_sweep_tries_at_most_its_limit_and_spares_busy_and_foreign_entries(tmp_path: Path) -> None:
    busy, empty = _cgroups(tmp_path, busy=3, empty=5)
    (tmp_path / "not-an-attempt").mkdir()
    assert sweep(str(tmp_path), limit=100) == 5
    assert all(d.exists() for d in busy) and not any(d.exists() for d in empty)
    assert (tmp_path / "not-an-attempt").exists()


def test_leftovers_behind_more_busy_cgroups_than_the_limit_are_reached(tmp_path: Path) -> None:
    # More running tasks than one sweep tries: a fixed window would try the same busy ones forever.
    busy, empty = _cgroups(tmp_path, busy=12, empty=2)
    removed = [sweep(str(tmp_path), limit=3) for _ in range(200)]
    assert max(removed) <= 3
    assert not any(d.exists() for d in empty), "a leftover was never reached"
    assert all(d.exists() for d in busy)


def test_a_sweep_reads_at_most_scan_entries(tmp_path: Path) -> None:
    _, empty = _cgroups(tmp_path, busy=0, empty=6)
    assert sweep(str(tmp_path), limit=10, scan=4) == 4
    assert sum(d.exists() for d in empty) == 2
