"""``ql doctor``: can this data dir keep ql's promises? (hard links, O_APPEND, fsync, modes, schema)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import Callable

from ql_core.cli.output import Output

HELP = ("show the effective config and check it: plugins, the data dir's file system (hard links, O_APPEND, "
        "fsync, permissions) and the schema")


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


def _check_modes(data_dir: Path) -> str:
    loose = []
    for path in [data_dir, *(data_dir / d for d in ("logs", "receipts")) ]:
        if path.exists():
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode & 0o077:
                loose.append(f"{path} is {mode:o}")
    if loose:
        raise AssertionError("; ".join(loose) + " (expected 0700: chmod 700 it)")
    return "data dir, logs and receipts are 0700"


def mask_url(url: str) -> str:
    """``scheme://user:secret@host/db`` -> ``scheme://user:***@host/db`` (never print a password)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable database_url>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


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
        "plugins": list(select_plugin_names(config.plugins)),
        "disabled_plugins": list(config.disabled_plugins),
        "limits": {name: getattr(config.profile, name) for name in config.profile.limit_names()},
    }


def _check_plugins(config) -> str:  # type: ignore[no-untyped-def]
    """Load the configured plugins and resolve every selected seam by name (nothing is opened)."""
    from ql_core.plugins import explain_unregistered, load_plugin_host

    host = load_plugin_host(config.plugins, optional=config.seam_plugins, use_cache=False)
    chosen = []
    for key, registry in (("executor", host.executors), ("receipt_store", host.receipt_stores),
                          ("journal", host.journal_backends)):
        name = getattr(config, key)
        if name is None:
            continue
        if name not in registry.names():
            raise AssertionError(explain_unregistered(key, name, config, host))
        chosen.append(f"{key}={name}")
    return f"loaded {', '.join(host.loaded) or 'none'}; selected {', '.join(chosen)}"


def run(args: argparse.Namespace, out: Output) -> int:
    import shutil
    import tempfile

    from ql_core.cli.common import config_from_args
    from ql_core.paths import ensure_data_dir

    config = config_from_args(args)
    shown = effective_config(config)
    text = [f"config   {shown['source']} (profile {shown['profile']})",
            f"data dir {shown['data_dir']}", f"database {shown['database_url']}",
            f"seams    executor={shown['executor']} receipt_store={shown['receipt_store']} "
            f"journal={shown['journal']}",
            f"plugins  {', '.join(shown['plugins']) or 'none'}"
            + (f" (disabled: {', '.join(shown['disabled_plugins'])})" if shown["disabled_plugins"] else ""),
            "limits   " + " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in shown["limits"].items())]
    out.emit({"config": shown}, "\n".join(text))
    data_dir = ensure_data_dir(config.data_dir)
    probe = Path(tempfile.mkdtemp(prefix=".doctor-", dir=data_dir))
    checks: list[tuple[str, Callable[[], str]]] = [
        ("plugins", lambda: _check_plugins(config)),
        ("hard_links", lambda: _check_hard_links(probe)),
        ("o_append", lambda: _check_append(probe)),
        ("fsync", lambda: _check_fsync(probe)),
        ("permissions", lambda: _check_modes(data_dir)),
        ("schema", lambda: _check_schema(config)),
    ]
    failed = 0
    try:
        for name, check in checks:
            try:
                detail, ok = check(), True
            except (AssertionError, OSError) as exc:
                detail, ok = str(exc) or type(exc).__name__, False
            except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
                from ql_core.errors import QlError

                if not isinstance(exc, QlError):
                    raise
                detail, ok = str(exc), False
            failed += not ok
            out.emit({"check": name, "status": "ok" if ok else "failed", "detail": detail},
                     f"{'ok  ' if ok else 'FAIL'} {name:<12} {detail}")
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    out.emit({"status": "ok" if not failed else "failed", "data_dir": str(data_dir), "profile": config.profile.name},
             f"data dir {data_dir} (profile {config.profile.name}): " + ("healthy" if not failed else f"{failed} check(s) failed"))
    return 0 if not failed else 1


def _check_schema(config) -> str:  # type: ignore[no-untyped-def]
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ql_core.db.migrate import current_revision, head_revision

    if config.is_sqlite and not os.path.exists(config.database_url[len("sqlite:///"):]):
        return "no database yet; the schema is created on first start or by `ql db upgrade`"
    engine = create_engine(config.database_url, poolclass=NullPool)
    try:
        current = current_revision(engine)
    finally:
        engine.dispose()
    head = head_revision()
    if current == head:
        return f"schema at {head}"
    if current is None:
        return f"database empty; the schema ({head}) is created on first start or by `ql db upgrade`"
    from alembic.script import ScriptDirectory

    from ql_core.db.migrate import _alembic_config

    known = {rev.revision for rev in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}
    if current not in known:
        raise AssertionError(f"schema at {current}, which this ql ({head}) does not know: "
                             f"the database was migrated by a newer ql; upgrade ql")
    return f"schema at {current}, behind {head}: migrated on next start or by `ql db upgrade`"
