"""``ql doctor``: can this data dir keep ql's promises? (owner, modes, hard links, O_APPEND, fsync,
the database's integrity and schema, the plugins).

Doctor never creates the data dir or the database and never migrates: it
reports. A missing data dir is a failed check (a mistyped ``--data-dir``
must not be created); the file-system checks then run in its nearest existing
parent, which tells whether the directory could be created there. Every check
that cannot run is a failed check with one line saying why — never a traceback.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import Callable

from ql_core.cli.common import mask_url  # noqa: F401 - part of this module's API (tests use it)
from ql_core.cli.output import Output

HELP = ("show the effective config and check it: plugins, the data dir's file system (owner, permissions, "
        "hard links, O_APPEND, fsync), the database's integrity and schema")
EPILOG = ("Nothing is created, migrated or repaired. --json prints the effective config, one object per "
          "check ({\"check\", \"result\": ok|failed|skipped|info, \"detail\"}), then a summary "
          "({\"healthy\", \"checks\", \"data_dir\", \"profile\"}).")

#: The checks, in the order they run and print; the loaded plugins' own (``ql_doctor_checks``: the
#: local executor's ``launcher``) follow them.
CHECKS = ("plugins", "data_dir", "owner", "permissions", "hard_links", "o_append", "fsync", "database", "schema")


class _Skip(Exception):
    """A check that does not apply here (its detail says why)."""


class _Info(Exception):
    """Not a failure, but worth a line (a data dir not created yet on a fresh machine)."""


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def _check_hard_links(probe: Path) -> str:
    a, b = probe / "a", probe / "b"
    a.write_bytes(b"x")
    os.link(a, b)
    try:
        os.link(a, b)
        raise AssertionError("link() overwrote an existing name")
    except FileExistsError:
        pass
    if os.stat(a).st_nlink != 2:
        raise AssertionError("link count did not reach 2")
    return "link() publishes without overwriting"


def _check_append(probe: Path) -> str:
    path = probe / "append"
    fds = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for _ in range(2)]
    try:
        for fd in fds:
            os.write(fd, b"12345")
    finally:
        for fd in fds:
            os.close(fd)
    if path.read_bytes() != b"1234512345":
        raise AssertionError("two O_APPEND writers overwrote each other")
    return "two appenders interleave without loss"


def _check_fsync(probe: Path) -> str:
    fd = os.open(probe / "sync", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x")
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return "file and directory fsync work"


def _check_modes(data_dir: Path, database: Path | None) -> str:
    loose = []
    for path in [data_dir, *(data_dir / d for d in ("logs", "receipts"))]:
        if os.path.lexists(path):
            st = os.lstat(path)
            if path != data_dir and not stat.S_ISDIR(st.st_mode):
                loose.append(f"{path} is a symlink or file, not a directory (ql refuses it: remove it; "
                             f"ql recreates it empty)")
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077:
                loose.append(f"{path} is {mode:o} (expected 0700: chmod 700 it)")
    if database is not None and database.exists():
        mode = stat.S_IMODE(os.lstat(database).st_mode)
        if mode & 0o077:
            loose.append(f"{database} is {mode:o} (expected 0600: chmod 600 it)")
    if loose:
        raise AssertionError("; ".join(loose))
    return "data dir, logs and receipts are 0700" + (", the database 0600" if database is not None else "")


def _check_owner(data_dir: Path) -> str:
    from ql_core.errors import owner_of

    st = os.stat(data_dir)
    if st.st_uid != os.geteuid():
        raise AssertionError(f"{data_dir} belongs to {owner_of(data_dir)}, not to you (uid {os.geteuid()}): run ql "
                             f"as its owner, or use a data dir of your own")
    node_id = data_dir / "node_id"
    from ql_core.paths import read_node_id

    found = read_node_id(data_dir)
    return f"owned by you (uid {st.st_uid}); " + (f"node id {found}" if found else
                                                 f"no {node_id.name} yet (nothing has run here)")


def effective_config(config) -> dict:  # type: ignore[no-untyped-def]
    """Everything in force: where it came from, the profile, every limit, the seams, the plugins."""
    from ql_core.plugins import select_plugin_names

    return {
        "source": config.source,
        "profile": config.profile.name,
        "data_dir": str(config.data_dir),
        "database_url": mask_url(config.database_url),
        "executor": config.executor,
        "receipt_store": config.receipt_store,
        "journal": config.journal,
        "artifact_store": config.artifact_store,
        "plugins": list(select_plugin_names(config.plugins)),
        "disabled_plugins": list(config.disabled_plugins),
        # Only what this profile uses: the cluster numbers only on the cluster profiles.
        "limits": {name: getattr(config.profile, name) for name in config.profile.limits_in_force()},
    }


#: A settings key whose value doctor never prints (whatever the plugin answered).
_SECRET_WORDS = ("password", "secret", "token", "passphrase", "credential")


def _redact(key: str, value: object) -> object:
    lowered = key.lower()
    if any(word in lowered for word in _SECRET_WORDS) and not lowered.endswith(("_file", "_path")):
        return "***"
    return value


def plugin_settings(config, host) -> dict[str, dict[str, object]]:  # type: ignore[no-untyped-def]
    """``{plugin: {key: value}}`` in force: each loaded plugin's ``ql_effective_settings`` (defaults
    filled in), else its ``[plugin.<name>]`` table as written; secrets masked either way."""
    found: dict[str, dict[str, object]] = {}
    answered: set[str] = set()
    for impl in host.pm.hook.ql_effective_settings.get_hookimpls():
        answered.add(impl.plugin_name)
        try:
            answer = impl.function(config=config)
        except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
            found[impl.plugin_name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        if answer:
            found[impl.plugin_name] = {str(k): _redact(str(k), v) for k, v in dict(answer).items()}
    for name, table in config.plugin_settings.items():
        if name not in answered:
            found[name] = {str(k): _redact(str(k), v) for k, v in table.items()}
    return dict(sorted(found.items()))


def human_number(value: object) -> str:
    """A limit as a person reads it: ``2592000``, ``0.05``, never ``2.592e+06``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def _human_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return ""


