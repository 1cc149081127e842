"""The traceback corpus: inputs a new user or a fault injector feeds the real `ql` command.

Every case must end as the contract says (docs/cli.md): no traceback anywhere, at most one line
on stderr (exactly one, starting ``ql``, when the command fails), exit 2 for usage and
configuration errors, 1 for operational failures, and nothing created where nothing should be.
`ql doctor` reports on stdout instead (a failed check is a line, not a traceback).

Cases that need root (tmpfs mounts, another user) are skipped elsewhere; the rest run anywhere.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tests.cli.cli_support import can_switch_user, clean_env, ql_proc, seed_data_dir


@dataclass
class Case:
    args: list[str]
    env: dict[str, str]
    #: Expected exit status (or the allowed ones).
    rc: int | tuple[int, ...]
    #: Substrings the one error line (or doctor's stdout) must contain.
    says: tuple[str, ...] = ()
    #: Substrings it must not contain.
    never_says: tuple[str, ...] = ()
    user: str | None = None
    close_stdout: bool = False
    #: The command reports on stdout (doctor): stderr stays empty.
    reports_on_stdout: bool = False
    #: Paths that must not exist afterwards (a reader or doctor created nothing).
    not_created: tuple[Path, ...] = ()
    #: Shell words run before the command, e.g. to remove the working directory under it.
    cwd: Path | None = None
    #: Seconds before a hang is a failure.
    timeout: float = 60
    cleanup: list[Callable[[], None]] = field(default_factory=list)


Builder = Callable[[Path], Case]
CASES: dict[str, Builder] = {}
NEEDS_ROOT: set[str] = set()
NEEDS_NOBODY: set[str] = set()
XFAIL: dict[str, str] = {}


def case(name: str, *, root: bool = False, nobody: bool = False, xfail: str | None = None):
    def register(builder: Builder) -> Builder:
        CASES[name] = builder
        if root:
            NEEDS_ROOT.add(name)
        if nobody:
            NEEDS_NOBODY.add(name)
        if xfail:
            XFAIL[name] = xfail
        return builder
    return register


def env_for(base: Path, **extra: str) -> dict[str, str]:
    home = base / "home"
    home.mkdir(exist_ok=True)
    return clean_env(home, **extra)


def used_dir(base: Path, name: str = "data") -> Path:
    d = base / name
    seed_data_dir(d, env_for(base))
    return d


def dd(path: Path | str, *args: str) -> list[str]:
    return ["--data-dir", str(path), *args]


READERS = {"list": ["list"], "status": ["status", "01a22b46-155c-7d09-872b-21304a383465"]}
MISSING_RUN = "01a22b46-155c-7d09-872b-21304a383465"


# -- a data dir of another user, or without permission (as user nobody) ---------------------------------
for _cmd in ("list", "status", "run", "doctor"):
    def _foreign(base: Path, cmd: str = _cmd) -> Case:
        d = used_dir(base)
        args = {"list": ["list"], "status": ["status", MISSING_RUN], "run": ["run", "--", "true"],
                "doctor": ["doctor"]}[cmd]
        return Case(dd(d, *args), env_for(base, HOME="/nonexistent"), 1, user="nobody",
                    says=("belongs to uid 0", "run ql as that user"), reports_on_stdout=cmd == "doctor")
    case(f"foreign_data_dir/{_cmd}", root=True, nobody=True)(_foreign)

for _cmd in ("list", "run"):
    def _no_permission(base: Path, cmd: str = _cmd) -> Case:
        d = used_dir(base)
        subprocess.run(["chown", "-R", "nobody:nogroup", str(d)], check=True)
        d.chmod(0)
        args = ["list"] if cmd == "list" else ["run", "--", "true"]
        return Case(dd(d, *args), env_for(base), 1, user="nobody", says=("is yours but its mode is 0000",))
    case(f"unreadable_data_dir/{_cmd}", root=True, nobody=True)(_no_permission)


@case("readonly_data_dir/doctor", root=True, nobody=True)
def _readonly_doctor(base: Path) -> Case:
    d = used_dir(base)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(d)], check=True)
    d.chmod(0o500)
    return Case(dd(d, "doctor"), env_for(base), 1, user="nobody", reports_on_stdout=True,
                says=("FAIL hard_links", "chmod u+rwx", "ok   database"))


# -- HOME that does not exist, no data dir configured -------------------------------------------------
for _cmd in ("list", "run", "doctor"):
    def _no_home(base: Path, cmd: str = _cmd) -> Case:
        home = base / "gone-home"
        env = env_for(base)
        env["HOME"] = str(home)
        args = {"list": ["list"], "run": ["run", "--", "true"], "doctor": ["doctor"]}[cmd]
        return Case(args, env, 2, says=(f"HOME={home}", "--data-dir"), not_created=(home,))
    case(f"home_nonexistent/{_cmd}")(_no_home)


@case("home_nonexistent/run_as_nobody", root=True, nobody=True)
def _no_home_nobody(base: Path) -> Case:
    return Case(["run", "--", "true"], env_for(base, HOME="/nonexistent"), 2, user="nobody",
                says=("HOME=/nonexistent",), not_created=(Path("/nonexistent"),))


# -- a data dir whose parent is a file ----------------------------------------------------------------
for _cmd in ("list", "status", "run", "doctor"):
    def _parent_file(base: Path, cmd: str = _cmd) -> Case:
        (base / "afile").write_text("x")
        args = {"list": ["list"], "status": ["status", MISSING_RUN], "run": ["run", "--", "true"],
                "doctor": ["doctor"]}[cmd]
        return Case(dd(base / "afile" / "data", *args), env_for(base), 1, says=("not a directory",),
                    reports_on_stdout=cmd == "doctor")
    case(f"parent_is_a_file/{_cmd}")(_parent_file)


@case("data_dir_is_a_file/run")
def _dir_is_file(base: Path) -> Case:
    (base / "afile").write_text("x")
    return Case(dd(base / "afile", "run", "--", "true"), env_for(base), 1, says=("is not a directory",))


# -- an unreachable PostgreSQL --------------------------------------------------------------------------
for _cmd in ("doctor", "db upgrade"):
    def _pg_down(base: Path, cmd: str = _cmd) -> Case:
        env = env_for(base, QL_DATABASE_URL="postgresql+psycopg://ql:secret@127.0.0.1:1/none")
        return Case(["--profile", "cluster-worker", *dd(base / "data"), *cmd.split()], env, 1,
                    says=("cannot use the database", "127.0.0.1:1", "server is up"), never_says=("secret",),
                    reports_on_stdout=cmd == "doctor")
    case(f"postgres_unreachable/{_cmd.replace(' ', '_')}")(_pg_down)


# -- the receipts directory or its shards cannot be created -------------------------------------------
def _mount_tmpfs(path: Path, options: str) -> Callable[[], None]:
    path.mkdir(mode=0o700, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount tmpfs: {mounted.stderr.decode().strip()}")
    return lambda: subprocess.run(["umount", "-l", str(path)], check=False)


@case("receipt_shards/enospc", root=True)
def _shards_full(base: Path) -> Case:
    d = used_dir(base)
    import shutil

    shutil.rmtree(d / "receipts")
    umount = _mount_tmpfs(d / "receipts", "size=64k,nr_inodes=8,mode=0700")
    i = 0
    while True:  # use up every inode: a shard directory cannot be made
        try:
            (d / "receipts" / f"f{i}").touch()
        except OSError:
            break
        i += 1
    return Case(dd(d, "run", "--", "true"), env_for(base), 1, says=("No space left on device",),
                cleanup=[umount])


@case("receipt_shards/erofs", root=True)
def _shards_readonly(base: Path) -> Case:
    d = used_dir(base)
    import shutil

    shutil.rmtree(d / "receipts")
    umount = _mount_tmpfs(d / "receipts", "size=64k,mode=0700,ro")
    return Case(dd(d, "run", "--", "true"), env_for(base), 1, says=("Read-only file system",), cleanup=[umount])


@case("receipt_shards/symlinks")
def _shards_symlinked(base: Path) -> Case:
    d = used_dir(base)
    import shutil

    shutil.rmtree(d / "receipts")
    (d / "receipts").mkdir(mode=0o700)
    (base / "elsewhere").mkdir()
    for shard in range(256):
        (d / "receipts" / f"{shard:02x}").symlink_to(base / "elsewhere")
    return Case(dd(d, "run", "--", "true"), env_for(base), 1, says=("symlink",))


for _cmd in ("list", "run"):
    def _receipts_link(base: Path, cmd: str = _cmd) -> Case:
        d = used_dir(base)
        import shutil

        shutil.rmtree(d / "receipts")
        (base / "elsewhere").mkdir()
        (d / "receipts").symlink_to(base / "elsewhere")
        if cmd == "list":  # a reader never needs the receipt store: it may simply answer
            return Case(dd(d, "list"), env_for(base), (0, 1), never_says=("reinstall",))
        return Case(dd(d, "run", "--", "true"), env_for(base), 1, says=("symlink",), never_says=("reinstall",))
    case(f"receipts_dir_symlink/{_cmd}")(_receipts_link)


# -- a damaged database ---------------------------------------------------------------------------------
def _damage(db: Path, tables: tuple[str, ...], how: str) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(conn.execute("SELECT name, rootpage FROM sqlite_master"))
    finally:
        conn.close()
    with open(db, "r+b") as fh:
        for name in tables:
            offset = (roots[name] - 1) * page
            if how == "garbage":
                # Not a b-tree page at all (type byte 0) and its cell pointers point nowhere. The type
                # byte is what makes every read fail: SQLite checks it on each load of the page, while
                # pointers past a small page's end (cell_size_check is off) read whatever memory
                # follows the page and failed a read only most of the time (about 1 run in 8).
                fh.seek(offset)
                fh.write(b"\x00")
                fh.seek(offset + 8)
                fh.write(b"\xff" * 64)
            else:  # one index entry fewer than the table has rows: a silent drop for plain reads
                fh.seek(offset + 3)
                (cells,) = struct.unpack(">H", fh.read(2))
                fh.seek(offset + 3)
                fh.write(struct.pack(">H", cells - 1))


def _damaged_dir(base: Path, how: str) -> tuple[Path, str]:
    d = base / "data"
    seed_data_dir(d, env_for(base), ["true"], ["sh", "-c", "exit 3"], ["true"])
    conn = sqlite3.connect(d / "ql.db")
    (run_id,) = conn.execute("SELECT id FROM ql_run LIMIT 1").fetchone()
    conn.close()
    tables = ("ql_run_attempt", "ql_receipt_journal") if how == "garbage" else ("ix_ql_run_order",)
    _damage(d / "ql.db", tables, how)
    return d, run_id


for _cmd in ("reconcile", "list", "status"):
    def _garbage(base: Path, cmd: str = _cmd) -> Case:
        d, run_id = _damaged_dir(base, "garbage")
        args = {"reconcile": ["reconcile"], "list": ["list"], "status": ["status", run_id]}[cmd]
        return Case(dd(d, *args), env_for(base), 1, says=("damaged", "restore it from a backup"))
    case(f"damaged_database/{_cmd}")(_garbage)

for _how in ("garbage", "index"):
    def _doctor_damage(base: Path, how: str = _how) -> Case:
        d, _run_id = _damaged_dir(base, how)
        return Case(dd(d, "doctor"), env_for(base), 1, reports_on_stdout=True,
                    says=("FAIL database", "is damaged", "restore it from a backup"))
    case(f"damaged_database/doctor_{_how}")(_doctor_damage)


def _undecodable_dir(base: Path) -> tuple[Path, str]:
    """A data dir whose running attempt's ``executor`` text holds bytes that are not UTF-8 (the page
    stays well-formed: SQLite's integrity check passes, every read of the row fails)."""
    d = base / "data"
    seed_data_dir(d, env_for(base), ["true"])
    # Ends on its own (no process outlives the test); its row stays active until something settles it.
    started = ql_proc(dd(d, "--json", "run", "--detach", "--", "sleep", "2"), env_for(base))
    assert started.returncode == 0, started.stderr
    from tests.cli.cli_support import json_lines

    run_id = json_lines(started.stdout)[-1]["run_id"]
    conn = sqlite3.connect(d / "ql.db")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        # The table's leaf pages (small pages: its rows may span several, under an interior root),
        # and its overflow pages (at 512-byte pages most of an attempt's row is in one).
        leaves = [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'ql_run_attempt' "
                                             "AND pagetype IN ('leaf', 'overflow')")]
    finally:
        conn.close()
    damaged = 0
    with open(d / "ql.db", "r+b") as fh:
        for leaf in leaves:
            fh.seek((leaf - 1) * page)
            data = fh.read(page)
            damaged += data.count(b"local")
            fh.seek((leaf - 1) * page)
            fh.write(data.replace(b"local", b"\xffoca\xfe"))  # same length: the record stays well-formed
    assert damaged >= 2  # every attempt's row, the running one's included
    return d, run_id


