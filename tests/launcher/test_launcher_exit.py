"""Exit codes, argv/shell modes, receipt bytes and publication rules of launcher.sh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ql_executors.local_process.launch import launcher_path, spawn_launcher

from .conftest import Launcher, new_token


@pytest.mark.parametrize("code", [0, 7, 255])
def test_exit_code_is_receipt_and_launcher_status(launcher: Launcher, code: int) -> None:
    task = launcher.start(["sh", "-c", f"exit {code}"])
    assert task.wait() == code
    assert task.receipt()["exitCode"] == code
    assert task.shard_entries() == [f"{task.attempt_id}.json"]  # no temp file left
    assert task.log() == b""


def test_shell_mode_runs_bin_sh_c(launcher: Launcher) -> None:
    task = launcher.start(['printf "%s|" "$0" a"b"; echo; exit 3'], mode="shell")
    assert task.wait() == 3
    assert task.receipt()["exitCode"] == 3
    assert task.log() == b"/bin/sh|ab|\n"


ODD_ARGS = [
    "two words",
    "  leading and trailing  ",
    "'single'",
    '"double"',
    "new\nline",
    "$HOME $(echo no) `echo no` ${x}",
    "*",
    "back\\slash\\n",
    "",
    "-n",
    "--",
    "a=b",
    "tab\there",
    "ünïcödé",
]


def test_argv_mode_preserves_every_argument(launcher: Launcher) -> None:
    script = "import sys, json; sys.stdout.write(json.dumps(sys.argv[1:]))"
    task = launcher.start([sys.executable, "-c", script, *ODD_ARGS])
    assert task.wait() == 0
    assert json.loads(task.log()) == ODD_ARGS
    assert task.receipt()["exitCode"] == 0


def test_command_word_containing_equals_sign(launcher: Launcher, tmp_path: Path) -> None:
    # GNU env would read a leading NAME=VALUE as an assignment; the launcher must still run it.
    prog = tmp_path / "k=v"
    prog.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\nexit 4\n')
    prog.chmod(0o755)
    task = launcher.start([str(prog), "x=1", "y"])
    assert task.wait() == 4
    assert task.log() == b"x=1\ny\n"
    assert task.receipt()["exitCode"] == 4


def test_command_not_found(launcher: Launcher, tmp_path: Path) -> None:
    task = launcher.start([str(tmp_path / "no-such-program")])
    assert task.wait() == 127
    assert task.receipt()["exitCode"] == 127


def test_stdout_and_stderr_go_to_the_log_in_order(launcher: Launcher) -> None:
    task = launcher.start(["sh", "-c", "echo one; echo two >&2; echo three; read x; echo \"[$x]\""])
    assert task.wait() == 0
    assert task.log() == b"one\ntwo\nthree\n[]\n"  # stdin is /dev/null


def test_finished_at_is_an_upper_bound_of_the_true_finish(launcher: Launcher, tmp_path: Path) -> None:
    stamp = tmp_path / "stamp"
    script = f"import time; open({str(stamp)!r}, 'w').write(str(time.time_ns()))"
    task = launcher.start([sys.executable, "-c", script])
    assert task.wait() == 0
    receipt = task.receipt()
    last_instruction_ns = int(stamp.read_text())
    assert receipt["finishedAtMs"] * 1_000_000 >= last_instruction_ns  # type: ignore[operator]
    assert receipt["finishedAtMs"] <= time.time() * 1000 + 1001  # type: ignore[operator]


def test_finished_at_is_clamped_to_started_at(launcher: Launcher) -> None:
    future = int(time.time() * 1000) + 10 * 86_400_000
    task = launcher.start(["true"], started_at_ms=future)
    assert task.wait() == 0
    assert task.receipt()["finishedAtMs"] == future


def test_command_keeps_the_hosts_umask(launcher: Launcher, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        task = launcher.start(["sh", "-c", f"echo x > {tmp_path}/made; umask"])
    finally:
        os.umask(old)
    assert task.wait() == 0
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o644
    assert task.log() == b"0022\n"
    task.receipt()  # and the receipt itself is 0600


def test_environment_is_passed_through(launcher: Launcher) -> None:
    env = {"PATH": os.environ["PATH"], "QL_T_VALUE": "with spaces\nand newline"}
    task = launcher.start(["sh", "-c", 'printf "%s" "$QL_T_VALUE"'], env=env)
    assert task.wait() == 0
    assert task.log() == b"with spaces\nand newline"


@pytest.mark.parametrize(
    "payload",
    [
        None,  # fd 3 closed
        b"",
        b"\n",
        b"short\n",
        b"A" * 31 + b"\n",
        b"A" * 129 + b"\n",
        b"A" * 40 + b"!\n",
        b"A" * 40 + b" \n",
        b" " + b"A" * 40 + b"\n",
        b"A" * 20 + b"\n" + b"A" * 20 + b"\n",
        b"A" * 40 + b"\xc3\xa9\n",
        b"A" * 40,  # no newline: not a complete line
    ],
    ids=lambda p: "closed" if p is None else repr(p)[:24],
)
def test_without_a_valid_token_the_command_never_runs(
    launcher: Launcher, payload: bytes | None
) -> None:
    """The token line is the go-ahead: EOF (the host died first) or a bad line means nothing runs."""
    task = launcher.start_raw(fd3=payload, command=["sh", "-c", "echo ran; exit 6"])
    assert task.wait() == 125
    assert task.log() == b""
    task.assert_no_receipt()


def test_valid_raw_token_is_accepted(launcher: Launcher) -> None:
    token = "Ab0_-" * 8
    task = launcher.start_raw(fd3=token.encode() + b"\n", command=["sh", "-c", "exit 2"])
    assert task.wait() == 2
    assert task.receipt()["token"] == token
    assert task.receipt()["exitCode"] == 2


def _bad_args(kind: str, marker: Path) -> Callable[[Path, str, str], list[str]]:
    def build(shard: Path, run_id: str, attempt_id: str) -> list[str]:
        touch = f"touch '{marker}'"
        good = [str(shard), run_id, attempt_id, "1", "1700000000000", "argv", "--", "sh", "-c", touch]
        bad = {
            "no-separator": good[:6] + good[7:],
            "no-command": good[:7],
            "bad-mode": good[:5] + ["exec"] + good[6:],
            "shell-two-words": good[:5] + ["shell", "--", touch, "extra"],
            "relative-shard": ["receipts/xx"] + good[1:],
            "upper-run-id": [good[0], run_id.upper()] + good[2:],
            "v4-attempt-id": good[:2] + ["0190a1b2-c3d4-4e5f-8a6b-0123456789ab"] + good[3:],
            "path-attempt-id": good[:2] + ["../../etc/x"] + good[3:],
            "seq-leading-zero": good[:3] + ["01"] + good[4:],
            "seq-negative": good[:3] + ["-1"] + good[4:],
            "started-float": good[:4] + ["1.5"] + good[5:],
            "started-huge": good[:4] + ["9" * 19] + good[5:],
            "started-over-2^53": good[:4] + [str(2**53)] + good[5:],
            "seq-zero": good[:3] + ["0"] + good[4:],
            # LIMITS (optional, right before "--"): five fields, each empty or an integer.
            "limits-four-fields": good[:6] + [",2000,,"] + good[6:],
            "limits-six-fields": good[:6] + [",2000,,,,"] + good[6:],
            "limits-not-a-number": good[:6] + [",2s,,,"] + good[6:],
            "limits-leading-zero": good[:6] + [",02000,,,"] + good[6:],
            "limits-negative": good[:6] + [",-1,,,"] + good[6:],
            "limits-twice": good[:6] + [",,,,", ",,,,"] + good[6:],
        }
        return bad[kind]

    return build


@pytest.mark.parametrize(
    "kind",
    [
        "no-separator",
        "no-command",
        "bad-mode",
        "shell-two-words",
        "relative-shard",
        "upper-run-id",
        "v4-attempt-id",
        "path-attempt-id",
        "seq-leading-zero",
        "seq-negative",
        "started-float",
        "started-huge",
        "started-over-2^53",
        "seq-zero",
        "limits-four-fields",
        "limits-six-fields",
        "limits-not-a-number",
        "limits-leading-zero",
        "limits-negative",
        "limits-twice",
    ],
)
def test_contract_violations_exit_125_without_running(
    launcher: Launcher, kind: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    task = launcher.start_raw(fd3=new_token().encode() + b"\n", args=_bad_args(kind, marker))
    assert task.wait() == 125
    assert not marker.exists()
    assert task.log() == b""
    task.assert_no_receipt()


def test_existing_receipt_is_never_overwritten(launcher: Launcher) -> None:
    def plant(shard: Path, attempt_id: str) -> None:
        (shard / f"{attempt_id}.json").write_bytes(b"older")

    task = launcher.start(["sh", "-c", "exit 5"], prepare=plant)
    assert task.wait() == 5
    assert task.receipt_path.read_bytes() == b"older"
    assert task.shard_entries() == [f"{task.attempt_id}.json"]


def test_a_directory_at_the_receipt_path_is_left_alone(launcher: Launcher) -> None:
    task = launcher.start(
        ["sh", "-c", "exit 5"], prepare=lambda shard, attempt: (shard / f"{attempt}.json").mkdir()
    )
    assert task.wait() == 5
    assert os.listdir(task.receipt_path) == []  # ln did not link into it
    assert task.shard_entries() == [f"{task.attempt_id}.json"]


def test_missing_shard_dir_publishes_nothing(launcher: Launcher) -> None:
    task = launcher.start(["sh", "-c", "exit 9"], prepare=lambda shard, _: shard.rmdir())
    assert task.wait() == 9
    assert not task.shard_dir.exists()


def test_symlinked_shard_dir_publishes_nothing(launcher: Launcher, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def swap(shard: Path, _: str) -> None:
        shard.rmdir()
        shard.symlink_to(elsewhere)

    task = launcher.start(["sh", "-c", "exit 9"], prepare=swap)
    assert task.wait() == 9
    assert os.listdir(elsewhere) == []


def test_read_only_shard_dir_keeps_exit_code(launcher: Launcher) -> None:
    mounted: list[Path] = []

    def read_only(shard: Path, _: str) -> None:
        if os.geteuid() != 0:
            shard.chmod(0o500)
            return
        # root ignores permissions: make it a read-only bind mount of itself instead.
        r = subprocess.run(["mount", "--bind", str(shard), str(shard)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {r.stderr.decode().strip()}")
        mounted.append(shard)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(shard)], check=True)

    try:
        task = launcher.start(["sh", "-c", "echo ran; exit 12"], prepare=read_only)
        assert task.wait() == 12
        assert task.log() == b"ran\n"
        task.assert_no_receipt()
    finally:
        for path in mounted:
            subprocess.run(["umount", str(path)], check=True)


# ---------------------------------------------------------------- spawn_launcher itself


def test_launcher_path_is_packaged_file() -> None:
    path = launcher_path()
    assert os.path.isabs(path) and os.path.isfile(path)
    assert path.endswith("launcher.sh")


def test_token_is_not_in_the_spawn_argv(launcher: Launcher) -> None:
    task = launcher.start(["true"])
    assert task.wait() == 0
    assert all(task.token not in str(arg) for arg in task.proc.args)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "override",
    [
        {"token": "short"},
        {"token": "x" * 40 + "\n"},
        {"mode": "exec"},
        {"mode": "shell", "command": ["a", "b"]},
        {"command": []},
        {"run_id": "not-a-uuid"},
        {"callback_sequence": -1},
        {"callback_sequence": True},
        {"started_at_ms": 2**53},
        {"callback_sequence": 0},
        {"shard_dir": "relative/dir"},
    ],
)
def test_spawn_launcher_rejects_bad_arguments(override: dict[str, object], tmp_path: Path) -> None:
    kwargs: dict[str, object] = {
        "shard_dir": str(tmp_path),
        "run_id": "0190a1b2-c3d4-7e5f-8a6b-0123456789ab",
        "attempt_id": "0190a1b2-c3d4-7e5f-9a6b-0123456789ab",
        "callback_sequence": 1,
        "started_at_ms": 1,
        "mode": "argv",
        "command": ["true"],
        "token": new_token(),
        "log_fd": 1,
    }
    kwargs.update(override)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError):
        spawn_launcher(**kwargs)  # type: ignore[arg-type]
    assert set(os.listdir("/proc/self/fd")) == before  # no pipe leaked


def test_busybox_userland(launcher: Launcher, shell: list[str], tmp_path: Path) -> None:
    """Only busybox tools on PATH: no GNU env (no signal reset), no GNU date (no %N)."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        pytest.skip("busybox is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("env", "date", "ln", "rm", "sync", "sh", "sleep", "grep"):
        (bindir / tool).symlink_to(busybox)
    stamp = tmp_path / "stamp"
    task = launcher.start(
        ["sh", "-c", f"grep SigIgn /proc/$$/status > '{stamp}.sig'; date +%s > '{stamp}'; exit 3"],
        env={"PATH": str(bindir)},
    )
    assert task.wait() == 3
    receipt = task.receipt()
    assert receipt["exitCode"] == 3
    assert receipt["finishedAtMs"] >= int(stamp.read_text()) * 1000  # type: ignore[operator]
    # The shell that ran this reported its own SigIgn: busybox ash ignores QUIT itself while it
    # waits for a child, so only INT says something here (test_launcher_busybox_only.py reads the
    # dispositions of an exec'd command). Without GNU env the launcher runs the command in the
    # foreground, where every shell resets INT.
    ignored = int((tmp_path / "stamp.sig").read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGINT - 1))


def test_an_executable_file_without_a_shebang_runs_as_a_shell_script(
    launcher: Launcher, shell: list[str], tmp_path: Path
) -> None:
    """What a shell does with ENOEXEC (and glibc's execvp; musl's does not, so the compiled
    launcher hands such a file to /bin/sh itself)."""
    if "qemu" in os.path.basename(shell[0]):
        pytest.skip("qemu-user's execve emulation fails such a file before busybox can fall back")
    script = tmp_path / "no-shebang"
    script.write_text("echo ran as a script\nexit 4\n")
    script.chmod(0o755)
    task = launcher.start([str(script)])
    assert task.wait() == 4
    assert task.receipt()["exitCode"] == 4
    assert task.log() == b"ran as a script\n"