def _limit_text(name: str, value: object) -> str:
    """``history_retention_s=2592000 (30d)``: the exact number, and a duration of whole days,
    hours or minutes when it is one."""
    text = f"{name}={human_number(value)}"
    if name.endswith("_s") and isinstance(value, (int, float)) and value >= 60:
        extra = _human_duration(float(value))
        if extra:
            text += f" ({extra})"
    return text


def _settings_host(config):  # type: ignore[no-untyped-def]
    """The plugins of this config, loaded to ask their settings (None: they cannot load; the plugins
    check says why)."""
    from ql_core.plugins import load_plugin_host

    try:
        return load_plugin_host(config.plugins, optional=[*config.seam_plugins, *config.plugin_settings],
                                use_cache=False)
    except Exception:  # noqa: BLE001 - reported by the plugins check
        return None


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        import json

        return json.dumps(value)
    if isinstance(value, (int, float)):
        return human_number(value)
    return str(value)


def _check_plugins(config, hosts: list | None = None) -> str:  # type: ignore[no-untyped-def]
    """Load the configured plugins and resolve every selected seam by name (nothing is opened);
    the loaded host is appended to ``hosts`` (the plugins' own checks run on it)."""
    from ql_core.errors import PluginError
    from ql_core.plugins import check_plugin_config, require_selected_seams

    host = check_plugin_config(config, use_cache=False)  # each plugin also checks what it needs
    if hosts is not None:
        hosts.append(host)
    try:
        chosen = require_selected_seams(config, host)
    except PluginError as exc:
        raise AssertionError(str(exc)) from None
    return f"loaded {', '.join(host.loaded) or 'none'}; selected {', '.join(chosen)}"


def _sqlite_file(config) -> Path | None:  # type: ignore[no-untyped-def]
    from urllib.parse import unquote

    if not config.is_sqlite or not config.database_url.startswith("sqlite:///"):
        return None
    return Path(os.path.abspath(unquote(config.database_url[len("sqlite:///"):])))


def _nearest_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current.parent != current:
        current = current.parent
    return current