for _cmd in ("list", "status", "logs", "cancel", "reconcile", "run", "doctor"):
    def _undecodable(base: Path, cmd: str = _cmd) -> Case:
        d, run_id = _undecodable_dir(base)
        args = {"list": ["list"], "status": ["status", run_id], "logs": ["logs", run_id],
                "cancel": ["cancel", run_id], "reconcile": ["reconcile"], "run": ["run", "--", "true"],
                "doctor": ["doctor"]}[cmd]
        says = ("is damaged", "not UTF-8", "restore it from a backup")
        if cmd == "run":  # the new run's rows are fine: it runs; the damage is someone else's row
            return Case(dd(d, *args), env_for(base), 0)
        return Case(dd(d, *args), env_for(base), 1, says=("FAIL database", *says) if cmd == "doctor" else says,
                    never_says=("Could not decode", "\ufffd", "bug"), reports_on_stdout=cmd == "doctor")
    case(f"damaged_text/{_cmd}")(_undecodable)


# -- ql.toml that is not a config file ----------------------------------------------------------------
def _config_case(base: Path, make: Callable[[Path], Path], says: tuple[str, ...]) -> Case:
    path = make(base)
    return Case(["--config", str(path), *dd(base / "data"), "list"], env_for(base), 2, says=says,
                not_created=(base / "data",))


