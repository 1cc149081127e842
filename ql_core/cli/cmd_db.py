"""``ql db``: database maintenance.

- ``ql db upgrade``: apply the schema migrations (also applied by every writing command);
- the actions plugins register (``ql_register_commands`` with ``"db <action>"``): the cluster plugin's
  ``ql db grant-worker ROLE`` and ``ql db new-spec-key PATH``.
"""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = ("database maintenance: `ql db upgrade` applies the migrations; cluster: `ql db grant-worker ROLE`, "
        "`ql db new-spec-key PATH`")


def _actions() -> dict[str, object]:
    """Action name -> module, of the actions plugins add (``register("db <action>", ...)``)."""
    from ql_core.plugins import plugin_commands

    listed = plugin_commands(reserved=("db upgrade",))
    return {name.split(" ", 1)[1]: command.load() for name, command in sorted(listed.commands.items())
            if name.startswith("db ")}


def configure(parser: argparse.ArgumentParser) -> None:
    actions = _actions()
    parser.set_defaults(db_actions=actions)
    helps = "; ".join(getattr(module, "HELP", name) for name, module in actions.items())
    parser.add_argument("action", choices=["upgrade", *actions],
                        help="upgrade: migrate the schema to head" + (f"; {helps}" if helps else ""))
    targets = " or ".join(f"the {getattr(m, 'TARGET', 'ARG')} ({n})" for n, m in actions.items())
    parser.add_argument("target", nargs="?", help=targets or "(none)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.errors import UsageError

    if args.action == "upgrade":
        if args.target is not None:
            raise UsageError("`ql db upgrade` takes no argument")
        return _upgrade(args, out)
    module = args.db_actions[args.action]
    if args.target is None:
        what = getattr(module, "TARGET", "ARG")
        raise UsageError(f"`ql db {args.action}` needs a {what}: ql db {args.action} {what}")
    return int(module.run(args, args.target, out))  # type: ignore[attr-defined]


def _upgrade(args: argparse.Namespace, out: Output) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from ql_core.cli.common import config_from_args, database_failure
    from ql_core.db.migrate import current_revision, upgrade
    from ql_core.errors import DatabaseError
    from ql_core.paths import ensure_data_dir

    config = config_from_args(args)
    if config.is_sqlite:
        ensure_data_dir(config.data_dir)
        _create_private(config.database_url)
    engine = short_engine(config.database_url)
    try:
        before = current_revision(engine)
        head = upgrade(engine)
    except SQLAlchemyError as exc:
        raise DatabaseError(database_failure(exc, config.database_url)) from None
    finally:
        engine.dispose()
    out.emit({"from_revision": before, "revision": head},
             f"schema at {head}" + ("" if before == head else f" (was {before or 'empty'})"))
    return 0


#: Seconds a command waits for a PostgreSQL server to answer before it says it is unreachable.
CONNECT_TIMEOUT_S = 10


def short_engine(url: str):  # type: ignore[no-untyped-def]
    """A one-shot SQLAlchemy engine for maintenance commands (NullPool; bounded connect time)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    if url.startswith("postgresql"):
        from ql_core.db.engine import postgres_engine

        return postgres_engine(url, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    return create_engine(url, poolclass=NullPool)


def _create_private(url: str) -> None:
    """Create the SQLite file 0600 before SQLAlchemy does (it would follow the umask, often 0644)."""
    import os

    from urllib.parse import unquote

    from ql_core.errors import DataDirError, explain_os_error

    path = os.path.abspath(unquote(url[len("sqlite:///"):]))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        import stat

        if not stat.S_ISREG(os.stat(path).st_mode):  # SQLite would block on a FIFO forever
            raise DataDirError(f"{path} is not a regular file (a FIFO, device or directory); move it aside "
                               f"and restore ql.db from a backup") from None
        return
    except OSError as exc:
        raise DataDirError(explain_os_error(exc, "cannot create the run database", path)) from None
    os.close(fd)
