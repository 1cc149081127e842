"""The compiled launcher's build and selection: launcher.c, compiled once into the user's cache.

Its behaviour (arguments, channel, signals, statuses, receipt bytes) is tested by every other file in
this directory, where ``compiled`` is one of the ``shell`` fixture's launchers. Here: where it is
built, when it is trusted, that concurrent first uses build once, that ``auto`` falls back to
launcher.sh without a compiler and that ``compiled`` then fails with a one-line reason.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ql_core.config import load_config
from ql_core.errors import ConfigError
from ql_core.runtime import Runtime
from ql_executors.local_process import compiled
from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher
from ql_executors.local_process.executor import LocalProcessExecutor

from .conftest import require_tool


@pytest.fixture
def cc() -> str:
    found = shutil.which("cc") or shutil.which("gcc")
    return require_tool([found] if found else None, "no C compiler")[0]


@pytest.fixture
def cache_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path / "home")}


def _no_compiler_env(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_built_once_into_a_private_cache(cc: str, cache_env: dict[str, str]) -> None:
    path = compiled_launcher(cache_env)
    cache = Path(cache_env["XDG_CACHE_HOME"]) / "ql"
    assert Path(path).parent == cache
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    # It runs, and refuses an empty argument list as the contract says.
    assert subprocess.run([path], check=False).returncode == 125
    # A second host finds it and builds nothing (no compiler needed any more).
    assert compiled_launcher({**cache_env, "PATH": "/nonexistent"}, build=False) == path
    assert compiled_launcher({**cache_env, "PATH": "/nonexistent"}) == path
    assert [p.name for p in cache.iterdir() if p.name.startswith(".launcher-build-")] == []


def test_home_without_xdg_and_without_home(tmp_path: Path) -> None:
    from ql_core.paths import user_cache_dir

    home = tmp_path / "home"
    assert user_cache_dir({"HOME": str(home)}) == str(home / ".cache" / "ql")
    # No HOME in the environment (a service manager's): the account's home directory.
    import pwd

    assert user_cache_dir({}) == os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "ql")
    assert user_cache_dir({"XDG_CACHE_HOME": "relative"}) == os.path.join(
        pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "ql")


def test_a_changed_source_is_a_new_binary(cc: str, cache_env: dict[str, str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    first = compiled_launcher(cache_env)
    changed = tmp_path / "launcher.c"
    changed.write_bytes(Path(compiled.source_path()).read_bytes() + b"\n/* another version */\n")
    monkeypatch.setattr(compiled, "source_path", lambda: str(changed))
    second = compiled_launcher(cache_env)
    assert second != first and os.path.exists(first) and os.path.exists(second)


def test_a_cache_others_can_write_is_refused(cc: str, cache_env: dict[str, str]) -> None:
    cache = Path(cache_env["XDG_CACHE_HOME"]) / "ql"
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    with pytest.raises(CompiledLauncherError, match="writable by other users"):
        compiled_launcher(cache_env)
    cache.chmod(0o700)
    path = compiled_launcher(cache_env)
    # A binary someone made group-writable is not run, and not silently replaced either.
    os.chmod(path, 0o770)
    with pytest.raises(CompiledLauncherError, match="not a private executable file that runs; remove it"):
        compiled_launcher(cache_env)
    assert os.path.isfile(path)  # the refusal changed nothing on disk
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o770


def test_a_path_others_could_change_is_refused(cc: str, tmp_path: Path) -> None:
    """Another user who can rename a directory above the cache could swap the binary after it was
    checked: a world-writable (not sticky) ancestor is refused; a sticky one (/tmp) is fine."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(shared / "cache")}
    with pytest.raises(CompiledLauncherError, match=f"{shared} is writable by other users"):
        compiled_launcher(env)
    shared.chmod(0o1777)
    assert os.path.isfile(compiled_launcher(env))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the binary to another user")
def test_a_binary_of_another_user_is_refused(cc: str, cache_env: dict[str, str]) -> None:
    path = compiled_launcher(cache_env)
    os.chown(path, 65534, -1)
    with pytest.raises(CompiledLauncherError, match="remove it"):
        compiled_launcher(cache_env)


def test_no_compiler(tmp_path: Path) -> None:
    with pytest.raises(CompiledLauncherError, match="no C compiler"):
        compiled_launcher(_no_compiler_env(tmp_path))
    # Nothing half-built is left behind.
    cache = tmp_path / "cache" / "ql"
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".launcher.lock")] == []


