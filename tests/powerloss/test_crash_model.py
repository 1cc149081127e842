"""The crash model itself, on hand-written operation lists: it must produce the dangerous states
(or the replay proves nothing) and must not invent states a barrier rules out."""

from __future__ import annotations

from .crash_model import _states_after, crash_states
from .strace_ops import Op, parse_trace

D = "/d/r/ab"
TMP, FINAL, LOG = f"{D}/.a.1t2.tmp", f"{D}/a.json", "/d/l/ab/x.log"
PUBLISH = [
    Op("creat", TMP),
    Op("write", TMP, data=b"RECEIPT!"),
    Op("fsync", TMP),
    Op("link", TMP, FINAL),
    Op("unlink", TMP),
    Op("fsync", D),
]


def _finals(ops: list[Op]) -> set[bytes]:
    return {s.files[FINAL] for s in crash_states(ops, {}) if FINAL in s.files}


def test_a_flushed_temp_is_only_ever_linked_whole() -> None:
    assert _finals(PUBLISH) == {b"RECEIPT!"}


def test_without_the_file_flush_a_linked_receipt_can_be_damaged() -> None:
    assert _finals([op for op in PUBLISH if op != Op("fsync", TMP)]) == {
        b"RECEIPT!",
        b"",
        b"RECE",
        b"\0" * 8,
    }


def test_unflushed_directory_changes_may_vanish_independently() -> None:
    states = crash_states(PUBLISH[:5], {})  # the shard was never flushed
    shapes = {tuple(sorted(s.files)) for s in states}
    assert () in shapes  # nothing survived
    assert (FINAL,) in shapes  # the link survived, its source name did not
    assert (TMP,) in shapes and tuple(sorted((TMP, FINAL))) in shapes


def test_after_the_directory_flush_only_the_published_state_remains() -> None:
    last = list(_states_after(PUBLISH, {}, len(PUBLISH)))
    assert [s.files for s in last] == [{FINAL: b"RECEIPT!"}]


def test_an_unflushed_append_keeps_the_durable_prefix() -> None:
    states = crash_states([Op("write", LOG, data=b"tick\n")], {LOG: b"old\n"})
    assert {s.files[LOG] for s in states} == {b"old\n", b"old\ntick\n", b"old\nti", b"old\n\0\0\0\0\0"}


def test_parse_trace_joins_unfinished_lines_and_resolves_paths() -> None:
    def hx(text: str) -> str:
        return "".join(f"\\x{b:02x}" for b in text.encode())

    lines = [
        f'7 openat(AT_FDCWD<{hx("/")}>, "{hx(TMP)}", O_WRONLY|O_CREAT|O_EXCL, 0666) = 3<{hx(TMP)}>',
        f'7 write(3<{hx(TMP)}>, "{hx("RECEIPT!")}", 8 <unfinished ...>',
        f'9 write(1<{hx("/elsewhere")}>, "{hx("x")}", 1) = 1',
        "7 <... write resumed>) = 8",
        f'8 linkat(AT_FDCWD<{hx(D)}>, "{hx(".a.1t2.tmp")}", AT_FDCWD<{hx(D)}>, "{hx("a.json")}", 0) = 0',
        f'8 unlinkat(AT_FDCWD<{hx("/")}>, "{hx(TMP)}", 0) = -1 ENOENT (No such file or directory)',
    ]
    ops = parse_trace(lines, relevant=lambda p: p.startswith("/d/"))
    assert ops == [
        Op("creat", TMP, pid=7),
        Op("write", TMP, data=b"RECEIPT!", pid=7),
        Op("link", TMP, FINAL, pid=8),
    ]
