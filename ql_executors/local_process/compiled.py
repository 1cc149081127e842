"""The compiled launcher: ``launcher.c`` as a binary, shipped in the wheel or built once per machine.

``launcher.c`` implements the contract of ``launcher.sh`` (same arguments, channel, statuses and
receipt bytes) without the shell's helper processes: one process start per task instead of a shell,
``env`` and a publisher subshell, and about a tenth of the memory per waiting task (docs/launcher.md,
"The compiled launcher"). ``[plugin.local] launcher``: ``auto`` by default, ``compiled`` or ``shell``.

Where the binary comes from, in order (docs/launcher.md, "Which launcher"):

1. **Shipped**: a platform wheel carries ``bin/launcher-<machine>``, compiled statically when the
   wheel was built (``setup.py``), and ``bin/launcher.json`` naming its machine and the SHA-256 of
   the ``launcher.c`` it was built from. Used when that machine is this one, the source is the
   ``launcher.c`` installed beside it, the file is trusted (below) and it answers ``--probe``.
2. **Built here**: with the machine's C compiler the first time a host needs it, into the user's
   cache, reused by every later host. The build is keyed by the source's SHA-256, the machine type,
   the libc and the recipe, so an upgrade of ql builds anew and never runs an old binary. The cache
   directory (``$XDG_CACHE_HOME/ql``, else ``~/.cache/ql``) and the binary must belong to this user
   and be writable by nobody else; anything else there is refused, not repaired. Concurrent first
   uses build once (a lock), a failed build is tried again by the next host.
3. Otherwise ``auto`` keeps the shell launcher; :func:`which_launcher` says which one and why.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from ql_core.paths import user_cache_dir
from ql_core.tokens import sha256_hex

__all__ = ["CompiledLauncherError", "compiled_launcher", "shipped_launcher", "which_launcher", "LauncherChoice",
           "source_path", "BUILD_TIMEOUT_S"]

#: A compiler that takes longer than this is given up on (the shell launcher stays in use).
BUILD_TIMEOUT_S = 60.0
#: Compilers tried in order (``$CC`` first when set).
COMPILERS = ("cc", "gcc", "clang")


class CompiledLauncherError(Exception):
    """The compiled launcher cannot be built or used here; the message names the reason."""


def source_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")


def _shipped_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


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


class NotBuiltYet(CompiledLauncherError):
    """The cache is usable but holds no launcher for this ql yet (``build=False``)."""


def _source() -> bytes:
    try:
        with open(source_path(), "rb") as f:
            return f.read()
    except OSError as exc:
        raise CompiledLauncherError(f"launcher.c is missing from the installation ({exc.strerror})") from None


#: ELF e_machine of each machine (``uname -m``) a wheel can ship a launcher for.
SHIPPED_MACHINES = {"x86_64": 62, "aarch64": 183}
#: Beside the shipped binary: its machine and the SHA-256 of the launcher.c it was built from.
MANIFEST = "launcher.json"


def _elf_machine(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    return int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" and len(head) == 20 else None


def shipped_launcher(body: bytes | None = None) -> str:
    """Path of the launcher shipped in this installation (a platform wheel's ``bin/``), checked: for
    this machine, built from the installed ``launcher.c`` (``body``, read when None), trusted (below)
    and answering ``--probe`` once per process. CompiledLauncherError says why not.

    Trusted as ql's own code is: the binary (and ``bin/``) may be writable by nobody who could not
    already rewrite this module beside it, the Python the host runs (so a umask-002 install, whose
    files are all group-writable, is used; a binary made writable on its own is not)."""
    machine = os.uname().machine
    directory = os.path.realpath(_shipped_dir())
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            raw = f.read(4096)
    except FileNotFoundError:
        if machine not in SHIPPED_MACHINES:
            raise CompiledLauncherError(f"no shipped launcher for {machine} (wheels ship one for "
                                        f"{' and '.join(SHIPPED_MACHINES)})") from None
        raise CompiledLauncherError(f"no shipped launcher for {machine} (this installation has none: an editable "
                                    f"install, or a wheel built without a C compiler)") from None
    except OSError as exc:
        raise CompiledLauncherError(f"cannot read the shipped launcher's {MANIFEST} ({exc.strerror})") from None
    import json

    try:
        manifest = json.loads(raw)
        built_for, name, digest = manifest["machine"], manifest["file"], manifest["source_sha256"]
    except (ValueError, TypeError, KeyError):
        raise CompiledLauncherError(f"the shipped launcher's {MANIFEST} is damaged; reinstall ql-runner") from None
    if built_for != machine:
        raise CompiledLauncherError(f"the shipped launcher is for {built_for}, this machine is {machine}; install "
                                    f"the ql-runner wheel for {machine}")
    if not isinstance(name, str) or os.sep in name or not name.startswith("launcher-"):
        raise CompiledLauncherError(f"the shipped launcher's {MANIFEST} is damaged; reinstall ql-runner")
    path = os.path.join(directory, name)
    if digest != sha256_hex(_source() if body is None else body):
        raise CompiledLauncherError("the shipped launcher was built from another launcher.c than the one installed "
                                    "beside it; reinstall ql-runner")
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise CompiledLauncherError(f"the shipped launcher {path} is missing ({exc.strerror}); reinstall "
                                    f"ql-runner") from None
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IXUSR:
        raise CompiledLauncherError(f"the shipped launcher {path} is not an executable file; reinstall ql-runner")
    package = os.path.dirname(os.path.realpath(__file__))
    for what, reference in ((path, os.path.realpath(__file__)), (directory, package)):
        reason = _more_exposed(what, reference)
        if reason is not None:
            raise CompiledLauncherError(reason)
    if _elf_machine(path) != SHIPPED_MACHINES.get(machine):
        raise CompiledLauncherError(f"the shipped launcher {path} is not a {machine} program; reinstall ql-runner")
    if path not in _VERIFIED and not _runs(path):
        raise CompiledLauncherError(f"the shipped launcher ({machine}) does not run here (it does not answer "
                                    f"--probe)")
    _VERIFIED.add(path)
    return path


def _more_exposed(path: str, reference: str) -> str | None:
    """Why ``path`` could be replaced by someone who cannot replace ``reference`` (ql's own code), or
    None: the same owner (or this user, or root), and no write permission for group or others that
    ``reference`` does not grant them too."""
    try:
        st, ref = os.lstat(path), os.stat(reference)
    except OSError as exc:
        return f"cannot check {path} ({exc.strerror})"
    if st.st_uid not in (ref.st_uid, 0, os.geteuid()):
        return f"{path} belongs to uid {st.st_uid}, not to the owner of ql's own files (uid {ref.st_uid})"
    group_ok = ref.st_mode & stat.S_IWGRP and st.st_gid == ref.st_gid
    if st.st_mode & stat.S_IWOTH and not ref.st_mode & stat.S_IWOTH or st.st_mode & stat.S_IWGRP and not group_ok:
        return f"{path} is writable by other users (ql's own code beside it is not)"
    return None


def compiled_launcher(environ: Mapping[str, str], *, build: bool = True, shipped: bool = True) -> str:
    """Path of the compiled launcher for this ql and machine: the shipped one (``shipped``), else the
    one built here earlier, else built now (``build``).

    Raises :class:`CompiledLauncherError` (with every reason) when there is none to use;
    ``build=False`` only looks (:class:`NotBuiltYet`: the cache could hold it but does not).
    """
    body = _source()
    if not shipped:
        return _cached_or_built(environ, body, build=build)
    try:
        return shipped_launcher(body)
    except CompiledLauncherError as exc:
        not_shipped = str(exc)
    try:
        return _cached_or_built(environ, body, build=build)
    except CompiledLauncherError as exc:
        raise type(exc)(f"{exc}; {not_shipped}") from None


def _cache_target(environ: Mapping[str, str], body: bytes) -> tuple[str, str]:
    """The cache directory (its real path, ancestors checked) and the binary's path in it."""
    directory = user_cache_dir(environ)
    if directory is None:
        raise CompiledLauncherError("no cache directory (neither XDG_CACHE_HOME nor a home directory)")
    # Checked and used as the real path: a symlink in it cannot lead the checks elsewhere.
    directory = os.path.realpath(directory)
    reason = _untrusted_ancestor(directory)
    if reason is not None:
        raise CompiledLauncherError(reason)
    return directory, os.path.join(directory, f"launcher-{_key(body)}")


def _cached_or_built(environ: Mapping[str, str], body: bytes, *, build: bool) -> str:
    directory, target = _cache_target(environ, body)
    if os.path.lexists(directory):
        _private_dir(directory)
        if _usable(target) and (target in _VERIFIED or _runs(target)):
            _VERIFIED.add(target)
            return target
    if not build:
        if os.path.lexists(target):
            raise CompiledLauncherError(f"{target} exists but is not a private executable file that runs; remove it")
        raise NotBuiltYet(f"{target} has not been built")
    try:
        _make_private_dirs(directory)
    except OSError as exc:
        raise CompiledLauncherError(f"cannot create {directory} ({exc.strerror})") from None
    reason = _untrusted_ancestor(directory)  # again: what makedirs created is checked too
    if reason is not None:
        raise CompiledLauncherError(reason)
    _private_dir(directory)
    return _build_locked(body, directory, target, environ)


class LauncherChoice:
    """Which launcher a host would use now and why (:func:`which_launcher`; ``ql doctor``)."""

    __slots__ = ("kind", "origin", "path", "detail", "usable")

    def __init__(self, kind: str, origin: str, path: str | None, detail: str, usable: bool = True) -> None:
        #: "compiled" or "shell"; origin: "shipped", "cache", "build" (at the first task) or "shell".
        self.kind, self.origin, self.path, self.detail, self.usable = kind, origin, path, detail, usable

    def __repr__(self) -> str:
        return f"LauncherChoice({self.kind!r}, {self.origin!r}, {self.path!r}, {self.detail!r}, {self.usable!r})"


def which_launcher(environ: Mapping[str, str], choice: str = "auto") -> LauncherChoice:
    """Which launcher a host with ``[plugin.local] launcher = choice`` uses, and why, without
    building or creating anything (a shipped or cached binary is run with ``--probe``).
    ``usable`` is False only for ``compiled`` when there is none: such a host refuses to start."""
    if choice == "shell":
        return LauncherChoice("shell", "shell", None, 'shell launcher ([plugin.local] launcher = "shell")')
    machine = os.uname().machine
    not_shipped = ""
    try:
        body = _source()
        try:
            path = shipped_launcher(body)
            return LauncherChoice("compiled", "shipped", path, f"compiled launcher (shipped in the wheel, {machine}: "
                                                               f"{path})")
        except CompiledLauncherError as exc:
            not_shipped = str(exc)
        try:
            path = _cached_or_built(environ, body, build=False)
            return LauncherChoice("compiled", "cache", path, f"compiled launcher (built on this machine earlier: "
                                                             f"{path}; {not_shipped})")
        except NotBuiltYet:
            compilers = _compilers(environ)
            if compilers:
                directory = _cache_target(environ, body)[0]
                return LauncherChoice("compiled", "build", None,
                                      f"compiled launcher (built here with {compilers[0]} at the first task, into "
                                      f"{directory}; {not_shipped})")
            why = f"{not_shipped} and no C compiler (cc, gcc or clang) on PATH"
    except CompiledLauncherError as exc:
        why = f"{not_shipped}; {exc}" if not_shipped else str(exc)
    if choice == "compiled":
        return LauncherChoice("shell", "shell", None, f'none: [plugin.local] launcher = "compiled", but {why}; install '
                                                      f'the ql-runner wheel for {machine} or a C compiler, or use '
                                                      f'launcher = "auto"', usable=False)
    return LauncherChoice("shell", "shell", None, f"shell launcher: {why}")


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