def test_a_compiler_that_fails_is_reported(tmp_path: Path) -> None:
    env = _no_compiler_env(tmp_path)
    broken = Path(env["PATH"]) / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 4\n")
    broken.chmod(0o755)
    with pytest.raises(CompiledLauncherError, match=r"building launcher.c failed \(cc exited 4\)"):
        compiled_launcher(env)
    cache = tmp_path / "cache" / "ql"
    assert [p.name for p in cache.iterdir() if p.name.startswith(".launcher-build-")] == []


def test_concurrent_first_uses_build_once(cc: str, cache_env: dict[str, str], tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from ql_executors.local_process.compiled import compiled_launcher
        print(compiled_launcher(os.environ))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **cache_env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _out, err in outs]
    paths = {out.strip() for out, _err in outs}
    assert len(paths) == 1
    cache = Path(cache_env["XDG_CACHE_HOME"]) / "ql"
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [Path(paths.pop()).name]


def test_auto_falls_back_to_the_shell_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _no_compiler_env(tmp_path)
    # A PATH with what launcher.sh and the task use, and no compiler. mkdir: the launcher makes its
    # task cgroup again when another host's sweep of the shared parent removed it before the task
    # entered (other test workers' hosts sweep the same ql-<uid>; without mkdir that ends in 126).
    for tool in ("sh", "env", "ln", "rm", "sync", "date", "sleep", "mkdir", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (Path(env["PATH"]) / tool).symlink_to(found)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CC", raising=False)
    assert LocalProcessExecutor(launcher="auto").compiled_launcher() is None
    with Runtime.open(load_config(data_dir=tmp_path / "data", environ={}, cwd=tmp_path)) as rt:
        sub = rt.submit(["sleep", "0.3"])
        launcher = Path(f"/proc/{sub.task.live.process.pid}/cmdline").read_bytes().split(b"\0")  # type: ignore[union-attr]
        view = rt.wait(sub)
    assert launcher[1].endswith(b"launcher.sh")
    assert (view.status, view.exit_code) == ("succeeded", 0)


def test_compiled_required_without_a_compiler_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _no_compiler_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CC", raising=False)
    config = tmp_path / "ql.toml"
    config.write_text('[plugin.local]\nlauncher = "compiled"\n')
    with pytest.raises(ConfigError) as err:
        rt = Runtime.open(load_config(config_path=config, data_dir=tmp_path / "data", environ={}, cwd=tmp_path))
        rt.executor  # noqa: B018 - building the executor is what fails
    message = str(err.value)
    assert "no C compiler" in message and 'launcher = "auto"' in message and "\n" not in message


def test_an_unknown_launcher_choice_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "ql.toml"
    config.write_text('[plugin.local]\nlauncher = "fast"\n')
    with pytest.raises(ConfigError, match="launcher must be one of 'auto', 'compiled', 'shell', not 'fast'"):
        rt = Runtime.open(load_config(config_path=config, data_dir=tmp_path / "data", environ={}, cwd=tmp_path))
        rt.executor  # noqa: B018


def test_shell_choice_never_builds(tmp_path: Path, cache_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in cache_env.items():
        monkeypatch.setenv(key, value)
    executor = LocalProcessExecutor(launcher="shell")
    assert executor.compiled_launcher() is None
    assert not (Path(cache_env["XDG_CACHE_HOME"]) / "ql").exists()


def test_the_cache_dir_made_writable_later_is_refused(cc: str, cache_env: dict[str, str]) -> None:
    path = compiled_launcher(cache_env)
    Path(path).parent.chmod(0o777)
    with pytest.raises(CompiledLauncherError, match="writable by other users"):
        compiled_launcher(cache_env)


def test_a_symlink_cannot_hide_a_writable_ancestor(cc: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "real").mkdir(parents=True)
    shared.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(shared / "real")
    with pytest.raises(CompiledLauncherError, match="writable by other users"):
        compiled_launcher({"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(link)})


def test_directories_it_creates_are_private_whatever_the_umask(cc: str, tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        path = compiled_launcher({"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp_path / "a" / "b")})
    finally:
        os.umask(old)
    for directory in (tmp_path / "a", tmp_path / "a" / "b", Path(path).parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    # ...so a second host trusts what the first one made.
    assert compiled_launcher({"PATH": "/nonexistent", "XDG_CACHE_HOME": str(tmp_path / "a" / "b")}) == path


def test_a_removed_binary_is_built_again_before_the_next_task(cc: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with Runtime.open(load_config(data_dir=tmp_path / "data", environ={}, cwd=tmp_path)) as rt:
        assert rt.run(["true"]).status == "succeeded"
        path = rt.executor.compiled_launcher()  # type: ignore[union-attr]
        assert path is not None
        os.unlink(path)  # a cache cleaner ran
        view = rt.run(["sh", "-c", "exit 5"])
        assert (view.status, view.exit_code) == ("failed", 5)
        assert os.path.isfile(path)


def _raw_compiled(path: str, shard: Path, token: str, command: list[str], log: Path,
                  preexec: object = None, pass_fds: tuple[int, ...] = (), wrap: list[str] | None = None
                  ) -> subprocess.Popen[bytes]:
    from ql_core.ids import new_id
    from ql_executors.local_process.launch import launcher_args

    attempt = shard.name
    args = launcher_args(shard_dir=shard.parent, run_id=new_id(), attempt_id=attempt, callback_sequence=1,
                         started_at_ms=1_700_000_000_000, mode="argv", command=command, flags="c")
    r, w = os.pipe()
    os.write(w, (token + "\n").encode())
    os.close(w)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        return subprocess.Popen([*(wrap or []), path, *args], stdin=r, stdout=fd, stderr=fd,
                                preexec_fn=preexec, pass_fds=pass_fds,  # type: ignore[arg-type]
                                start_new_session=True)
    finally:
        os.close(fd)
        os.close(r)


@pytest.fixture
def attempt_dir(tmp_path: Path) -> Path:
    """``<shard>/<attempt id>``: the shard exists, the path's last part names the attempt."""
    from ql_core.ids import new_id

    shard = tmp_path / "receipts" / "xx"
    shard.mkdir(parents=True, mode=0o700)
    return shard / new_id()


def test_started_with_sigchld_ignored_and_signals_blocked(cc: str, cache_env: dict[str, str],
                                                          attempt_dir: Path, tmp_path: Path) -> None:
    """A host that ignores SIGCHLD or blocks signals must not cost the status (the kernel would
    reap the command) nor leave the command deaf to TERM and INT: the shell gives the command a
    clean mask, and so does the compiled launcher."""
    import signal

    from .conftest import new_token

    def hostile() -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    log = tmp_path / "task.log"
    proc = _raw_compiled(compiled_launcher(cache_env), attempt_dir, new_token(),
                         ["sh", "-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status; exit 3"], log, preexec=hostile)
    assert proc.wait(30) == 3
    lines = dict(line.split(":\t") for line in log.read_text().splitlines())
    assert int(lines["SigBlk"], 16) == 0
    assert int(lines["SigIgn"], 16) & (1 << (signal.SIGCHLD - 1)) == 0
    receipt = json.loads((attempt_dir.parent / f"{attempt_dir.name}.json").read_text())
    assert receipt["exitCode"] == 3


def test_inherited_descriptors_do_not_reach_the_command(cc: str, cache_env: dict[str, str], attempt_dir: Path,
                                                        tmp_path: Path) -> None:
    from .conftest import new_token

    extra = os.open(tmp_path / "extra", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        log = tmp_path / "task.log"
        proc = _raw_compiled(compiled_launcher(cache_env), attempt_dir, new_token(),
                             ["sh", "-c", f'[ -e /proc/$$/fd/{extra} ] && echo leaked || echo clean'], log,
                             pass_fds=(extra,))
        assert proc.wait(30) == 0
    finally:
        os.close(extra)
    assert log.read_text() == "clean\n"


def test_a_failed_fsync_publishes_nothing(cc: str, cache_env: dict[str, str], attempt_dir: Path,
                                         tmp_path: Path) -> None:
    """EIO from fsync of the temp receipt: its bytes may not be durable, so no receipt (the attempt
    will be lost), no temp left, and the command's status is still the launcher's exit."""
    from .conftest import new_token

    strace = require_tool([shutil.which("strace")] if shutil.which("strace") else None, "strace is not installed")
    log = tmp_path / "task.log"
    proc = _raw_compiled(compiled_launcher(cache_env), attempt_dir, new_token(), ["sh", "-c", "exit 6"], log,
                         wrap=[strace[0], "-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync",
                               "-e", "inject=fsync:error=EIO:when=1"])
    assert proc.wait(30) == 6
    assert os.listdir(attempt_dir.parent) == []
