"""The compiled launcher: ``launcher.c`` built once per machine, kept in the user's cache.

``launcher.c`` implements the contract of ``launcher.sh`` (same arguments, channel, statuses and
receipt bytes) without the shell's helper processes: one process start per task instead of a shell,
``env`` and a publisher subshell, and about a tenth of the memory per waiting task (docs/launcher.md,
"The compiled launcher"). It is built with the machine's C compiler the first time a host needs it
and reused by every later host (``[plugin.local] launcher``: ``auto`` by default, ``compiled`` or
``shell``). Without a compiler, ``auto`` keeps the shell launcher.

The build is keyed by the source's SHA-256 and the machine type, so an upgrade of ql builds anew and
never runs an old binary. The cache directory (``$XDG_CACHE_HOME/ql``, else ``~/.cache/ql``) and the
binary must belong to this user and be writable by nobody else; anything else there is refused, not
repaired. Concurrent first uses build once (a lock), a failed build is tried again by the next host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from ql_core.paths import user_cache_dir
from ql_core.tokens import sha256_hex

__all__ = ["CompiledLauncherError", "compiled_launcher", "source_path", "BUILD_TIMEOUT_S"]

#: A compiler that takes longer than this is given up on (the shell launcher stays in use).
BUILD_TIMEOUT_S = 60.0
#: Compilers tried in order (``$CC`` first when set).
COMPILERS = ("cc", "gcc", "clang")


class CompiledLauncherError(Exception):
    """The compiled launcher cannot be built or used here; the message names the reason."""


def source_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")


#: Part of the cache key: a change of how the binary is built builds it anew.
BUILD_RECIPE = "cc -O2 -static, else cc -O2: 1"


def _libc() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "?"
    except (ValueError, OSError):
        return "not glibc"


def _key(source: bytes) -> str:
    """Source, system, machine, libc and recipe: a home shared with another machine or libc never
    runs a binary built for a different one."""
    machine = os.uname()
    facts = f"\0{machine.sysname}\0{machine.machine}\0{_libc()}\0{BUILD_RECIPE}"
    return sha256_hex(source + facts.encode())[:20]


def _private(path: str, st: os.stat_result) -> str | None:
    """Why ``path`` cannot be trusted, or None: ours, and writable by nobody else."""
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users"
    return None


def _untrusted_ancestor(directory: str) -> str | None:
    """Why a directory above ``directory`` could let another user swap the binary, or None.

    Every existing ancestor must belong to this user or root and be writable by nobody else,
    unless it is sticky (``/tmp``: others cannot rename what is ours in it), as OpenSSH's
    StrictModes asks of a key's path. Otherwise the binary checked once could be replaced by
    another user's before a later task runs it — as this user, or as root.
    """
    path = os.path.dirname(os.path.abspath(directory))
    while True:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None  # created by us below (makedirs): ours
        except OSError as exc:
            return f"cannot check {path} ({exc.strerror})"
        if st is not None:
            if st.st_uid not in (0, os.geteuid()):
                return f"{path} belongs to uid {st.st_uid}, neither this user nor root"
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return f"{path} is writable by other users"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _usable(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and _private(path, st) is None and bool(st.st_mode & stat.S_IXUSR)


def _compilers(environ: Mapping[str, str]) -> list[str]:
    import shutil

    found: list[str] = []
    for name in ((environ.get("CC", "").strip(),) if environ.get("CC", "").strip() else ()) + COMPILERS:
        path = shutil.which(name, path=environ.get("PATH", os.defpath))
        if path is not None and path not in found:
            found.append(path)
    return found


def _build(body: bytes, target_dir: str, environ: Mapping[str, str]) -> str:
    """Compile ``body`` (the very bytes the key was made of) into a new private file in
    ``target_dir``; its path (tested: it runs). Every failure is a CompiledLauncherError."""
    import subprocess
    import tempfile

    compilers = _compilers(environ)
    if not compilers:
        raise CompiledLauncherError("no C compiler (cc, gcc or clang) on PATH")
    build_env = {k: v for k, v in environ.items() if k in ("PATH", "TMPDIR", "LANG", "LC_ALL")}
    build_env.setdefault("PATH", os.defpath)
    made: list[str] = []
    try:
        fd, source = tempfile.mkstemp(dir=target_dir, prefix=".launcher-build-", suffix=".c")
        made.append(source)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        fd, out = tempfile.mkstemp(dir=target_dir, prefix=".launcher-build-")
        os.close(fd)
        made.append(out)
    except OSError as exc:
        raise CompiledLauncherError(f"cannot write in {target_dir} ({exc.strerror})") from None
    failure = ""
    try:
        for compiler in compilers:
            # Static first: no dynamic loader, no libc relocations per process, so each waiting
            # task costs ~60 KiB PSS instead of ~105 KiB once tasks share its pages (measured
            # with 50; alone it is the other way round, ~680 vs ~180 KiB: a host runs many).
            # A system without a static libc gets the dynamic build.
            for extra in (["-static"], []):
                try:
                    done = subprocess.run([compiler, "-O2", *extra, "-o", out, source], stdin=subprocess.DEVNULL,
                                          capture_output=True, timeout=BUILD_TIMEOUT_S, env=build_env, check=False)
                except (OSError, subprocess.TimeoutExpired) as exc:
                    failure = f"{os.path.basename(compiler)}: {type(exc).__name__}"
                    break
                if done.returncode == 0 and _runs(out):
                    os.chmod(out, 0o700)
                    made.remove(out)
                    return out
                failure = f"{os.path.basename(compiler)} exited {done.returncode}"
        raise CompiledLauncherError(f"building launcher.c failed ({failure})")
    except OSError as exc:
        raise CompiledLauncherError(f"building launcher.c failed ({exc.strerror})") from None
    finally:
        for path in made:
            try:
                os.unlink(path)
            except OSError:
                pass


def _runs(path: str) -> bool:
    """The binary starts and answers ``--probe`` as launcher.c does.

    Judged by its output, never by its exit status: in a host that ignores SIGCHLD (or reaps every
    child itself) ``subprocess`` reports 0 for any child, and a check by status would refuse a good
    build — or, for the compiler, accept a failed one."""
    import subprocess

    try:
        return subprocess.run([path, "--probe"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                              check=False).stdout == b"ql-launcher ok\n"
    except (OSError, subprocess.TimeoutExpired):
        return False


def _private_dir(directory: str) -> None:
    """``directory`` is a real directory of ours that nobody else can write (else the reason)."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise CompiledLauncherError(f"cannot use {directory} ({exc.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CompiledLauncherError(f"{directory} is not a directory")
    reason = _private(directory, st)
    if reason is not None:
        raise CompiledLauncherError(reason)


def _make_private_dirs(directory: str) -> None:
    """Create ``directory`` and any missing parent, each 0700 whatever the umask."""
    missing: list[str] = []
    path = directory
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)


#: How long a host waits for another one's build before it gives up (auto: the shell launcher).
LOCK_WAIT_S = 2 * BUILD_TIMEOUT_S + 10

#: Binaries this process has seen start (verified once per process: a cache shared with another
#: machine or libc must not run a binary that cannot start there).
_VERIFIED: set[str] = set()


def compiled_launcher(environ: Mapping[str, str], *, build: bool = True) -> str:
    """Path of the compiled launcher for this ql and machine, building it first if needed.

    Raises :class:`CompiledLauncherError` (with the reason) when it is neither in the cache nor
    buildable here; ``build=False`` only looks in the cache.
    """
    directory = user_cache_dir(environ)
    if directory is None:
        raise CompiledLauncherError("no cache directory (neither XDG_CACHE_HOME nor a home directory)")
    # Checked and used as the real path: a symlink in it cannot lead the checks elsewhere.
    directory = os.path.realpath(directory)
    source = source_path()
    try:
        with open(source, "rb") as f:
            body = f.read()
    except OSError as exc:
        raise CompiledLauncherError(f"launcher.c is missing from the installation ({exc.strerror})") from None
    target = os.path.join(directory, f"launcher-{_key(body)}")
    reason = _untrusted_ancestor(directory)
    if reason is not None:
        raise CompiledLauncherError(reason)
    if os.path.lexists(directory):
        _private_dir(directory)
        if _usable(target) and (target in _VERIFIED or _runs(target)):
            _VERIFIED.add(target)
            return target
    if not build:
        raise CompiledLauncherError(f"{target} has not been built")
    try:
        _make_private_dirs(directory)
    except OSError as exc:
        raise CompiledLauncherError(f"cannot create {directory} ({exc.strerror})") from None
    reason = _untrusted_ancestor(directory)  # again: what makedirs created is checked too
    if reason is not None:
        raise CompiledLauncherError(reason)
    _private_dir(directory)
    return _build_locked(body, directory, target, environ)


def _build_locked(body: bytes, directory: str, target: str, environ: Mapping[str, str]) -> str:
    import fcntl
    import time

    try:
        lock = os.open(os.path.join(directory, ".launcher.lock"),
                       os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise CompiledLauncherError(f"cannot lock {directory} ({exc.strerror})") from None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:  # one build at a time, and never an unbounded wait for another host's
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CompiledLauncherError(f"another process has been building in {directory} for over "
                                                f"{LOCK_WAIT_S:.0f} s") from None
                time.sleep(0.05)
        if _usable(target) and _runs(target):
            _VERIFIED.add(target)
            return target  # built by a host that held the lock before us
        if os.path.lexists(target):
            raise CompiledLauncherError(f"{target} exists but is not a private executable file that runs; "
                                        f"remove it")
        built = _build(body, directory, environ)
        try:
            os.rename(built, target)
        except OSError as exc:
            os.unlink(built)
            raise CompiledLauncherError(f"cannot place the launcher in {directory} ({exc.strerror})") from None
        _VERIFIED.add(target)
        return target
    except OSError as exc:
        raise CompiledLauncherError(f"cannot build in {directory} ({exc.strerror})") from None
    finally:
        os.close(lock)
