"""Power-loss approximation (ADR-0007 gate 11): record one real task's file-system operations (its
log append and its launcher's receipt publication) with strace, replay every crash state the model
in ``crash_model`` allows into a copy of the real data dir, and run real recovery on each.

Asserted for every state: the run ends with the true exit code or ``lost`` - never a success, never
another code; a receipt whose bytes are not complete is never accepted (quarantined or gone); a
complete one is always accepted.

The recording is replayed twice: as recorded (the launcher's ``sync FILE`` fsyncs the temp file and
the shard), and with every fsync removed, as on a system where ``sync FILE`` is unsupported (the
launcher then goes on without it): there a linked receipt can be half-written or zero-filled.

Two kinds of recording: the production path (the runtime's executor, with the launcher ``auto``
picks: the compiled one where it can be built), and the same attempt published again by each
launcher alone (the compiled launcher, and launcher.sh under dash, bash, ``bash --posix``, busybox
ash, AArch64 busybox ash under qemu-user), its paths moved onto the real data dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from .crash_model import CrashState, crash_states
from .strace_ops import STRACE_ARGS, Op, parse_trace

TRUE_EXIT = 7
HOST = textwrap.dedent(
    """
    import json, os, sys
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    d = sys.argv[1]
    rt = Runtime.open(load_config(data_dir=d, environ={}, cwd=d))
    sub = rt.submit(["sh", "-c", "echo ran; exit %d"])
    print(json.dumps({"run_id": sub.run_id, "attempt_id": sub.attempt_id}), flush=True)
    os._exit(0)  # the host dies here: nothing waits for the task, the database says running
    """
    % TRUE_EXIT
)


def _files_under(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out[path] = Path(path).read_bytes()
    return out


def _baseline(now: dict[str, bytes], ops: list[Op]) -> dict[str, bytes]:
    """The relevant files as they were before the first recorded operation (durable: the host
    created and synced them before the spawn)."""
    created = {op.path for op in ops if op.kind == "creat"} | {
        op.path2 for op in ops if op.kind in ("link", "rename")
    }
    base = {p: b for p, b in now.items() if p not in created}
    for op in ops:
        assert op.kind != "unlink" or op.path in created, f"a pre-existing file was removed: {op}"
    for path in base:
        written = b"".join(op.data for op in ops if op.kind == "write" and op.path == path)
        assert base[path].endswith(written), f"{path} was not only appended to"
        base[path] = base[path][: len(base[path]) - len(written)]
    return base


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One real submit through the real runtime, its host killed at once, traced to the end."""
    strace = shutil.which("strace")
    if strace is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strace is not installed; under CI=true it is required")
        pytest.skip("strace is not installed")
    work = tmp_path_factory.mktemp("powerloss")
    data = work / "data"
    host = work / "host.py"
    host.write_text(HOST)
    trace = work / "trace.txt"
    proc = subprocess.run(
        [strace, *STRACE_ARGS, "-o", str(trace), sys.executable, str(host), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    ids = json.loads(proc.stdout)
    # strace returns once every traced process is gone: the launcher has published and exited.
    receipts, logs = data / "receipts", data / "logs"

    def relevant(path: str) -> bool:
        return path.startswith((f"{receipts}/", f"{logs}/")) and "/.quarantine" not in path

    lines = trace.read_text().splitlines()
    host_pid = int(lines[0].split()[0])
    ops = parse_trace(lines, relevant=relevant, skip_pid=host_pid)
    now = {p: b for p, b in _files_under(data).items() if relevant(p)}
    final = next(p for p in now if p.endswith(f"/{ids['attempt_id']}.json"))
    return {"data": data, "ids": ids, "ops": ops, "now": now, "final": final}


def test_the_recording_is_one_log_append_and_one_publication(recording: dict[str, object]) -> None:
    ops: list[Op] = recording["ops"]  # type: ignore[assignment]
    kinds = [op.kind for op in ops]
    # The command's `echo`, then the launcher: temp created, written, flushed, linked, removed,
    # shard flushed - the steps of docs/receipt-publication.md §3.
    assert kinds == ["write", "creat", "write", "fsync", "link", "unlink", "fsync"], kinds
    final: str = recording["final"]  # type: ignore[assignment]
    assert ops[4].path2 == final and ops[6].path == os.path.dirname(final)
    assert json.loads(recording["now"][final])["exitCode"] == TRUE_EXIT  # type: ignore[index]


def _recover(template: Path, dest: Path, state: CrashState, touched: set[str], ids: dict[str, str]):
    from ql_core.config import load_config
    from ql_core.runtime import Runtime

    shutil.copytree(template, dest, symlinks=True)
    for path in touched:
        target = dest / os.path.relpath(path, template)
        if target.is_file():  # the shard directory itself stays
            target.unlink()
    for path, content in state.files.items():
        target = dest / os.path.relpath(path, template)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, content)
        finally:
            os.close(fd)
    rt = Runtime.open(load_config(data_dir=dest, environ={}, cwd=dest))
    try:
        assert rt.status(ids["run_id"]).status == "running"  # what the dead host left
        for _ in range(3):  # a quarantined receipt may take one more pass to become lost
            rt.reconcile()
            view = rt.status(ids["run_id"])
            if view.terminal:
                return view
        return view
    finally:
        rt.close()


def _replay(
    recording: dict[str, object], ops: list[Op], complete: bytes, tmp_path: Path, fsync: str
) -> tuple[int, Counter[str]]:
    """Replay every crash state of ``ops`` into copies of the recorded data dir; check each."""
    if fsync == "fsync-unsupported":
        ops = [op for op in ops if op.kind != "fsync"]
    data: Path = recording["data"]  # type: ignore[assignment]
    ids: dict[str, str] = recording["ids"]  # type: ignore[assignment]
    final: str = recording["final"]  # type: ignore[assignment]
    now: dict[str, bytes] = recording["now"]  # type: ignore[assignment]
    touched = set(now) | {op.path for op in ops} | {op.path2 for op in ops if op.path2}
    states = crash_states(ops, _baseline(now, ops))
    outcomes: Counter[str] = Counter()
    for n, state in enumerate(states):
        view = _recover(data, tmp_path / f"s{n}", state, touched, ids)
        where = f"state {n} (after {state.prefix} ops; {state.how}): {view.status}/{view.exit_code}"
        assert view.status != "succeeded", where
        left = tmp_path / f"s{n}" / os.path.relpath(final, data)
        if final in state.files and state.files[final] == complete:
            assert (view.status, view.exit_code) == ("failed", TRUE_EXIT), where
            outcomes["complete receipt -> failed/7"] += 1
        elif final in state.files:
            assert view.status == "lost", where  # a damaged receipt is never accepted ...
            assert not left.exists(), where  # ... and does not stay where a reader would take it
            outcomes["damaged receipt -> lost"] += 1
        else:
            assert view.status == "lost", where
            outcomes["no receipt -> lost"] += 1
    assert outcomes["complete receipt -> failed/7"] and outcomes["no receipt -> lost"]
    if fsync == "fsync-unsupported":
        assert outcomes["damaged receipt -> lost"]  # the model reached the dangerous states
    else:
        assert not outcomes["damaged receipt -> lost"]  # the launcher's fsync rules them out
    return len(states), outcomes


FSYNC = pytest.mark.parametrize("fsync", ["as-recorded", "fsync-unsupported"])


@FSYNC
def test_every_crash_state_recovers_to_the_true_code_or_lost(
    recording: dict[str, object],
    tmp_path: Path,
    fsync: str,
    record_property: Callable[[str, object], None],
) -> None:
    """The production path: the runtime's executor spawned the launcher it picks by default."""
    ops: list[Op] = recording["ops"]  # type: ignore[assignment]
    complete = recording["now"][recording["final"]]  # type: ignore[index]
    count, outcomes = _replay(recording, ops, complete, tmp_path, fsync)
    record_property("powerloss", {"variant": fsync, "states": count, "outcomes": dict(outcomes)})


LAUNCH = textwrap.dedent(
    """
    import json, os, sys
    from ql_executors.local_process.launch import spawn_launcher

    cfg = json.loads(sys.stdin.readline())  # the token never goes through argv
    fd = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    proc = spawn_launcher(
        **cfg["launcher"], shard_dir=cfg["shard"], run_id=cfg["run_id"],
        attempt_id=cfg["attempt_id"], callback_sequence=cfg["seq"], started_at_ms=cfg["started"],
        mode="argv", command=["sh", "-c", "echo ran; exit %d"], token=cfg["token"], log_fd=fd,
    )
    os.close(fd)
    sys.exit(0 if proc.wait() == %d else 1)
    """
    % (TRUE_EXIT, TRUE_EXIT)
)


@pytest.fixture(scope="module", params=["dash", "bash", "bash-posix", "busybox", "busybox-aarch64", "compiled"])
def shell(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def shell_recording(
    shell: str, recording: dict[str, object], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[Op], bytes]:
    """The same attempt published again by the launcher alone under one shell, recorded, with
    its paths moved onto the real data dir: the receipt carries the real ids and token (read from
    the real receipt), so recovery judges it exactly as it would the original."""
    from tests.launcher.conftest import _shell_argv, launcher_kwargs, require_tool

    argv = require_tool(*_shell_argv(shell))
    tmp_path = tmp_path_factory.mktemp(f"launch-{shell}")
    data: Path = recording["data"]  # type: ignore[assignment]
    final: str = recording["final"]  # type: ignore[assignment]
    real = json.loads(recording["now"][final])  # type: ignore[index]
    log = next(op.path for op in recording["ops"] if op.kind == "write")  # type: ignore[attr-defined]
    scratch = tmp_path / "scratch"
    shard = scratch / os.path.relpath(os.path.dirname(final), data)
    shard.mkdir(mode=0o700, parents=True)
    scratch_log = scratch / os.path.relpath(log, data)
    scratch_log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    scratch_log.touch(mode=0o600)
    host = tmp_path / "launch.py"
    host.write_text(LAUNCH)
    trace = tmp_path / "trace.txt"
    cfg = {"launcher": launcher_kwargs(argv), "shard": str(shard), "log": str(scratch_log), "run_id": real["runId"],
           "attempt_id": real["attemptId"], "seq": real["callbackSequence"],
           "started": real["startedAtMs"], "token": real["token"]}
    proc = subprocess.run(
        [shutil.which("strace") or "strace", *STRACE_ARGS, "-o", str(trace), sys.executable,
         str(host)],
        input=json.dumps(cfg) + "\n", capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = trace.read_text().splitlines()
    prefix = f"{scratch}/"
    ops = parse_trace(lines, relevant=lambda p: p.startswith(prefix),
                      skip_pid=int(lines[0].split()[0]))

    def move(path: str) -> str:
        return str(data / os.path.relpath(path, scratch)) if path.startswith(prefix) else path

    ops = [Op(op.kind, move(op.path), move(op.path2) if op.path2 else "", op.data, op.pid)
           for op in ops]
    assert [op.kind for op in ops] == ["write", "creat", "write", "fsync", "link", "unlink", "fsync"]
    complete = (shard / os.path.basename(final)).read_bytes()
    return shell, ops, complete


# The fsync-less variant is the same model over the same operation kinds (asserted above), so it is
# replayed once, on the production path; each shell replays what it really did.
def test_every_crash_state_of_each_launcher_shell_recovers(
    recording: dict[str, object],
    shell_recording: tuple[str, list[Op], bytes],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    _name, ops, complete = shell_recording
    count, outcomes = _replay(recording, ops, complete, tmp_path / "states", "as-recorded")
    record_property(
        "powerloss", {"variant": "as-recorded", "states": count, "outcomes": dict(outcomes)}
    )
