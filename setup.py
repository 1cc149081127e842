"""Build hook: the compiled launcher ships inside platform wheels (docs/launcher.md, "Which launcher").

Everything else about the package is in setup.cfg. This file only adds the launcher: when a wheel
is built, ``launcher.c`` is compiled statically (``-O2 -static``) and placed in the package as
``ql_executors/local_process/bin/launcher-<machine>``, with ``bin/launcher.json`` saying which
machine it is for and which ``launcher.c`` (SHA-256) it was built from; the wheel is then tagged
for that machine (:func:`platform_tag`) instead of ``any``.

A static executable needs no shared library at all, not even a libc: it satisfies every manylinux
policy's library rules (auditwheel finds nothing to graft or check) and runs on a musl system as
well, so the wheel carries ``manylinux_2_17_<m>.manylinux2014_<m>.musllinux_1_1_<m>`` — the oldest
policy pip knows for both x86_64 and aarch64 (2014 is the first with aarch64; its CentOS 7 kernel,
3.10, is above what the static glibc needs) plus the legacy alias older pips read. The Python tag is
``py3`` and the ABI ``none``: nothing in it is a Python extension.

Controlled by the environment of the build (``tools/build_wheels.sh`` sets both):

- ``QL_LAUNCHER_CC``: the C compiler (for aarch64: Debian's ``aarch64-linux-gnu-gcc``); else
  ``$CC``, else the first of cc, gcc, clang on PATH. The machine the wheel is tagged for is read
  from the ELF header of what it produced, never assumed.
- ``QL_LAUNCHER_BUILD``: ``auto`` (default: without a compiler, a static libc or a known machine the
  wheel is pure and says so on stderr; the launcher is then built at first use on the machine that
  runs ql, else the shell launcher runs tasks), ``require`` (such a build fails instead: releases),
  ``skip`` (always pure).

Editable installs never compile: they run the launcher built at first use into the user's cache.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1 (pyproject.toml)
from setuptools.command.build_py import build_py

PACKAGE_DIR = os.path.join("ql_executors", "local_process")
SOURCE = os.path.join(PACKAGE_DIR, "launcher.c")
#: ELF e_machine -> the machine name Linux (``uname -m``) and the wheel tags use.
MACHINES = {62: "x86_64", 183: "aarch64"}
#: The same flags as the runtime build (compiled.py) plus -s: symbols are of no use to a user.
CFLAGS = ("-O2", "-static", "-s")
BUILD_TIMEOUT_S = 120


def platform_tag(machine: str) -> str:
    """The compressed platform tag of a wheel whose only native part is a static executable."""
    return f"manylinux_2_17_{machine}.manylinux2014_{machine}.musllinux_1_1_{machine}"


def say(message: str) -> None:
    print(f"ql-runner build: {message}", file=sys.stderr, flush=True)


def elf_facts(path: str) -> tuple[int, bool]:
    """``(e_machine, static)`` of an ELF file: static means no program interpreter (PT_INTERP)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[5] != 1:  # little-endian only (both machines we tag)
            raise ValueError("not a little-endian ELF file")
        wide = head[4] == 2
        machine = int.from_bytes(head[18:20], "little")
        if wide:
            phoff, phentsize, phnum = (int.from_bytes(head[32:40], "little"), int.from_bytes(head[54:56], "little"),
                                       int.from_bytes(head[56:58], "little"))
        else:
            phoff, phentsize, phnum = (int.from_bytes(head[28:32], "little"), int.from_bytes(head[42:44], "little"),
                                       int.from_bytes(head[44:46], "little"))
        for index in range(min(phnum, 256)):
            f.seek(phoff + index * phentsize)
            if int.from_bytes(f.read(4), "little") == 3:  # PT_INTERP: needs a dynamic loader
                return machine, False
    return machine, True