def _write(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(base: Path) -> Path:
        (base / name).write_bytes(data)
        return base / name
    return make


def _fifo(base: Path) -> Path:
    os.mkfifo(base / "ql.toml")
    return base / "ql.toml"


def _link(target: str) -> Callable[[Path], Path]:
    def make(base: Path) -> Path:
        (base / "ql.toml").symlink_to(target)
        return base / "ql.toml"
    return make


CONFIGS: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "binary": (_write("ql.toml", b"\x7fELF\x02\x01\x01\x00\x00\x00binary"), ("binary",)),
    "utf16": (_write("ql.toml", 'profile = "edge"\n'.encode("utf-16")), ("UTF-16",)),
    "latin1": (_write("ql.toml", 'data_dir = "/tmp/caf\xe9"\n'.encode("latin-1")), ("not UTF-8",)),
    "deeply_nested": (_write("ql.toml", b"a = " + b"[" * 200_000 + b"]" * 200_000 + b"\n"), ("too deeply",)),
    "deep_tables": (_write("ql.toml", b"a = " + b"{b = " * 50_000 + b"1" + b"}" * 50_000 + b"\n"),
                    ("too deeply",)),
    "nul_in_data_dir": (_write("ql.toml", b'data_dir = "/tmp/a\\u0000b"\n'), ("NUL",)),
    "fifo": (_fifo, ("not a regular file",)),
    "dev_zero": (lambda base: Path("/dev/zero"), ("not a regular file",)),
    "symlink_to_dev_zero": (_link("/dev/zero"), ("not a regular file",)),
    "directory": (lambda base: base, ("not a regular file",)),
    "huge": (_write("ql.toml", b"# " + b"x" * (2 << 20) + b"\n"), ("bytes, more than",)),
    "missing": (lambda base: base / "nope.toml", ("does not exist",)),
    "not_toml": (_write("ql.toml", b"profile = edge\n"), ("not valid TOML",)),
    "unknown_key": (_write("ql.toml", b'frobnicate = 1\n'), ("unknown key 'frobnicate'",)),
}
for _name, (_make, _says) in CONFIGS.items():
    case(f"config/{_name}")(lambda base, make=_make, says=_says: _config_case(base, make, says))