class _Probe:
    """A private temp dir for the file-system checks, made lazily, removed at the end."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self._path: Path | None = None
        self._error: str | None = None

    def path(self) -> Path:
        import tempfile

        from ql_core.errors import explain_os_error

        if self._error is not None:
            raise AssertionError(self._error)
        if self._path is None:
            try:
                self._path = Path(tempfile.mkdtemp(prefix=".doctor-", dir=self.where))
            except OSError as exc:
                self._error = explain_os_error(exc, "cannot create files in", self.where)
                raise AssertionError(self._error) from None
        return self._path

    def remove(self) -> None:
        import shutil

        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import config_from_args, printable
    from ql_core.cli.main import classify

    config = config_from_args(args, reports_plugins=True)
    shown = effective_config(config)
    text = [f"config   {shown['source']} (profile {shown['profile']})",
            f"data dir {shown['data_dir']}", f"database {shown['database_url']}",
            f"seams    executor={shown['executor']} receipt_store={shown['receipt_store']} "
            f"journal={shown['journal']}"
            + (f" artifact_store={shown['artifact_store']}" if shown["artifact_store"] else ""),
            f"plugins  {', '.join(shown['plugins']) or 'none'}"
            + (f" (disabled: {', '.join(shown['disabled_plugins'])})" if shown["disabled_plugins"] else ""),
            "limits   " + ", ".join(_limit_text(k, v) for k, v in shown["limits"].items())]
    settings_host = _settings_host(config)
    if settings_host is not None:
        shown["plugin_settings"] = plugin_settings(config, settings_host)
        for name, table in shown["plugin_settings"].items():
            text.append(f"plugin.{name:<7} " + (" ".join(f"{k}={_toml_value(v)}" for k, v in table.items())
                                              or "(no settings)"))
    out.emit({"config": shown}, "\n".join(text))

    data_dir = Path(os.path.abspath(config.data_dir))
    database = _sqlite_file(config)
    #: "ok", "missing" (never created: a typo, or nothing ran yet) or "unusable" (cannot be read).
    state = {"dir": "unusable"}

    def check_data_dir() -> str:
        from ql_core.errors import NotFoundError, explain_os_error
        from ql_core.paths import existing_data_dir

        try:
            real = existing_data_dir(data_dir)  # never creates anything
        except NotFoundError:
            state["dir"] = "missing"
            if config.data_dir_default or _nearest_existing(data_dir) == data_dir.parent:
                # A fresh machine (or a new data dir in an existing directory): nothing has run yet,
                # which is no failure. A named data dir under a missing directory is likely a typo.
                raise _Info(f"no ql data dir at {data_dir} yet: nothing has run here; the first writing "
                            f"command (ql run) creates it") from None
            raise
        try:
            os.listdir(real)
        except OSError as exc:
            raise AssertionError(explain_os_error(exc, "cannot read the data dir", real)) from None
        state["dir"] = "ok"
        return f"{real} exists and is readable"

    probe = _Probe(data_dir)

    def skip_unless_dir() -> None:
        if state["dir"] == "missing":
            raise _Skip("the data dir does not exist")
        if state["dir"] != "ok":
            raise _Skip("the data dir cannot be used (see data_dir)")

    def fs(check: Callable[[Path], str]) -> Callable[[], str]:
        def wrapped() -> str:
            if state["dir"] == "missing":
                # Could it be created here? Probe where `ql run` would create it.
                probe.where = _nearest_existing(data_dir)
                detail = check(probe.path())
                return f"{detail} (in {probe.where}, the data dir's nearest existing parent)"
            skip_unless_dir()
            return check(probe.path())
        return wrapped

    def needs_dir(check: Callable[[], str]) -> Callable[[], str]:
        def wrapped() -> str:
            skip_unless_dir()
            return check()
        return wrapped

    hosts: list = []  # type: ignore[type-arg]
    checks: list[tuple[str, Callable[[], str]]] = [
        ("plugins", lambda: _check_plugins(config, hosts)),
        ("data_dir", check_data_dir),
        ("owner", needs_dir(lambda: _check_owner(data_dir))),
        ("permissions", needs_dir(lambda: _check_modes(data_dir, database))),
        ("hard_links", fs(_check_hard_links)),
        ("o_append", fs(_check_append)),
        ("fsync", fs(_check_fsync)),
        ("database", lambda: _check_database(config, database, skip_unless_dir)),
        ("schema", lambda: _check_schema(config, database, skip_unless_dir)),
    ]
    results: dict[str, str] = {}

    def report(name: str, result: str, detail: str) -> None:
        detail = " ".join(detail.split())
        results[name] = result
        label = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip", "info": "info"}[result]
        out.emit({"check": name, "result": result, "detail": detail}, f"{label} {name:<12} {printable(detail)}")

    try:
        for name, check in checks:
            try:
                detail, result = check(), "ok"
            except _Skip as exc:
                detail, result = str(exc), "skipped"
            except _Info as exc:
                detail, result = str(exc), "info"
            except AssertionError as exc:
                detail, result = str(exc) or type(exc).__name__, "failed"
            except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
                detail, result = classify(exc, "doctor")[1], "failed"
            report(name, result, detail)
    finally:
        probe.remove()
    for host in hosts:
        for name, result, detail in _plugin_checks(config, host, taken=set(results)):
            report(name, result, detail)
    failed = sum(1 for r in results.values() if r == "failed")
    out.emit({"healthy": not failed, "checks": results, "data_dir": str(data_dir), "profile": config.profile.name},
             f"data dir {data_dir} (profile {config.profile.name}): "
             + ("healthy" if not failed else f"{failed} check(s) failed"))
    return 0 if not failed else 1


def _plugin_checks(config, host, taken: set[str]) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    """Each loaded plugin's ``ql_doctor_checks`` as ``(name, result, detail)``: one that raises or
    answers in another shape is a failed check named after the plugin; a name already taken gets
    the plugin's name in front."""
    found: list[tuple[str, str, str]] = []
    for impl in host.pm.hook.ql_doctor_checks.get_hookimpls():
        plugin = impl.plugin_name
        try:
            answers = list(impl.function(config=config) or ())
            checked = [(str(name), "ok" if ok else "failed", str(detail)) for name, ok, detail in answers]
        except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
            why = (f"plugin {plugin!r} failed its doctor checks: {type(exc).__name__}: {exc}; fix or reinstall the "
                   f"package that provides it")
            found.append((plugin, "failed", why))
            continue
        for name, result, detail in checked:
            if name in taken:
                name = f"{plugin}.{name}"
            taken.add(name)
            found.append((name, result, detail))
    return found


