"""Turn an ``strace -f -y -xx`` recording into the file-system operations a crash model replays.

Only what changes durable state is kept: creating a name, writing file data, flushing a file or a
directory, linking, unlinking, renaming. Anything else on a path of interest (a truncating open,
``writev``, ``pwrite``) is refused rather than silently ignored: the model must know every
operation it claims to cover.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Op", "STRACE_ARGS", "parse_trace"]

# The syscalls that can change what survives a crash, plus openat (to see creations).
STRACE_ARGS = [
    "-f",
    "-qq",
    "-y",
    "-xx",
    "-s",
    "65536",
    "-e",
    "signal=none",
    "-e",
    "trace=openat,open,creat,write,writev,pwrite64,fsync,fdatasync,sync,syncfs,link,linkat,"
    "unlink,unlinkat,rename,renameat,renameat2,truncate,ftruncate",
]


@dataclass(frozen=True)
class Op:
    """One operation. ``kind``: creat, write, fsync, link, unlink, rename, sync (whole system)."""

    kind: str
    path: str = ""
    path2: str = ""  # link / rename target
    data: bytes = b""
    pid: int = 0

    def describe(self) -> str:
        extra = f" -> {os.path.basename(self.path2)}" if self.path2 else ""
        size = f" ({len(self.data)} bytes)" if self.kind == "write" else ""
        return f"{self.kind} {os.path.basename(self.path) or '-'}{extra}{size}"


_LINE = re.compile(r"^(?P<pid>\d+) +(?P<call>\w+)\((?P<args>.*)\) += (?P<ret>-?\d+)(?:<(?P<retpath>[^>]*)>)?")
_UNFINISHED = re.compile(r"^(?P<pid>\d+) +(?P<head>.*) <unfinished \.\.\.>$")
_RESUMED = re.compile(r"^(?P<pid>\d+) +<\.\.\. \w+ resumed>(?P<tail>.*)$")
_HEX = re.compile(r"\\x([0-9a-f]{2})")
_STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')
_FD = re.compile(r"(?:\d+|AT_FDCWD)<((?:\\x[0-9a-f]{2})*)>")


def _unhex(text: str) -> bytes:
    return bytes(int(h, 16) for h in _HEX.findall(text))


def _lines(raw: Iterable[str]) -> Iterable[str]:
    """Whole syscall lines: an ``<unfinished ...>`` head joined with its ``resumed`` tail."""
    pending: dict[str, str] = {}
    for line in raw:
        line = line.rstrip("\n")
        if m := _UNFINISHED.match(line):
            pending[m["pid"]] = m["head"]
            continue
        if m := _RESUMED.match(line):
            head = pending.pop(m["pid"], None)
            if head is None:
                continue
            line = f"{m['pid']} {head}{m['tail']}"
        yield line


def _abs(base: str, path: str) -> str:
    return os.path.normpath(path if path.startswith("/") else os.path.join(base, path))


def parse_trace(
    raw: Iterable[str], *, relevant: Callable[[str], bool], skip_pid: int | None = None
) -> list[Op]:
    """The durable-state operations on ``relevant`` paths, in the order they completed."""
    ops: list[Op] = []
    for line in _lines(raw):
        m = _LINE.match(line)
        if m is None or int(m["ret"]) < 0:
            continue
        pid = int(m["pid"])
        if pid == skip_pid:
            continue
        call, args = m["call"], m["args"]
        strings = [_unhex(s).decode("utf-8", "surrogateescape") for s in _STRING.findall(args)]
        fds = [_unhex(s).decode("utf-8", "surrogateescape") for s in _FD.findall(args)]
        retpath = _unhex(m["retpath"] or "").decode("utf-8", "surrogateescape")
        op: Op | None = None
        if call in ("openat", "open", "creat"):
            if not retpath or not relevant(retpath):
                continue
            flags = args.split(", ")[2 if call == "openat" else 1] if call != "creat" else "O_CREAT"
            if "O_TRUNC" in flags or call == "creat":
                raise ValueError(f"unmodelled truncating open of {retpath}")
            if "O_CREAT" in flags:
                if "O_EXCL" not in flags:
                    raise ValueError(f"unmodelled non-exclusive create of {retpath}")
                op = Op("creat", retpath, pid=pid)
        elif call == "write":
            if fds and relevant(fds[0]):
                # The first quoted string is the buffer (the fd's path is in <...>, not quoted).
                buffer = _unhex(_STRING.findall(args)[0])
                op = Op("write", fds[0], data=buffer[: int(m["ret"])], pid=pid)
        elif call in ("fsync", "fdatasync"):
            if fds and relevant(fds[0]):
                op = Op("fsync", fds[0], pid=pid)
        elif call in ("sync", "syncfs"):
            op = Op("sync", pid=pid)
        elif call in ("link", "linkat", "rename", "renameat", "renameat2"):
            base = fds[0] if fds else os.getcwd()
            base2 = fds[1] if len(fds) > 1 else base
            old, new = _abs(base, strings[0]), _abs(base2, strings[1])
            if relevant(old) or relevant(new):
                op = Op("link" if call.startswith("link") else "rename", old, new, pid=pid)
        elif call in ("unlink", "unlinkat"):
            path = _abs(fds[0] if fds else os.getcwd(), strings[0])
            if relevant(path):
                if call == "unlinkat" and "AT_REMOVEDIR" in args:
                    raise ValueError(f"unmodelled rmdir of {path}")
                op = Op("unlink", path, pid=pid)
        elif call in ("writev", "pwrite64", "truncate", "ftruncate"):
            paths = fds + strings
            if any(relevant(p) for p in paths):
                raise ValueError(f"unmodelled {call} on {paths}")
        if op is not None:
            ops.append(op)
    return ops