# -- ./ql.toml that is there but cannot be read: an error, never the built-in defaults ------------------
def _broken_default(kind: str) -> Callable[[Path], None]:
    def make(base: Path) -> None:
        toml = base / "ql.toml"
        if kind == "dangling_symlink":
            toml.symlink_to(base / "real.toml")  # the real config was moved: the link points nowhere
        elif kind == "symlink_loop":
            toml.symlink_to("ql.toml")
        elif kind == "directory":
            toml.mkdir()
        else:
            os.mkfifo(toml)  # opened non-blocking: a FIFO must never hang ql
    return make


BROKEN_DEFAULT = {"dangling_symlink": ("dangling symlink",), "symlink_loop": ("symlink loop",),
                  "directory": ("is a directory",), "fifo": ("is a FIFO",)}
for _kind, _says in BROKEN_DEFAULT.items():
    for _cmd in ("list", "run", "doctor"):
        def _default(base: Path, kind: str = _kind, says: tuple[str, ...] = _says, cmd: str = _cmd) -> Case:
            _broken_default(kind)(base)
            env = env_for(base)
            args = {"list": ["list"], "run": ["run", "--", "true"], "doctor": ["doctor"]}[cmd]
            # With the defaults, run would create ~/.local/state/ql and run the task there (as root).
            return Case(args, env, 2, says=(f"{base}/ql.toml", *says, "never runs with built-in defaults"),
                        cwd=base, not_created=(base / "home" / ".local",), timeout=30)
        case(f"default_config/{_kind}_{_cmd}")(_default)


# -- QL_DATA_DIR=/dev/null: the same exit code, 2, from every command -------------------------------------
DEV_NULL_ARGS = {"run": ["run", "--", "true"], "list": ["list"], "status": ["status", "01a22b46-155c-7d09-872b-21304a383465"],
                 "events": ["events", "01a22b46-155c-7d09-872b-21304a383465"],
                 "logs": ["logs", "01a22b46-155c-7d09-872b-21304a383465"],
                 "cancel": ["cancel", "01a22b46-155c-7d09-872b-21304a383465"], "reconcile": ["reconcile"],
                 "supervise": ["supervise"], "audit": ["audit", "receipts"], "doctor": ["doctor"],
                 "plugins": ["plugins"], "db_upgrade": ["db", "upgrade"]}
for _cmd, _args in DEV_NULL_ARGS.items():
    def _dev_null(base: Path, args: list[str] = _args) -> Case:
        return Case(args, env_for(base, QL_DATA_DIR="/dev/null"), 2, says=("/dev/null", "virtual file system"),
                    never_says=("true",))
    case(f"dev_null_data_dir/{_cmd}")(_dev_null)


# -- a full disk (a 2 MiB tmpfs) and a read-only one -----------------------------------------------------------
def _full_disk_dir(base: Path) -> tuple[Path, Callable[[], None]]:
    d = base / "data"
    umount = _mount_tmpfs(d, "size=2m,mode=0700")
    try:
        seed_data_dir(d, env_for(base))
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)
    except BaseException:
        umount()  # the case never ran: nothing else would unmount it
        raise
    return d, umount


for _cmd in ("run", "list", "reconcile"):
    def _full(base: Path, cmd: str = _cmd) -> Case:
        d, umount = _full_disk_dir(base)
        args = {"run": ["run", "--", "true"], "list": ["list"], "reconcile": ["reconcile"]}[cmd]
        if cmd != "run":
            # A reader, and a round with nothing to write, need no new file: the WAL and its index
            # outlive the writers (no checkpoint on close), so they just read — as on a read-only mount.
            return Case(dd(d, *args), env_for(base), 0, never_says=("disk I/O error", "permissions"),
                        cleanup=[umount])
        return Case(dd(d, *args), env_for(base), 1, says=("is full", "free some space"),
                    never_says=("disk I/O error", "permissions"), cleanup=[umount])
    case(f"full_disk/{_cmd}", root=True)(_full)