_HEALTH: dict[Path, object] = {}


def _health(database: Path):  # type: ignore[no-untyped-def]
    """The integrity check's result, run once per command (it reads the whole file)."""
    from ql_core.db.integrity import check_sqlite

    if database not in _HEALTH:
        _HEALTH[database] = check_sqlite(database)
    return _HEALTH[database]


def _check_database(config, database: Path | None, skip_unless_dir: Callable[[], None]) -> str:  # type: ignore[no-untyped-def]
    """SQLite: the file's own integrity check, read-only. PostgreSQL: reachable (schema check)."""
    import sqlite3

    if database is None:
        raise _Skip("not a SQLite run database (the schema check connects to it)")
    skip_unless_dir()
    if not database.exists():
        from ql_core.paths import read_node_id

        if read_node_id(database.parent) is not None:
            raise AssertionError(f"{database} is missing, but this data dir was used (it has a node_id): the run "
                                 f"history is gone; restore ql.db from a backup (docs/recovery.md)")
        raise _Skip(f"no database yet ({database.name} is created by the first writing command)")
    kind = os.stat(database).st_mode
    if not stat.S_ISREG(kind):
        raise AssertionError(f"{database} is not a regular file (a FIFO, device or directory): it is not a run "
                             f"database; move it aside and restore ql.db from a backup (docs/recovery.md)")
    try:
        health = _health(database)
    except (sqlite3.Error, OSError) as exc:
        from ql_core.db.integrity import explain_sqlite_error

        raise AssertionError(explain_sqlite_error(exc, database) or
                             f"cannot read {database}: {exc}; if it is damaged, restore it from a backup "
                             f"(docs/recovery.md)") from None
    if not health.ok:
        raise AssertionError(f"{database} is damaged ({health.check}: {'; '.join(health.problems)[:300]}); stop "
                             f"every ql process, move it aside and restore it from a backup (docs/recovery.md)")
    return f"{health.check} ok ({database.stat().st_size} bytes)"


def _check_schema(config, database: Path | None, skip_unless_dir: Callable[[], None]) -> str:  # type: ignore[no-untyped-def]
    from ql_core.db.migrate import SCHEMA_HEAD

    head = SCHEMA_HEAD
    if database is not None:
        skip_unless_dir()
        if not database.exists():
            raise _Skip("no database yet")
        if not stat.S_ISREG(os.stat(database).st_mode):
            raise _Skip("the database is not a regular file (see the database check)")
        health = _health(database)
        if not health.ok:
            raise _Skip("the database is damaged (see the database check)")
        current = health.revision
    else:
        from sqlalchemy.exc import SQLAlchemyError

        from ql_core.cli.cmd_db import short_engine
        from ql_core.cli.common import database_failure
        from ql_core.db.migrate import current_revision

        engine = short_engine(config.database_url)
        try:
            current = current_revision(engine)
        except SQLAlchemyError as exc:
            raise AssertionError(database_failure(exc, config.database_url)) from None
        finally:
            engine.dispose()
    if current == head:
        return f"schema at {head}"
    if current is None:
        return f"database empty; the schema ({head}) is created on first start or by `ql db upgrade`"
    from alembic.script import ScriptDirectory

    from ql_core.db.migrate import alembic_config

    known = {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if current not in known:
        raise AssertionError(f"schema at {current}, which this ql ({head}) does not know: "
                             f"the database was migrated by a newer ql; upgrade ql")
    return f"schema at {current}, behind {head}: migrated on next start or by `ql db upgrade`"
