"""Classification of every kind of shard entry (ADR-0007 §2.9 point 3), report mode."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest
from tests.audit.audit_support import DataDir, id_in_shard, run_ql, set_age

from ql_core.audit import (
    DEFAULT_LIMIT,
    DEFAULT_MIN_AGE_S,
    DEFAULT_SHARDS,
    FINAL_ATTEMPT_STATUSES,
    MAX_LIMIT,
    MAX_SHARDS,
    MIN_AGE_FLOOR_S,
    Action,
    AuditOptionError,
    AuditReport,
    EntryClass,
    audit_receipts,
    shard_names,
)
from ql_core.errors import UsageError


def by_ref(report: AuditReport) -> dict[str, tuple[str, str]]:
    return {e.ref: (str(e.entry_class), str(e.action)) for e in report.entries}


def test_defaults_and_caps_are_the_adr_numbers() -> None:
    assert (DEFAULT_SHARDS, DEFAULT_LIMIT, MAX_SHARDS, MAX_LIMIT) == (8, 32, 32, 64)
    assert DEFAULT_MIN_AGE_S == 3600


def test_only_final_statuses_are_unprotected() -> None:
    from ql_core.states import ATTEMPT_ACTIVE, RECOVERABLE_ATTEMPT

    assert FINAL_ATTEMPT_STATUSES == {"succeeded", "failed", "cancelled", "timed_out", "lost"}
    assert not (ATTEMPT_ACTIVE | RECOVERABLE_ATTEMPT) & FINAL_ATTEMPT_STATUSES


def test_name_patterns_are_the_file_stores(audit_dir: DataDir) -> None:
    """The audit classifies by the very names FileReceiptStore publishes (its contract)."""
    from ql_core.receipts import names

    attempt_id = id_in_shard("a7")
    temp = names.temp_name(attempt_id)
    assert names.TEMP_NAME_PATTERN.fullmatch(temp)
    audit_dir.put("a7", temp)
    audit_dir.put("a7", f"{attempt_id}.json")
    report = audit_receipts(audit_dir.path, audit_dir.url, shard="a7", shards=1)
    assert by_ref(report) == {
        f"a7/{temp}": ("temp_file", "would_quarantine"),
        f"a7/{attempt_id}.json": ("terminal_or_unknown", "would_quarantine"),
    }


def test_every_class(audit_dir: DataDir) -> None:
    d = audit_dir
    journaled = d.attempt("succeeded", journal="pending")
    journaled_q = d.attempt("failed", journal="quarantined")
    journaled_active = d.attempt("running", journal="pending")
    running = d.attempt("running")
    starting = d.attempt("starting")
    blocked = d.attempt("blocked")  # a late valid receipt still completes it: protected
    future_status = d.attempt("paused")  # a status this version does not know: protected
    terminal = d.attempt("succeeded")
    lost = d.attempt("lost")
    unknown = id_in_shard("a7")  # not in the database at all
    young = d.attempt("failed")
    temp_of_running = d.attempt("running")
    temp_of_journaled = d.attempt("succeeded", journal="pending")
    temp_orphan = id_in_shard("a7")
    misplaced = id_in_shard("3c")  # receipt name in the wrong shard

    for attempt_id in (journaled, journaled_q, journaled_active, running, starting, blocked,
                       future_status, terminal, lost, unknown):
        d.put("a7", f"{attempt_id}.json")
    d.put("a7", f"{young}.json", age_s=10)
    d.put("a7", f".{temp_of_running}.12345rab.tmp")
    d.put("a7", f".{temp_of_journaled}.x.tmp")
    d.put("a7", f".{temp_orphan}.abcDEF123.tmp")
    d.put("a7", f"{misplaced}.json")
    d.put("a7", "notes.txt")
    d.put("a7", f"{terminal}.json.bak")
    os.symlink("/etc/passwd", d.receipts / "a7" / f"{unknown[:-1]}0.json")
    (d.receipts / "a7" / "subdir").mkdir()
    os.mkfifo(d.receipts / "a7" / "pipe")
    os.mknod(d.receipts / "a7" / "sock", stat.S_IFSOCK | 0o600)

    report = audit_receipts(d.path, d.url, shard="a7", shards=1)
    assert by_ref(report) == {
        f"a7/{journaled}.json": ("journal_registered", "keep"),
        f"a7/{journaled_q}.json": ("journal_registered", "keep"),
        f"a7/{journaled_active}.json": ("journal_registered", "keep"),
        f"a7/{running}.json": ("active_attempt", "keep"),
        f"a7/{starting}.json": ("active_attempt", "keep"),
        f"a7/{blocked}.json": ("active_attempt", "keep"),
        f"a7/{future_status}.json": ("active_attempt", "keep"),
        f"a7/{terminal}.json": ("terminal_or_unknown", "would_quarantine"),
        f"a7/{lost}.json": ("terminal_or_unknown", "would_quarantine"),
        f"a7/{unknown}.json": ("terminal_or_unknown", "would_quarantine"),
        f"a7/{young}.json": ("too_young", "keep"),
        f"a7/.{temp_of_running}.12345rab.tmp": ("active_attempt", "keep"),
        f"a7/.{temp_of_journaled}.x.tmp": ("journal_registered", "keep"),
        f"a7/.{temp_orphan}.abcDEF123.tmp": ("temp_file", "would_quarantine"),
        f"a7/{misplaced}.json": ("unknown_file", "would_quarantine"),
        "a7/notes.txt": ("unknown_file", "would_quarantine"),
        f"a7/{terminal}.json.bak": ("unknown_file", "would_quarantine"),
        f"a7/{unknown[:-1]}0.json": ("unsafe", "keep"),
        "a7/subdir": ("unsafe", "keep"),
        "a7/pipe": ("unsafe", "keep"),
        "a7/sock": ("unsafe", "keep"),
    }
    types = {e.ref: e.file_type for e in report.entries}
    assert types["a7/subdir"] == "directory"
    assert types["a7/pipe"] == "fifo"
    assert types["a7/sock"] == "socket"
    assert types[f"a7/{unknown[:-1]}0.json"] == "symlink"
    assert report.counts == {
        "journal_registered": 4, "active_attempt": 5, "terminal_or_unknown": 3, "temp_file": 1,
        "unknown_file": 3, "unsafe": 4, "too_young": 1,
    }
    assert report.moved == 0
    assert report.mode == "report"
    assert [dataclasses.astuple(s) for s in report.shards] == [("a7", "ok", 21)]


def test_young_eligible_files_of_every_kind_are_too_young(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("a7", f"{d.attempt('succeeded')}.json", age_s=400)
    d.put("a7", f".{id_in_shard('a7')}.u1.tmp", age_s=400)
    d.put("a7", "stray", age_s=400)
    d.put("a7", "stray-old", age_s=DEFAULT_MIN_AGE_S + 5)
    report = audit_receipts(d.path, d.url, shard="a7", shards=1)
    assert report.counts["too_young"] == 3
    assert by_ref(report)["a7/stray-old"] == ("unknown_file", "would_quarantine")
    # a smaller explicit minimum age makes the same files eligible
    report = audit_receipts(d.path, d.url, shard="a7", shards=1, min_age_s=MIN_AGE_FLOOR_S)
    assert report.counts["too_young"] == 0


def test_cli_json_has_the_contract_fields(audit_dir: DataDir) -> None:
    d = audit_dir
    attempt_id = d.attempt("succeeded", journal="pending", shard="03")
    d.put("03", f"{attempt_id}.json")
    d.put("05", "junk")
    result = run_ql(d.path, "--shard", "02", "--shards", "4")
    assert result.returncode == 0, result.stderr
    doc = result.json()
    assert doc["mode"] == "report"
    assert doc["next_shard"] == "06"
    assert doc["moved"] == 0
    assert set(doc["counts"]) == {c.value for c in EntryClass}
    assert doc["shards"] == [
        {"shard": "02", "state": "missing", "entries": 0},
        {"shard": "03", "state": "ok", "entries": 1},
        {"shard": "04", "state": "missing", "entries": 0},
        {"shard": "05", "state": "ok", "entries": 1},
    ]
    assert [(e["ref"], e["class"], e["action"]) for e in doc["entries"]] == [
        (f"03/{attempt_id}.json", "journal_registered", "keep"),
        ("05/junk", "unknown_file", "would_quarantine"),
    ]
    assert str(d.path) not in result.stdout  # relative references only


def test_cli_human_output_is_a_table_without_absolute_paths(audit_dir: DataDir) -> None:
    d = audit_dir
    d.put("00", "junk")
    result = run_ql(d.path, json_mode=False)
    assert result.returncode == 0, result.stderr
    assert "00/junk" in result.stdout
    assert "unknown_file" in result.stdout
    assert "next shard 08" in result.stdout
    assert "nothing was changed" in result.stdout
    assert str(d.path) not in result.stdout


@pytest.mark.parametrize(("start", "count", "expected_next"), [("fe", 4, "02"), ("00", 8, "08"),
                                                               ("FF", 1, "00"), ("e0", 32, "00")])
def test_shards_wrap_around(audit_dir: DataDir, start: str, count: int, expected_next: str) -> None:
    report = audit_receipts(audit_dir.path, audit_dir.url, shard=start, shards=count)
    assert report.next_shard == expected_next
    assert [s.shard for s in report.shards] == list(shard_names(int(start, 16), count))


def test_cli_wrap_around(audit_dir: DataDir) -> None:
    audit_dir.put("ff", "junk")
    audit_dir.put("00", "junk")
    doc = run_ql(audit_dir.path, "--shard", "fe", "--shards", "4").json()
    assert doc["next_shard"] == "02"
    assert [s["shard"] for s in doc["shards"]] == ["fe", "ff", "00", "01"]
    assert [e["ref"] for e in doc["entries"]] == ["ff/junk", "00/junk"]


def test_unprintable_names_are_escaped_and_bounded(audit_dir: DataDir) -> None:
    shard = audit_dir.shard("10")
    weird = os.fsdecode(b"evil\n\x1b[31m\xff" + b"x" * 200)
    (shard / weird).write_bytes(b"")
    set_age(shard / weird, 7200)
    report = audit_receipts(audit_dir.path, audit_dir.url, shard="10", shards=1)
    (entry,) = report.entries
    assert entry.ref.startswith("10/evil\\x0a\\x1b[31m\\xff")
    assert entry.ref.isascii() and entry.ref.isprintable()
    assert len(entry.ref) <= 3 + 120
    result = run_ql(audit_dir.path, "--shard", "10", "--shards", "1")
    assert result.returncode == 0, result.stderr
    assert result.json()["entries"][0]["ref"] == entry.ref


def test_api_rejects_bad_options(audit_dir: DataDir) -> None:
    d = audit_dir
    bad: list[dict[str, object]] = [
        {"shards": MAX_SHARDS + 1}, {"shards": 0}, {"limit": MAX_LIMIT + 1}, {"limit": 0},
        {"shard": "g0"}, {"shard": "100"}, {"shard": "a"}, {"shards": True}, {"min_age_s": 10},
        {"min_age_s": 1.5},
    ]
    for kwargs in bad:
        with pytest.raises(AuditOptionError):
            audit_receipts(d.path, d.url, **kwargs)  # type: ignore[arg-type]
    assert issubclass(AuditOptionError, UsageError) and issubclass(AuditOptionError, ValueError)
    # the caps themselves are allowed
    report = audit_receipts(d.path, d.url, shards=MAX_SHARDS, limit=MAX_LIMIT)
    assert len(report.shards) == MAX_SHARDS


def test_report_is_frozen(audit_dir: DataDir) -> None:
    report = audit_receipts(audit_dir.path, audit_dir.url)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.mode = "quarantine"  # type: ignore[misc]
    assert report.to_dict()["entries"] == []
    assert Action.KEEP == "keep"


def test_missing_receipt_root_and_shards_are_empty(tmp_path: os.PathLike[str]) -> None:
    """No receipts/ at all: every shard is missing, nothing is created, the database is not needed."""
    from pathlib import Path

    empty = Path(tmp_path) / "nothing-here"
    report = audit_receipts(empty, f"sqlite:///{empty / 'ql.db'}", quarantine=True)
    assert {s.status for s in report.shards} == {"missing"}
    assert not empty.exists()