def _read_only_dir(base: Path) -> tuple[Path, str, Callable[[], None]]:
    """A used data dir, bind-mounted read-only over itself, and its newest run (found before)."""
    d = used_dir(base)
    run_id = _newest_run(d, base)
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True)
    remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(d)], capture_output=True)
    if remounted.returncode:
        subprocess.run(["umount", "-l", str(d)], check=False)
        pytest.skip(f"cannot remount read-only: {remounted.stderr.decode().strip()}")
    return d, run_id, lambda: subprocess.run(["umount", "-l", str(d)], check=False)


for _cmd in ("list", "status", "run", "reconcile", "db_upgrade"):
    def _read_only(base: Path, cmd: str = _cmd) -> Case:
        d, run_id, umount = _read_only_dir(base)
        if cmd in ("list", "status"):  # a reader just reads
            args = ["list"] if cmd == "list" else ["status", run_id]
            return Case(dd(d, *args), env_for(base), 0, says=("succeeded",), cleanup=[umount])
        args = {"run": ["run", "--", "true"], "reconcile": ["reconcile"], "db_upgrade": ["db", "upgrade"]}[cmd]
        return Case(dd(d, *args), env_for(base), 1, says=("read-only file system", "remount it read-write"),
                    never_says=("owner", "permissions", "unable to open"), cleanup=[umount])
    case(f"read_only_mount/{_cmd}", root=True)(_read_only)


@case("immutable_data_dir/run", root=True)
def _immutable(base: Path) -> Case:
    d = used_dir(base)
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode:
        pytest.skip("chattr +i is not supported here")
    # Even root cannot create a file there; the mode (0700) does not say why.
    return Case(dd(d, "run", "--", "true"), env_for(base), 1, says=("cannot be written", "chattr -i"),
                never_says=("unable to open",),
                cleanup=[lambda: subprocess.run(["chattr", "-i", str(d)], check=False)])


def _newest_run(d: Path, base: Path) -> str:
    from tests.cli.cli_support import json_lines

    return json_lines(ql_proc(dd(d, "--json", "list", "--limit", "1"), env_for(base)).stdout)[0]["run_id"]


# -- a data dir path that is not UTF-8 ------------------------------------------------------------------------
for _cmd in ("doctor", "list", "missing_list"):
    def _non_utf8(base: Path, cmd: str = _cmd) -> Case:
        d = Path(os.fsdecode(os.fsencode(base) + b"/caf\xe9"))
        seed_data_dir(d, env_for(base))
        if cmd == "missing_list":
            # No data dir there: no runs (exit 0), and the one note names the directory.
            return Case(dd(d / "nope", "list"), env_for(base), 0, says=("caf\\xe9",),
                        never_says=("bug", "UnicodeEncodeError", "\udce9"))
        args = ["doctor"] if cmd == "doctor" else ["list"]
        return Case(dd(d, *args), env_for(base), 0, says=("caf\\xe9",) if cmd == "doctor" else (),
                    never_says=("bug", "UnicodeEncodeError", "FAIL"), reports_on_stdout=cmd == "doctor")
    case(f"non_utf8_data_dir/{_cmd}")(_non_utf8)


# -- plugin names that name nothing: refused by every command, before anything is created ------------------
PLUGIN_TABLES = {
    # Ignored before: the task ran as root and doctor said healthy.
    "misspelled_table": (b'[plugin.lcoal]\nrun_as = "nobody"\n', ("[plugin.lcoal]", "did you mean 'local'")),
    "unknown_table": (b"[plugin.nosuch]\n", ("[plugin.nosuch]", "not installed")),
    "misspelled_disable": (b'disable_plugins = ["wachfiles"]\n', ("disable_plugins", "did you mean 'watchfiles'")),
    # Passed doctor (exit 0) while every ql run failed with exit 2.
    "unknown_key": (b"[plugin.local]\nstandbye = true\n", ("[plugin.local]", "'standbye'", "allowed")),
    "bad_value": (b'[plugin.local]\nlauncher = "fast"\n', ("[plugin.local] launcher", "'fast'")),
    "no_such_run_as_user": (b'[plugin.local]\nrun_as = "no-such-user"\n', ("run_as", "no user 'no-such-user'")),
    "file_takes_no_settings": (b"[plugin.file]\nroot = \"/tmp\"\n", ("[plugin.file] takes no settings",)),
}
for _name, (_toml, _says) in PLUGIN_TABLES.items():
    for _cmd in ("run", "list", "doctor", "plugins"):
        def _table(base: Path, toml: bytes = _toml, says: tuple[str, ...] = _says, cmd: str = _cmd) -> Case:
            (base / "ql.toml").write_bytes(toml)
            args = {"run": ["run", "--", "true"], "list": ["list"], "doctor": ["doctor"], "plugins": ["plugins"]}[cmd]
            return Case(dd(base / "data", *args), env_for(base), 2, says=says, cwd=base,
                        not_created=(base / "data",))
        case(f"plugin_config/{_name}_{_cmd}")(_table)