def _compiler() -> str | None:
    chosen = os.environ.get("QL_LAUNCHER_CC", "").strip()
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise LauncherNotBuilt(f"QL_LAUNCHER_CC={chosen} is not an executable on PATH")
        return found
    for name in (os.environ.get("CC", "").strip(), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found is not None:
            return found
    return None


def _version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
        return (done.stdout.splitlines() or ["?"])[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def _probe(path: str, machine: str) -> str:
    """How the binary was checked: run natively, or under qemu-user for another machine."""
    prefix: list[str] = []
    if machine != os.uname().machine:
        qemu = shutil.which(f"qemu-{machine}-static") or shutil.which(f"qemu-{machine}")
        if qemu is None:
            return f"not run (a {machine} binary on {os.uname().machine}, no qemu-{machine}-static)"
        prefix = [qemu]
    try:
        done = subprocess.run([*prefix, path, "--probe"], capture_output=True, timeout=60, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherNotBuilt(f"the built launcher does not start ({type(exc).__name__}: {exc})") from None
    if done.stdout != b"ql-launcher ok\n":
        raise LauncherNotBuilt(f"the built launcher does not answer --probe (exit {done.returncode})")
    return "answers --probe" + (f" under {os.path.basename(prefix[0])}" if prefix else "")


class LauncherNotBuilt(Exception):
    """Why this build ships no launcher."""


class Built:
    def __init__(self, path: str, machine: str, manifest: dict[str, object]) -> None:
        self.path, self.machine, self.manifest = path, machine, manifest

    @property
    def name(self) -> str:
        return f"launcher-{self.machine}"


def compile_launcher(temp_dir: str) -> Built:
    """Compile ``launcher.c`` statically into ``temp_dir``; LauncherNotBuilt says why not."""
    compiler = _compiler()
    if compiler is None:
        raise LauncherNotBuilt("no C compiler (QL_LAUNCHER_CC, CC, cc, gcc or clang)")
    with open(SOURCE, "rb") as f:
        body = f.read()
    out = os.path.join(temp_dir, "launcher")
    try:
        done = subprocess.run([compiler, *CFLAGS, "-o", out, SOURCE], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherNotBuilt(f"{compiler}: {type(exc).__name__}") from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-2:])[:300]
        raise LauncherNotBuilt(f"{compiler} {' '.join(CFLAGS)} failed (exit {done.returncode}: {tail}); "
                               f"a static libc is needed (Debian: libc6-dev, or libc6-dev-arm64-cross)")
    e_machine, static = elf_facts(out)
    machine = MACHINES.get(e_machine)
    if machine is None:
        raise LauncherNotBuilt(f"{compiler} builds for ELF machine {e_machine}: wheels ship a launcher for "
                               f"{' and '.join(MACHINES.values())} only")
    if not static:
        raise LauncherNotBuilt(f"{compiler} {' '.join(CFLAGS)} produced a dynamically linked binary")
    checked = _probe(out, machine)
    manifest = {"file": f"launcher-{machine}", "machine": machine, "static": True,
                "source_sha256": hashlib.sha256(body).hexdigest(), "compiler": _version(compiler),
                "cflags": " ".join(CFLAGS)}
    say(f"compiled the launcher for {machine} with {compiler} ({manifest['compiler']}); {checked}")
    return Built(out, machine, manifest)


def shipped_launcher(dist: Distribution) -> Built | None:
    """The launcher this build ships (compiled once per build), or None for a pure wheel."""
    if hasattr(dist, "_ql_launcher"):
        return dist._ql_launcher  # type: ignore[attr-defined,no-any-return]
    mode = os.environ.get("QL_LAUNCHER_BUILD", "auto").strip() or "auto"
    if mode not in ("auto", "require", "skip"):
        raise SystemExit(f"QL_LAUNCHER_BUILD must be auto, require or skip, not {mode!r}")
    built: Built | None = None
    if mode == "skip":
        say("QL_LAUNCHER_BUILD=skip: a pure wheel without the launcher")
    else:
        temp_dir = tempfile.mkdtemp(prefix="ql-launcher-build-")
        atexit.register(shutil.rmtree, temp_dir, True)
        try:
            built = compile_launcher(temp_dir)
        except LauncherNotBuilt as exc:
            if mode == "require":
                raise SystemExit(f"ql-runner build: QL_LAUNCHER_BUILD=require, but {exc}") from None
            say(f"building a pure wheel without the launcher: {exc}. ql builds the launcher at first use "
                f"where a C compiler is installed, else runs tasks with the shell launcher "
                f"(`ql doctor` says which)")
    dist._ql_launcher = built  # type: ignore[attr-defined]
    return built


class LauncherDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # a shipped launcher makes the wheel platform-specific
        return getattr(self, "_ql_launcher", None) is not None


class BuildPyWithLauncher(build_py):
    """build_py, plus the compiled launcher and its manifest in the package's ``bin/``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = os.path.join(self.build_lib, PACKAGE_DIR, "bin")
        shutil.rmtree(target, ignore_errors=True)  # an earlier build's, maybe for another machine
        built = shipped_launcher(self.distribution)
        if built is None:
            return
        os.makedirs(target)
        binary = os.path.join(target, built.name)
        shutil.copyfile(built.path, binary)
        os.chmod(binary, 0o755)  # pip keeps the execute bit of a wheel member
        with open(os.path.join(target, "launcher.json"), "w", encoding="ascii") as f:
            json.dump(built.manifest, f, sort_keys=True)
            f.write("\n")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        outputs = list(super().get_outputs(include_bytecode))
        built = getattr(self.distribution, "_ql_launcher", None)
        if built is not None and not self.editable_mode:
            target = os.path.join(self.build_lib, PACKAGE_DIR, "bin")
            outputs += [os.path.join(target, built.name), os.path.join(target, "launcher.json")]
        return outputs


class BdistWheelWithLauncher(bdist_wheel):
    """A wheel tagged for the machine of the launcher it ships, or a pure one without. Compiled when
    the wheel is built, never for its metadata alone (``prepare_metadata_for_build_wheel``) nor for
    an editable install (which only asks this command for its tag)."""

    def run(self) -> None:
        if shipped_launcher(self.distribution) is not None:
            self.root_is_pure = False  # installed as platlib; has_ext_modules() now says so too
        super().run()

    def get_tag(self) -> tuple[str, str, str]:
        built = getattr(self.distribution, "_ql_launcher", None)
        if built is None:
            return super().get_tag()
        return "py3", "none", platform_tag(built.machine)


setup(distclass=LauncherDistribution,
      cmdclass={"build_py": BuildPyWithLauncher, "bdist_wheel": BdistWheelWithLauncher})
