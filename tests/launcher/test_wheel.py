"""The launcher shipped in the wheel: how the wheels are built and tagged, that an installed wheel
runs tasks with it where there is no C compiler at all, and how the executor chooses it
(docs/launcher.md, "Which launcher").

The wheels are built for real by tools/build_wheels.sh, once per session (``wheel_of`` in
conftest.py); the installed one goes into a fresh venv and runs real tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ql_executors.local_process import compiled
from tests.conftest import json_lines, run_ql

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "ql_executors" / "local_process" / "launcher.c"
BIN = "ql_executors/local_process/bin"
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
NATIVE = os.uname().machine
FOREIGN = "aarch64" if NATIVE == "x86_64" else "x86_64"
COMPILERS = ("cc", "gcc", "clang", "c99", "tcc")


def _elf(blob: bytes) -> tuple[int, bool]:
    """``(e_machine, static)`` of a little-endian 64-bit ELF image: static = no PT_INTERP."""
    assert blob[:4] == b"\x7fELF" and blob[4] == 2 and blob[5] == 1, "not a 64-bit little-endian ELF"
    phoff = int.from_bytes(blob[32:40], "little")
    size, count = int.from_bytes(blob[54:56], "little"), int.from_bytes(blob[56:58], "little")
    types = {int.from_bytes(blob[phoff + i * size:phoff + i * size + 4], "little") for i in range(count)}
    return int.from_bytes(blob[18:20], "little"), 3 not in types


def _extract(wheel: Path, where: Path) -> Path:
    """The wheel's ``bin/`` (binary and manifest) copied to ``where`` (0700, as installed privately)."""
    where.mkdir(mode=0o700, parents=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(f"{BIN}/"):
                target = where / name.rsplit("/", 1)[1]
                target.write_bytes(z.read(name))
                target.chmod(0o700 if not name.endswith(".json") else 0o600)
    return where


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_each_wheel_is_tagged_for_its_machine_and_ships_a_static_launcher_of_this_source(
        wheel_of: Callable[[str], Path], machine: str) -> None:
    wheel = wheel_of(machine)
    tags = f"manylinux_2_17_{machine}.manylinux2014_{machine}.musllinux_1_1_{machine}"
    assert wheel.name == f"ql_runner-{_version()}-py3-none-{tags}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = z.getinfo(f"{BIN}/launcher-{machine}")
        binary = z.read(info)
        manifest = json.loads(z.read(f"{BIN}/launcher.json"))
        wheel_file = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert sorted(n for n in names if n.startswith(f"{BIN}/")) == [f"{BIN}/launcher-{machine}", f"{BIN}/launcher.json"]
    assert info.external_attr >> 16 & 0o111, "pip makes a member executable only if its mode says so"
    assert _elf(binary) == (ELF_MACHINE[machine], True)  # for that machine, and static
    assert manifest["machine"] == machine and manifest["file"] == f"launcher-{machine}"
    assert manifest["source_sha256"] == hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    assert "Root-Is-Purelib: false" in wheel_file  # installed as platlib, as a platform wheel is
    assert sorted(line for line in wheel_file.splitlines() if line.startswith("Tag: ")) == sorted(
        f"Tag: py3-none-{tag}" for tag in tags.split("."))
    assert f"{SOURCE.relative_to(ROOT)}".replace(os.sep, "/") in names  # the fallback build's source too


def _version() -> str:
    from ql_core import __version__

    return __version__


def _toolbin(tmp_path: Path) -> str:
    """A PATH holding only what a task here needs (sh, true): no C compiler can be reached."""
    tools = tmp_path / "toolbin"
    if tools.is_dir():
        return str(tools)
    tools.mkdir()
    for name in ("sh", "true"):
        os.symlink(shutil.which(name) or f"/bin/{name}", tools / name)
    path = str(tools)
    for name in COMPILERS:
        assert shutil.which(name, path=path) is None, f"{name} is reachable on {path}"
    return path


HOST = r"""
import json, os, sys
import ql_core
sys.path.append(sys.argv[2])  # the checkout after site-packages: only tests.dbview comes from it
from tests.dbview import CommitLog
from ql_core.config import load_config
from ql_core.runtime import Runtime
data = sys.argv[1]
rt = Runtime.open(load_config(data_dir=data, environ={}, cwd=data))
try:
    log = CommitLog(rt)
    try:
        view = rt.run(["sh", "-c", "exit 0"])
    finally:
        log.close()
    print(json.dumps({"ql_core": ql_core.__file__, "launcher": rt.executor.compiled_launcher(),
                      "status": view.status, "durable": log.durable_writes,
                      "events": [e.type for e in rt.events(view.run_id)]}))
finally:
    rt.close()
"""


@pytest.fixture
def installed(wheel_of: Callable[[str], Path], tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh venv with the native wheel installed from a PATH without a C compiler, and the
    environment its commands run with (that PATH, an empty home and cache: no launcher built before)."""
    wheel = wheel_of(NATIVE)
    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(fresh)
    path = _toolbin(tmp_path)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("QL_", "PYTHON", "VIRTUAL_ENV"))
            and k not in ("CC", "XDG_CACHE_HOME")}
    pip = [str(fresh / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    install = subprocess.run([*pip, str(wheel)], env={**base, "PATH": path}, capture_output=True, text=True,
                             timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert install.returncode == 0, install.stderr[-3000:]
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {**base, "PATH": path, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "QL_DATA_DIR": str(tmp_path / "data")}
    yield fresh, env


def _doctor_launcher(fresh: Path, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([str(fresh / "bin" / "ql"), "doctor", "--json"], env=env, capture_output=True, text=True,
                         timeout=120, check=False, stdin=subprocess.DEVNULL, cwd=fresh)
    records = [r for r in json_lines(out.stdout) if r.get("check") == "launcher"]
    assert len(records) == 1, out.stdout + out.stderr
    return records[0]


def test_the_installed_wheel_runs_tasks_on_its_shipped_standby_launcher_without_a_c_compiler(
        installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    fresh, env = installed
    site = next((fresh / "lib").glob("python3*/site-packages"))
    shipped = site / BIN / f"launcher-{NATIVE}"
    doctor = _doctor_launcher(fresh, env)
    assert doctor["result"] == "ok"
    assert doctor["detail"].startswith(f"compiled launcher (shipped in the wheel, {NATIVE}: {shipped})"), doctor
    assert "standby launchers on" in doctor["detail"]

    # Run from tmp_path: ``python -c`` puts the working directory first on sys.path (the checkout's).
    host = subprocess.run([str(fresh / "bin" / "python"), "-c", HOST, str(tmp_path / "data"), str(ROOT)], env=env,
                          capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
                          cwd=tmp_path)
    assert host.returncode == 0, host.stderr[-3000:]
    seen = json.loads(host.stdout.splitlines()[-1])
    assert seen["ql_core"].startswith(str(site)), seen  # the installed wheel's code, not this checkout's
    assert seen["launcher"] == str(shipped)
    assert seen["status"] == "succeeded"
    # The standby path: the run and its attempt are created running in ONE durable commit (with
    # run.created and attempt.spawned), then the terminal commit; the classic path needs three.
    start, _terminal = seen["durable"]
    assert "INSERT ql_run" in start and "INSERT ql_run_attempt" in start, seen["durable"]
    assert seen["events"][:2] == ["run.created", "attempt.spawned"]
    assert not (Path(env["XDG_CACHE_HOME"]) / "ql").exists() or not any(
        p.name.startswith("launcher-") for p in (Path(env["XDG_CACHE_HOME"]) / "ql").iterdir())  # nothing built

    run = subprocess.run([str(fresh / "bin" / "ql"), "run", "--", "true"], env=env, capture_output=True, text=True,
                         timeout=120, check=False, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert run.returncode == 0, run.stderr


def test_an_installed_launcher_is_trusted_as_much_as_ql_s_own_code_and_no_more(
        installed: tuple[Path, dict[str, str]]) -> None:
    fresh, env = installed
    site = next((fresh / "lib").glob("python3*/site-packages"))
    package = site / "ql_executors" / "local_process"
    shipped = package / "bin" / f"launcher-{NATIVE}"
    # As pip leaves it under umask 002 (user-private groups): everything group-writable, the code too.
    for path in (package, package / "bin", package / "compiled.py", shipped):
        path.chmod(path.stat().st_mode | 0o020)
    assert _doctor_launcher(fresh, env)["detail"].startswith("compiled launcher (shipped in the wheel, ")
    shipped.chmod(0o757)  # writable by anyone, when ql's own code is not
    doctor = _doctor_launcher(fresh, env)
    assert doctor == {"check": "launcher", "result": "ok",
                      "detail": f"shell launcher: {shipped} is writable by other users (ql's own code beside it is "
                                f"not) and no C compiler (cc, gcc or clang) on PATH"}
    shipped.chmod(0o755)
    source = package / "launcher.c"
    source.write_bytes(source.read_bytes() + b"/* changed after the wheel was built */\n")
    doctor = _doctor_launcher(fresh, env)
    assert "the shipped launcher was built from another launcher.c" in doctor["detail"], doctor
    assert doctor["detail"].startswith("shell launcher: ")


def test_an_sdist_built_without_a_c_compiler_gives_a_pure_wheel_and_says_so(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the 'build' package (dev extras) builds the sdist")
    made = subprocess.run([str(ROOT / "tools" / "build_wheels.sh"), "--out", str(tmp_path / "dist"), "sdist"],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600,
                          check=False, stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stderr[-3000:]
    src = tmp_path / "src"
    with tarfile.open(next((tmp_path / "dist").glob("ql_runner-*.tar.gz"))) as sdist:
        # The data filter where this Python has it (3.11.4+; Debian 12's python3 is 3.11.2): the
        # archive is our own, so an older one extracts it as it is.
        sdist.extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    tree = next(src.iterdir())
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "QL_LAUNCHER_CC", "QL_LAUNCHER_BUILD")}
    env["PATH"] = _toolbin(tmp_path)
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "out"), str(tree)],
                          env=env, capture_output=True, text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "building a pure wheel without the launcher: no C compiler" in done.stdout + done.stderr
    wheel = next((tmp_path / "out").glob("*.whl"))
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        assert not [n for n in z.namelist() if n.startswith(f"{BIN}/")]
        assert "ql_executors/local_process/launcher.c" in z.namelist()  # for the build at first use

    # A release build never ships a pure wheel by accident.
    env["QL_LAUNCHER_BUILD"] = "require"
    refused = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "out2"), str(tree)],
                             env=env, capture_output=True, text=True, timeout=600, check=False,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode != 0
    assert "QL_LAUNCHER_BUILD=require, but no C compiler" in refused.stdout + refused.stderr


# ------------------------------------------------------------ how the executor chooses (in-process)


@pytest.fixture
def shipped_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Where compiled.py looks for a shipped launcher, moved to a private directory of this test
    (the checkout's own package has none: an editable install never ships one)."""
    where = tmp_path / "pkg"
    where.mkdir(mode=0o700)
    source = where / "launcher.c"
    shutil.copyfile(SOURCE, source)
    monkeypatch.setattr(compiled, "_shipped_dir", lambda: str(where / "bin"))
    monkeypatch.setattr(compiled, "source_path", lambda: str(source))
    monkeypatch.setattr(compiled, "_VERIFIED", set())
    return where


def _cache_env(tmp_path: Path, *, compiler: bool) -> dict[str, str]:
    return {"PATH": os.environ["PATH"] if compiler else _toolbin(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_the_shipped_launcher_comes_before_the_cache_and_a_build(
        wheel_of: Callable[[str], Path], shipped_dir: Path, tmp_path: Path) -> None:
    _extract(wheel_of(NATIVE), shipped_dir / "bin")
    env = _cache_env(tmp_path, compiler=True)
    found = compiled.which_launcher(env)
    shipped = str(shipped_dir / "bin" / f"launcher-{NATIVE}")
    assert (found.kind, found.origin, found.path) == ("compiled", "shipped", shipped)
    assert compiled.compiled_launcher(env) == found.path
    assert not (tmp_path / "cache").exists()  # nothing was built, not even the cache directory made


@pytest.mark.parametrize("harm", ["foreign", "mislabelled", "source", "group-writable", "silent"])
def test_a_shipped_launcher_that_cannot_be_used_falls_back_to_the_build_here(
        wheel_of: Callable[[str], Path], shipped_dir: Path, tmp_path: Path, harm: str) -> None:
    bin_dir = shipped_dir / "bin"
    _extract(wheel_of(FOREIGN if harm in ("foreign", "mislabelled") else NATIVE), bin_dir)
    manifest = json.loads((bin_dir / "launcher.json").read_text())
    if harm == "mislabelled":  # a foreign binary under this machine's name
        (bin_dir / manifest["file"]).rename(bin_dir / f"launcher-{NATIVE}")
        manifest.update(machine=NATIVE, file=f"launcher-{NATIVE}")
    elif harm == "source":
        (shipped_dir / "launcher.c").write_bytes(SOURCE.read_bytes() + b"/* not what the binary was built from */\n")
    elif harm == "group-writable":
        (bin_dir / manifest["file"]).chmod(0o770)
    elif harm == "silent":  # runs, but is not a launcher: it never answers --probe
        shutil.copyfile(shutil.which("true") or "/bin/true", bin_dir / manifest["file"])
        (bin_dir / manifest["file"]).chmod(0o700)
    (bin_dir / "launcher.json").write_text(json.dumps(manifest))
    why = {"foreign": f"the shipped launcher is for {FOREIGN}, this machine is {NATIVE}",
           "mislabelled": f"is not a {NATIVE} program",
           "source": "the shipped launcher was built from another launcher.c",
           "group-writable": "is writable by other users",
           "silent": f"the shipped launcher ({NATIVE}) does not run here"}[harm]
    if harm == "silent" and NATIVE not in ELF_MACHINE:
        pytest.skip("true is not an ELF of a machine a wheel ships for")

    without = compiled.which_launcher(_cache_env(tmp_path, compiler=False))
    assert without.kind == "shell" and why in without.detail and without.detail.endswith(
        "and no C compiler (cc, gcc or clang) on PATH"), without
    with pytest.raises(compiled.CompiledLauncherError, match="no C compiler"):
        compiled.compiled_launcher(_cache_env(tmp_path, compiler=False))

    env = _cache_env(tmp_path, compiler=True)
    planned = compiled.which_launcher(env)
    assert planned.origin == "build" and planned.detail.startswith("compiled launcher (built here with "), planned
    assert why in planned.detail
    built = compiled.compiled_launcher(env)  # the runtime fallback: built into the cache, as before
    assert Path(built).parent == Path(tmp_path / "cache" / "ql").resolve()
    assert compiled.which_launcher(env).origin == "cache"


def test_doctor_names_the_launcher_and_builds_nothing(ql_env: dict[str, str], tmp_path: Path) -> None:
    """In this checkout (an editable install: nothing shipped) with an empty cache."""
    ql_env = {**ql_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = run_ql(["doctor", "--json"], ql_env)
    line = next(r for r in json_lines(out.stdout) if r.get("check") == "launcher")
    if shutil.which("cc", path=ql_env["PATH"]):
        assert line["result"] == "ok" and line["detail"].startswith("compiled launcher (built here with "), line
        assert f"no shipped launcher for {NATIVE}" in line["detail"]
    no_compiler = {**ql_env, "PATH": _toolbin(tmp_path)}
    out = run_ql(["doctor", "--json"], no_compiler)
    line = next(r for r in json_lines(out.stdout) if r.get("check") == "launcher")
    assert line["result"] == "ok" and line["detail"].startswith(f"shell launcher: no shipped launcher for {NATIVE}")
    assert line["detail"].endswith("and no C compiler (cc, gcc or clang) on PATH")

    config = tmp_path / "ql.toml"
    config.write_text('[plugin.local]\nlauncher = "compiled"\n')
    out = run_ql(["--config", str(config), "doctor"], no_compiler)
    assert out.returncode == 1
    assert any(line.startswith("FAIL launcher") for line in out.stdout.splitlines()), out.stdout
    assert 'launcher = "compiled", but' in out.stdout and 'or use launcher = "auto"' in out.stdout
    shell = tmp_path / "shell.toml"
    shell.write_text('[plugin.local]\nlauncher = "shell"\n')
    out = run_ql(["--config", str(shell), "doctor", "--json"], ql_env)
    line = next(r for r in json_lines(out.stdout) if r.get("check") == "launcher")
    assert line["detail"] == 'shell launcher ([plugin.local] launcher = "shell")'
    assert not (tmp_path / "cache" / "ql").exists() or not any(
        p.name.startswith("launcher-") for p in (tmp_path / "cache" / "ql").iterdir())