PLUGIN_ENV = {
    # Was "QL_PLUGINS does not allow plugin local": true, but not the mistake.
    "QL_PLUGINS_unknown": ({"QL_PLUGINS": "nosuch"}, ("QL_PLUGINS", "'nosuch'", "not installed"),
                           ("does not allow",)),
    # Was "set executor = ... in <config>": the fix is in the environment.
    "QL_DISABLE_PLUGINS_local": ({"QL_DISABLE_PLUGINS": "local"}, ("remove 'local' from QL_DISABLE_PLUGINS",),
                                 ("set executor",)),
    "QL_DISABLE_PLUGINS_unknown": ({"QL_DISABLE_PLUGINS": "lcoal"}, ("QL_DISABLE_PLUGINS", "did you mean 'local'"),
                                   ()),
}
for _name, (_extra, _says, _never) in PLUGIN_ENV.items():
    def _plugin_env(base: Path, extra: dict[str, str] = _extra, says: tuple[str, ...] = _says,
                    never: tuple[str, ...] = _never) -> Case:
        return Case(dd(base / "data", "run", "--", "true"), env_for(base, **extra), 2, says=says, never_says=never,
                    not_created=(base / "data",))
    case(f"plugin_env/{_name}")(_plugin_env)


@case("plugin_config/unregistered_executor_creates_nothing")
def _unregistered(base: Path) -> Case:
    (base / "ql.toml").write_bytes(b'executor = "nosuch"\n')
    return Case(dd(base / "data", "run", "--", "true"), env_for(base), 2, says=("executor 'nosuch'",), cwd=base,
                not_created=(base / "data",))


