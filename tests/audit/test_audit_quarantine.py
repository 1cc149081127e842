"""``--quarantine``: only eligible regular files move, by hard link + unlink; nothing is ever deleted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.audit.audit_support import DataDir, id_in_shard, regular_inodes, run_ql, snapshot

from ql_core.audit import Action, audit_receipts
from ql_core.audit.move import move
from ql_core.audit.scan import Found


def populate(d: DataDir) -> dict[str, list[str]]:
    """A mixed shard a7 plus an eligible file in b0; returns names by expected fate."""
    journaled = d.attempt("succeeded", journal="pending")
    running = d.attempt("running")
    blocked = d.attempt("blocked")
    terminal = d.attempt("failed")
    young = d.attempt("cancelled")
    temp_orphan = id_in_shard("a7")
    names = {
        "moved": [f"{terminal}.json", f"{id_in_shard('a7')}.json", f".{temp_orphan}.r1.tmp", "junk.bin"],
        "kept": [f"{journaled}.json", f"{running}.json", f"{blocked}.json", f".{running}.r2.tmp",
                 f"{young}.json"],
        "unsafe": ["link", "dir", "fifo"],
    }
    for name in names["moved"] + names["kept"]:
        d.put("a7", name, age_s=10 if name.startswith(young) else 7200)
    os.symlink("junk.bin", d.receipts / "a7" / "link")
    (d.receipts / "a7" / "dir").mkdir()
    os.mkfifo(d.receipts / "a7" / "fifo")
    for name in ("link", "dir", "fifo"):
        when = os.lstat(d.receipts / "a7" / "junk.bin").st_mtime
        os.utime(d.receipts / "a7" / name, (when, when), follow_symlinks=False)
    d.put("b0", "old-notes.txt")
    return names


def test_quarantine_moves_only_eligible_files(audit_dir: DataDir) -> None:
    d = audit_dir
    names = populate(d)
    before = snapshot(d.path)
    inodes = regular_inodes(d.path)
    original_stats = {n: os.lstat(d.receipts / "a7" / n) for n in names["moved"]}

    result = run_ql(d.path, "--shard", "a7", "--shards", "32", "--quarantine")
    assert result.returncode == 0, result.stderr
    doc = result.json()
    assert doc["mode"] == "quarantine"
    assert doc["moved"] == 5
    actions = {e["ref"]: e["action"] for e in doc["entries"]}
    assert {r for r, a in actions.items() if a == "quarantined"} == (
        {f"a7/{n}" for n in names["moved"]} | {"b0/old-notes.txt"})
    assert all(actions[f"a7/{n}"] == "keep" for n in names["kept"] + names["unsafe"])

    after = snapshot(d.path)
    # Exactly the eligible files left their shard, and each is in the orphan quarantine as the same inode.
    gone = set(before) - set(after)
    assert gone == {f"receipts/a7/{n}" for n in names["moved"]} | {"receipts/b0/old-notes.txt"}
    for name in names["moved"]:
        moved = os.lstat(d.orphans / "a7" / name)
        assert (moved.st_ino, moved.st_size, moved.st_mtime_ns) == (
            original_stats[name].st_ino, original_stats[name].st_size, original_stats[name].st_mtime_ns)
    assert (d.orphans / "b0" / "old-notes.txt").is_file()
    # Everything else is byte-for-byte as it was.
    for path in set(before) & set(after):
        if path in ("receipts", "receipts/a7", "receipts/b0"):
            continue  # directory mtimes change with their entries
        assert before[path] == after[path], path
    new = set(after) - set(before)
    assert new == ({"receipts/.orphan-quarantine", "receipts/.orphan-quarantine/a7",
                    "receipts/.orphan-quarantine/b0"}
                   | {f"receipts/.orphan-quarantine/a7/{n}" for n in names["moved"]}
                   | {"receipts/.orphan-quarantine/b0/old-notes.txt"})
    # Private directories, created only where something moved.
    for directory in (d.orphans, d.orphans / "a7", d.orphans / "b0"):
        st = os.lstat(directory)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert not (d.orphans / "a8").exists()
    # Nothing was deleted: every original inode is still reachable.
    assert inodes <= regular_inodes(d.path)


def test_quarantine_is_idempotent_and_never_overwrites(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("10", "dup")
    d.put("10", "single")
    (d.orphans / "10").mkdir(mode=0o700, parents=True)
    d.orphans.chmod(0o700)
    (d.orphans / "10" / "dup").write_bytes(b"an earlier quarantined file with the same name")
    earlier = snapshot(d.orphans)
    inodes = regular_inodes(d.path)

    report = audit_receipts(d.path, d.url, shard="10", shards=1, quarantine=True)
    actions = {e.ref: e.action for e in report.entries}
    assert actions == {"10/dup": Action.SKIPPED_TARGET_EXISTS, "10/single": Action.QUARANTINED}
    assert (d.receipts / "10" / "dup").exists()  # the original stays where it was
    assert (d.orphans / "10" / "dup").read_bytes() == b"an earlier quarantined file with the same name"
    assert snapshot(d.orphans)["10/dup"] == earlier["10/dup"]
    assert inodes <= regular_inodes(d.path)

    again = audit_receipts(d.path, d.url, shard="10", shards=1, quarantine=True)
    assert {e.ref: e.action for e in again.entries} == {"10/dup": Action.SKIPPED_TARGET_EXISTS}
    assert again.moved == 0


def test_quarantine_with_nothing_eligible_creates_nothing(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("20", "fresh", age_s=5)
    attempt_id = d.attempt("running", shard="20")
    d.put("20", f"{attempt_id}.json")
    before = snapshot(d.path)
    result = run_ql(d.path, "--shard", "20", "--shards", "1", "--quarantine")
    assert result.returncode == 0, result.stderr
    assert result.json()["moved"] == 0
    assert snapshot(d.path) == before
    assert not d.orphans.exists()


def test_min_age_protects_young_files(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("30", "young", age_s=60)
    d.put("30", "medium", age_s=1000)
    d.put("30", "old", age_s=4000)
    doc = run_ql(d.path, "--shard", "30", "--shards", "1", "--quarantine").json()
    assert {e["ref"]: (e["class"], e["action"]) for e in doc["entries"]} == {
        "30/young": ("too_young", "keep"),
        "30/medium": ("too_young", "keep"),
        "30/old": ("unknown_file", "quarantined"),
    }
    doc = run_ql(d.path, "--shard", "30", "--shards", "1", "--min-age", "900", "--quarantine").json()
    assert {e["ref"]: (e["class"], e["action"]) for e in doc["entries"]} == {
        "30/young": ("too_young", "keep"),
        "30/medium": ("unknown_file", "quarantined"),
    }
    assert (d.receipts / "30" / "young").exists()
    assert sorted(os.listdir(d.orphans / "30")) == ["medium", "old"]


def test_future_mtime_is_too_young(audit_dir: DataDir) -> None:
    d = audit_dir
    path = d.put("31", "from-the-future")
    os.utime(path, (2**33, 2**33))
    report = audit_receipts(d.path, d.url, shard="31", shards=1, quarantine=True)
    assert [(e.entry_class, e.action) for e in report.entries] == [("too_young", "keep")]
    assert path.exists()


def test_active_and_journaled_receipts_never_move_whatever_their_age(audit_dir: DataDir) -> None:
    d = audit_dir
    ids = [d.attempt("running", shard="40"), d.attempt("starting", shard="40"),
           d.attempt("succeeded", journal="pending", shard="40"),
           d.attempt("lost", journal="quarantined", shard="40")]
    for attempt_id in ids:
        d.put("40", f"{attempt_id}.json", age_s=365 * 24 * 3600)
    report = audit_receipts(d.path, d.url, shard="40", shards=1, quarantine=True)
    assert report.moved == 0
    assert all(e.action == "keep" for e in report.entries)
    assert sorted(os.listdir(d.receipts / "40")) == sorted(f"{i}.json" for i in ids)
    assert not d.orphans.exists()


def test_overflow_moves_nothing_in_that_shard(audit_dir: DataDir) -> None:
    d = audit_dir
    for i in range(4):
        d.put("50", f"junk-{i}")
    for i in range(3):
        d.put("51", f"junk-{i}")
    before = snapshot(d.receipts / "50")
    doc = run_ql(d.path, "--shard", "50", "--shards", "2", "--limit", "3", "--quarantine").json()
    assert doc["shards"] == [{"shard": "50", "state": "overflow", "entries": 3},
                             {"shard": "51", "state": "ok", "entries": 3}]
    by_shard = {}
    for entry in doc["entries"]:
        by_shard.setdefault(entry["ref"][:2], set()).add(entry["action"])
    assert by_shard == {"50": {"skipped_overflow"}, "51": {"quarantined"}}
    assert snapshot(d.receipts / "50") == before
    assert len(os.listdir(d.receipts / "50")) == 4
    assert not (d.orphans / "50").exists()
    assert sorted(os.listdir(d.orphans / "51")) == ["junk-0", "junk-1", "junk-2"]


def test_overflow_in_report_mode(audit_dir: DataDir) -> None:
    d = audit_dir
    for i in range(65):
        d.put("52", f"junk-{i:02d}")
    doc = run_ql(d.path, "--shard", "52", "--shards", "1", "--limit", "64").json()
    assert doc["shards"] == [{"shard": "52", "state": "overflow", "entries": 64}]
    assert len(doc["entries"]) == 64


def _found(path: Path) -> Found:
    return Found(path.name, os.lstat(path), None, "other")


def _dir_fd(path: Path) -> int:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def test_move_refuses_a_file_replaced_after_classification(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src_fd, dst_fd = _dir_fd(src), _dir_fd(dst)
    try:
        (src / "f").write_bytes(b"old")
        stale = _found(src / "f")
        keep = tmp_path / "keep-old-inode"
        os.link(src / "f", keep)  # keep the old inode alive so a new file cannot reuse its number
        (src / "f").unlink()
        (src / "f").write_bytes(b"new, published since")
        assert move(src_fd, dst_fd, stale) is Action.SKIPPED_CHANGED
        assert (src / "f").read_bytes() == b"new, published since"
        assert not (dst / "f").exists()  # our extra link was withdrawn; the file stayed in place
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def test_move_refuses_a_file_written_after_classification(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src_fd, dst_fd = _dir_fd(src), _dir_fd(dst)
    try:
        (src / "f").write_bytes(b"partial")
        os.utime(src / "f", (1000, 1000))
        stale = _found(src / "f")
        with open(src / "f", "ab") as fh:
            fh.write(b" and more")
        assert move(src_fd, dst_fd, stale) is Action.SKIPPED_CHANGED
        assert (src / "f").read_bytes() == b"partial and more"
        assert not (dst / "f").exists()
        # a vanished file is skipped as well
        fresh = _found(src / "f")
        (src / "f").unlink()
        assert move(src_fd, dst_fd, fresh) is Action.SKIPPED_CHANGED
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def test_a_move_interrupted_between_link_and_unlink_is_finished(audit_dir: DataDir) -> None:
    """A crash after the link left two names for one file; the next run completes the move."""
    d = audit_dir
    original = d.put("60", "half-moved")
    (d.orphans / "60").mkdir(mode=0o700, parents=True)
    d.orphans.chmod(0o700)
    os.link(original, d.orphans / "60" / "half-moved")
    inode = os.lstat(original).st_ino
    report = audit_receipts(d.path, d.url, shard="60", shards=1, quarantine=True)
    assert [(e.ref, e.action) for e in report.entries] == [("60/half-moved", Action.QUARANTINED)]
    assert not original.exists()
    moved = os.lstat(d.orphans / "60" / "half-moved")
    assert (moved.st_ino, moved.st_nlink) == (inode, 1)
