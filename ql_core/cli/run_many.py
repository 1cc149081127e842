"""``ql run --detach --many FILE``: a burst of runs (a cron minute's worth) from one JSON-lines file.

Each non-empty line is one run, a JSON object with the keys of ``ql run``'s options::

    {"command": ["report.sh", "7"], "name": "report-7", "timeout": 600, "env": {"DAY": "mon"}}

``command`` (a list of strings; with ``"shell": true`` one string) is required; ``name``, ``timeout``
(seconds), ``cwd``, ``env`` (names to values, added like ``--env``) and ``retries`` are optional.

The whole file is read and checked before anything is submitted: one wrong line submits nothing, and
the error names the line and the key, never a value. Then the runs are submitted in order, a batch at
a time — on a cluster-control node one transaction per batch (``Runtime.submit_many``) — and each
batch's run ids are printed (one per line, in the file's order) as soon as it has committed. If a
batch fails, the lines before it were submitted and their ids are on stdout; the error says which line
is the first one that was not, so a retry resubmits exactly the rest.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import TYPE_CHECKING, Any

from ql_core.errors import UsageError

if TYPE_CHECKING:
    from ql_core.cli.output import Output
    from ql_core.runtime import Runtime

__all__ = ["read_many", "submit_file", "MAX_MANY_BYTES", "MAX_LOCAL_MANY", "BATCH"]

#: The file is read up to this size (a 10,000-line burst of ordinary commands is a few MiB).
MAX_MANY_BYTES = 64 * 1024 * 1024
#: A node that runs its tasks itself starts every run of the file at once: at most this many.
MAX_LOCAL_MANY = 256
#: Runs per ``submit_many`` call: a cluster-control node's transaction (``SUBMIT_BATCH``).
BATCH = 256
#: A line's keys (``ql run``'s options) and the ``Runtime.submit_many`` argument each becomes.
_KEYS = {"command": "command", "shell": "shell", "name": "name", "timeout": "timeout_s", "cwd": "cwd",
         "env": "env_add", "retries": "max_attempts"}


def _read_bytes(path: str) -> bytes:
    """The file's bytes (``-``: stdin), bounded; never blocks on a FIFO or device given as FILE."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_MANY_BYTES + 1)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"--many: cannot open the file ({exc.strerror}); give a JSON-lines file, "
                             f"or - for stdin") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError("--many: not a regular file; give a JSON-lines file, or - to read stdin")
            chunks, size = [], 0
            while size <= MAX_MANY_BYTES:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
    if len(data) > MAX_MANY_BYTES:
        raise UsageError(f"--many: the file is larger than {MAX_MANY_BYTES // (1024 * 1024)} MiB; split the burst")
    return data


def _task(number: int, line: bytes) -> dict[str, Any]:
    """One line as ``submit_many``'s task; UsageError naming the line (never its content)."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        detail = f" ({exc.msg} at column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise UsageError(f"--many: line {number} is not JSON{detail}; each line is one object such as "
                         f'{{"command": ["prog", "arg"]}}') from None
    if not isinstance(obj, dict) or "command" not in obj:
        raise UsageError(f'--many: line {number} must be a JSON object with a "command" (a list of strings)')
    unknown = sorted(set(obj) - set(_KEYS))
    if unknown:
        raise UsageError(f"--many: line {number} has a key ql run does not take; allowed: {', '.join(sorted(_KEYS))}")
    task = {_KEYS[key]: value for key, value in obj.items() if value is not None}
    if "max_attempts" in task:
        retries = task["max_attempts"]
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise UsageError(f'--many: line {number}: "retries" must be a whole number >= 0')
        task["max_attempts"] = retries + 1
    if isinstance(task.get("env_add"), dict):
        from ql_core.submit import check_env_add

        try:
            check_env_add(task["env_add"])
        except (TypeError, UsageError):
            raise UsageError(f'--many: line {number}: "env" maps NAMEs (letters, digits and _, not starting with '
                             f"a digit) to string values") from None
    return task


def read_many(path: str) -> tuple[list[int], list[dict[str, Any]]]:
    """(line numbers, tasks) of every non-empty line, all checked as ``submit_many`` checks them."""
    from ql_core.submit import MAX_SUBMIT_MANY, check_tasks

    numbers, tasks = [], []
    for number, line in enumerate(_read_bytes(path).split(b"\n"), 1):
        if not line.strip():
            continue
        if len(tasks) >= MAX_SUBMIT_MANY:
            raise UsageError(f"--many: more than {MAX_SUBMIT_MANY} runs in one file; split the burst")
        numbers.append(number)
        tasks.append(_task(number, line))
    if not tasks:
        raise UsageError("--many: the file holds no run; each line is one object such as "
                         '{"command": ["prog", "arg"]}')
    for number, task in zip(numbers, tasks):
        try:
            check_tasks([task])
        except (TypeError, UsageError) as exc:
            reason = str(exc).removeprefix("tasks[0]: ")
            raise UsageError(f"--many: line {number}: {reason}") from None
    return numbers, tasks


def submit_file(rt: Runtime, path: str, out: Output) -> int:
    """Check the whole file, then submit it batch by batch, printing each batch's ids once committed."""
    numbers, tasks = read_many(path)
    runs_here = rt.node.executor is not None
    if runs_here and len(tasks) > MAX_LOCAL_MANY:
        raise UsageError(f"--many: this node starts every run at once and takes at most {MAX_LOCAL_MANY} per "
                         f"file (this one has {len(tasks)}); split the file, or queue the burst on a "
                         f"cluster-control node")
    batch = 1 if runs_here else BATCH  # here each run starts as it is submitted: print each id at once
    out.tolerate_broken_pipe = True  # from the first commit on, a leaving reader changes nothing
    for i in range(0, len(tasks), batch):
        try:
            subs = rt.submit_many(tasks[i:i + batch])
        except Exception as exc:
            if i == 0:
                raise
            from ql_core.errors import QlError

            raise QlError(f"--many: the runs of the lines before line {numbers[i]} were submitted (their ids are "
                          f"printed above); line {numbers[i]} and the {len(tasks) - i - 1} after it were not: "
                          f"{type(exc).__name__}: {exc} — submit those lines again") from None
        for number, sub in zip(numbers[i:i + batch], subs):
            state = "queued" if sub.attempt_id is None else "running"
            out.emit({"line": number, "run_id": sub.run_id, "attempt_id": sub.attempt_id, "status": state},
                     sub.run_id)
    return 0