def test_an_enabled_plugin_whose_package_is_missing_is_refused_by_every_command(open_tmp: Path) -> None:
    """plugins = ["watchfiles"] without the watchfiles package: 'healthy' and 'active' until ql supervise
    logged it. The package is made unimportable for the real ql process (as if uninstalled)."""
    import sys

    (open_tmp / "ql.toml").write_text('plugins = ["watchfiles"]\n')
    script = ("import sys; sys.modules['watchfiles'] = None; from ql_core.cli.main import main; "
              "raise SystemExit(main(sys.argv[1:]))")
    for args in (["doctor"], ["plugins"], ["list"], ["run", "--", "true"]):
        out = subprocess.run([sys.executable, "-c", script, *dd(open_tmp / "data", *args)], env=env_for(open_tmp),
                             cwd=open_tmp, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in out.stdout + out.stderr
        if args[0] in ("doctor", "plugins"):  # they report it: a failed check, a problem row
            assert out.returncode == 1 and out.stderr == "", (args, out.stdout, out.stderr)
            text = out.stdout
            assert ("FAIL plugins" if args[0] == "doctor" else "problem:") in text, text
            if args[0] == "plugins":  # the row itself says so: not "active"
                assert re.search(r"^watchfiles\s+unavailable\s", text, re.M), text
        else:
            assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, (args, out.stdout, out.stderr)
            text = out.stderr
        assert "watchfiles package is not installed" in text and "pip install" in text, text
    assert not (open_tmp / "data").exists()


@case("env/QL_DEBUG_config_error")
def _debug_config(base: Path) -> Case:
    # QL_DEBUG adds a traceback to internal errors only: an ordinary config error stays one line.
    (base / "ql.toml").write_bytes(b"frobnicate = 1\n")
    return Case(["list"], env_for(base, QL_DEBUG="1"), 2, says=("unknown key 'frobnicate'",), cwd=base)


# -- data dir paths that cannot be data dirs ------------------------------------------------------------
@case("data_dir/component_too_long")
def _long_component(base: Path) -> Case:
    target = base / ("a" * 300)
    return Case(dd(target, "run", "--", "true"), env_for(base), 2, says=("300 bytes", "shorter"),
                not_created=(target,))


@case("data_dir/path_too_long")
def _long_path(base: Path) -> Case:
    target = base.joinpath(*(["b" * 200] * 20))
    return Case(dd(target, "list"), env_for(base), 2, says=("shorter",), not_created=(base / ("b" * 200),))


for _cmd in ("list", "run", "doctor"):
    def _proc(base: Path, cmd: str = _cmd) -> Case:
        args = {"list": ["list"], "run": ["run", "--", "true"], "doctor": ["doctor"]}[cmd]
        # A config error for every command, doctor too (exit 2, one line): no command can use it.
        return Case(dd("/proc/self", *args), env_for(base), 2, says=("virtual file system /proc",))
    case(f"data_dir/proc_self_{_cmd}")(_proc)


@case("data_dir/nul_in_QL_DATA_DIR_file_setting")
def _nul_env(base: Path) -> Case:
    (base / "ql.toml").write_text('data_dir = "rel\\u0000ative"\n')
    return Case(["list"], env_for(base), 2, says=("NUL",), cwd=base)


# -- node_id that is not a node id ------------------------------------------------------------------------
NODE_IDS: dict[str, Callable[[Path], None]] = {
    "fifo": lambda p: os.mkfifo(p),
    "symlink_to_dev_zero": lambda p: p.symlink_to("/dev/zero"),
    "huge": lambda p: p.write_bytes(b"0" * (1 << 20)),
    "garbage": lambda p: p.write_bytes(b"\xff\xfe not an id\n"),
    "directory": lambda p: p.mkdir(),
}
for _name, _make_node in NODE_IDS.items():
    for _cmd in ("list", "run"):
        def _node(base: Path, make=_make_node, cmd: str = _cmd) -> Case:
            d = used_dir(base)
            (d / "node_id").unlink()
            make(d / "node_id")
            args = ["list"] if cmd == "list" else ["run", "--", "true"]
            return Case(dd(d, *args), env_for(base), 1, says=("node",))
        case(f"node_id/{_name}_{_cmd}")(_node)


# -- ql.db that is not a database file (a FIFO must never hang a command) -----------------------------------
for _cmd in ("list", "doctor", "db upgrade", "run", "fresh_run"):
    def _db_fifo(base: Path, cmd: str = _cmd) -> Case:
        if cmd == "fresh_run":
            d = base / "data"
            d.mkdir(mode=0o700)
        else:
            d = used_dir(base)
            for name in ("ql.db", "ql.db-wal", "ql.db-shm"):
                (d / name).unlink(missing_ok=True)
        os.mkfifo(d / "ql.db", 0o600)
        args = {"list": ["list"], "doctor": ["doctor"], "db upgrade": ["db", "upgrade"], "run": ["run", "--", "true"],
                "fresh_run": ["run", "--", "true"]}[cmd]
        says = {"doctor": ("not a regular file",), "db upgrade": ("not a regular file",),
                "fresh_run": ("run database",)}.get(cmd, ("ql.db",))
        return Case(dd(d, *args), env_for(base), 1, says=says, reports_on_stdout=cmd == "doctor", timeout=20)
    case(f"ql_db_fifo/{_cmd.replace(' ', '_')}")(_db_fifo)


# -- environment and standard streams ---------------------------------------------------------------------
@case("env/QL_LOG_LEVEL_bogus")
def _log_level(base: Path) -> Case:
    return Case(dd(used_dir(base), "list"), env_for(base, QL_LOG_LEVEL="BOGUS"), 2, says=("QL_LOG_LEVEL",))


@case("env/QL_PROFILE_unknown")
def _profile(base: Path) -> Case:
    return Case(dd(base / "data", "list"), env_for(base, QL_PROFILE="edgy"), 2, says=("edgy", "standalone"))


for _cmd, _rc in (("run", 3), ("list", 0), ("status", 1), ("doctor", 0), ("events", 1)):
    def _closed(base: Path, cmd: str = _cmd, rc: int = _rc) -> Case:
        d = used_dir(base)
        args = {"run": ["run", "--", "sh", "-c", "echo out; exit 3"], "list": ["list"],
                "status": ["status", MISSING_RUN], "doctor": ["doctor"], "events": ["events", MISSING_RUN]}[cmd]
        return Case(dd(d, *args), env_for(base), rc, close_stdout=True)
    case(f"stdout_closed/{_cmd}")(_closed)


@case("cwd_removed/list")
def _cwd_gone(base: Path) -> Case:
    gone = base / "gone"
    gone.mkdir()
    return Case(dd(used_dir(base), "list"), env_for(base), 0, cwd=gone)


# -- usage -----------------------------------------------------------------------------------------------------
USAGE: dict[str, list[str]] = {
    "unknown_command": ["frobnicate"],
    "run_nothing": ["run"],
    "run_timeout_nan": ["run", "--timeout", "nan", "--", "true"],
    "run_timeout_negative": ["run", "--timeout", "-1", "--", "true"],
    "logs_offset_text": ["logs", MISSING_RUN, "--offset", "abc"],
    "list_limit_zero": ["list", "--limit", "0"],
    "list_status_bogus": ["list", "--status", "finished"],
    "audit_shard_bogus": ["audit", "receipts", "--shard", "zz"],
    "supervise_interval_zero": ["supervise", "--interval", "0"],
}
for _name, _args in USAGE.items():
    def _usage(base: Path, args: list[str] = _args, name: str = _name) -> Case:
        d = used_dir(base) if name.startswith(("list", "audit")) else base / "data"
        return Case(dd(d, *args), env_for(base), 2)
    case(f"usage/{_name}")(_usage)


# -------------------------------------------------------------------------------------------------------------
def _params() -> list:
    out = []
    for name in CASES:
        marks = []
        if name in NEEDS_ROOT:
            marks.append(pytest.mark.root)
        if name in XFAIL:
            marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[name]))
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _run_case(c: Case) -> subprocess.CompletedProcess[str]:
    if c.cwd is not None and c.cwd.name == "gone":
        # Remove the working directory under the command: `cd` into it, remove it, then exec.
        import shlex

        from tests.conftest import QL

        script = f"cd {shlex.quote(str(c.cwd))} && rmdir {shlex.quote(str(c.cwd))} && exec " + \
            " ".join(shlex.quote(a) for a in [*QL, *c.args])
        return subprocess.run(["sh", "-c", script], env=c.env, capture_output=True, text=True, timeout=60)
    return ql_proc(c.args, c.env, user=c.user, close_stdout=c.close_stdout, cwd=c.cwd, timeout=c.timeout)


@pytest.mark.parametrize("name", _params())
def test_no_traceback(name: str, open_tmp: Path) -> None:
    if name in NEEDS_ROOT and os.geteuid() != 0:
        pytest.skip("needs root")
    if name in NEEDS_NOBODY and not can_switch_user():
        pytest.skip("needs root and setpriv to run as nobody")
    if name in NEEDS_NOBODY:
        open_tmp.chmod(0o755)
    c = CASES[name](open_tmp)
    try:
        out = _run_case(c)
    finally:
        for undo in c.cleanup:
            undo()
    both = out.stdout + out.stderr
    assert "Traceback" not in both and 'File "' not in both, both
    expected = c.rc if isinstance(c.rc, tuple) else (c.rc,)
    assert out.returncode in expected, (out.returncode, out.stdout[-2000:], out.stderr)
    lines = out.stderr.splitlines()
    if c.reports_on_stdout or out.returncode == 0 or (c.close_stdout and c.args[2:3] == ["run"]):
        assert len(lines) <= 1, out.stderr
        text = out.stdout + out.stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("ql"), out.stderr
        assert "error" in lines[0]
        text = lines[0]
    for needle in c.says:
        assert needle.lower() in text.lower(), (needle, text[-2000:])
    for needle in c.never_says:
        assert needle.lower() not in text.lower(), (needle, text[-2000:])
    for path in c.not_created:
        assert not os.path.lexists(path), f"{path} was created"


def test_corpus_is_complete() -> None:
    """Every input the issue lists has at least one case here."""
    wanted = ["foreign_data_dir/list", "foreign_data_dir/status", "foreign_data_dir/run", "foreign_data_dir/doctor",
              "unreadable_data_dir/list", "home_nonexistent/list", "parent_is_a_file/run",
              "postgres_unreachable/doctor", "postgres_unreachable/db_upgrade", "readonly_data_dir/doctor",
              "receipt_shards/enospc", "receipt_shards/erofs", "receipt_shards/symlinks",
              "damaged_database/reconcile", "damaged_database/doctor_index", "config/binary", "config/utf16",
              "config/deeply_nested", "config/nul_in_data_dir", "data_dir/component_too_long",
              "data_dir/proc_self_list", "env/QL_LOG_LEVEL_bogus", "stdout_closed/run", "config/fifo",
              "config/dev_zero", "node_id/fifo_list", "ql_db_fifo/doctor",
              "default_config/dangling_symlink_run", "default_config/symlink_loop_run", "default_config/directory_run",
              "default_config/fifo_run", "full_disk/run", "full_disk/list", "read_only_mount/list",
              "read_only_mount/run", "damaged_text/reconcile", "damaged_text/doctor", "non_utf8_data_dir/doctor",
              *(f"dev_null_data_dir/{cmd}" for cmd in DEV_NULL_ARGS)]
    assert [w for w in wanted if w not in CASES] == []
    assert len(CASES) >= 80


# -- inputs whose fix was in the core ---------------------------------------------------------------
def test_write_locked_database_while_the_deadline_passes_still_times_out(open_tmp: Path) -> None:
    import time

    env = env_for(open_tmp)
    d = used_dir(open_tmp)
    config = open_tmp / "ql.toml"
    config.write_text("[limits]\nbusy_timeout_ms = 200\ncompletion_retries = 2\n")
    from tests.conftest import QL

    started = open_tmp / "started"
    host = subprocess.Popen([*QL, "--config", str(config),
                             *dd(d, "run", "--timeout", "1", "--", "sh", "-c", f'touch "{started}"; sleep 6')],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the task runs: its handle is committed (locking before would fail the start)
        lock = sqlite3.connect(d / "ql.db", isolation_level=None, timeout=10)
        lock.execute("BEGIN EXCLUSIVE")  # held across the deadline
        time.sleep(3)
        lock.execute("COMMIT")
        lock.close()
        _out, err = host.communicate(timeout=60)
    finally:
        if host.poll() is None:
            host.kill()
    assert "Traceback" not in err
    assert host.returncode == 124, err


def test_a_receipt_shard_that_cannot_be_created_ends_the_run_saying_nothing_ran(open_tmp: Path) -> None:
    c = CASES["receipt_shards/symlinks"](open_tmp)
    out = _run_case(c)
    assert out.returncode == 1 and "nothing ran" in out.stderr, out.stderr
    d = Path(c.args[1])
    from tests.cli.cli_support import json_lines

    newest = json_lines(ql_proc(dd(d, "--json", "list", "--limit", "1"), c.env).stdout)[0]
    assert newest["status"] in ("failed", "lost") and newest["reason"], newest
