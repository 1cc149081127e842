"""``ql db``: database maintenance.

- ``ql db upgrade``: apply the schema migrations (also applied by every writing command);
- ``ql db grant-worker ROLE``: on the cluster's control database (run as its admin), set ``ROLE`` up
  as a least-privilege worker role (ql_plugins/cluster_fenced/roles.py; idempotent);
- ``ql db new-spec-key PATH``: create a task-spec key file (32 random bytes, 0600, never replacing
  a file); prints its key id only.
"""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = ("database maintenance: `ql db upgrade` applies the migrations; cluster: `ql db grant-worker ROLE`, "
        "`ql db new-spec-key PATH`")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade", "grant-worker", "new-spec-key"],
                        help="upgrade: migrate the schema to head; grant-worker ROLE: make ROLE a least-privilege "
                             "cluster worker role; new-spec-key PATH: create a task-spec key file")
    parser.add_argument("target", nargs="?", help="the ROLE (grant-worker) or the PATH (new-spec-key)")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.errors import UsageError

    if args.action == "upgrade":
        if args.target is not None:
            raise UsageError("`ql db upgrade` takes no argument")
        return _upgrade(args, out)
    if args.target is None:
        what = "ROLE" if args.action == "grant-worker" else "PATH"
        raise UsageError(f"`ql db {args.action}` needs a {what}: ql db {args.action} {what}")
    if args.action == "new-spec-key":
        return _new_spec_key(args.target, out)
    return _grant_worker(args, args.target, out)


def _new_spec_key(path: str, out: Output) -> int:
    import os

    from ql_plugins.cluster_fenced.sealing import new_key_file

    key_id = new_key_file(os.path.abspath(path))
    out.emit({"path": os.path.abspath(path), "key_id": key_id},
             f"created {os.path.abspath(path)} (key id {key_id}, mode 600); copy it to every control node and "
             f"worker and set [plugin.cluster-fenced] spec_key_file to it")
    return 0


def _grant_worker(args: argparse.Namespace, role: str, out: Output) -> int:
    from ql_core.cli.common import config_from_args, mask_url
    from ql_core.errors import ConfigError

    config = config_from_args(args)
    if not config.database_url.startswith("postgresql"):
        raise ConfigError(f"grant-worker sets up a role on the cluster's PostgreSQL control database, and "
                          f"database_url is {mask_url(config.database_url)}; run it with the control node's config")
    from ql_plugins.cluster_fenced.roles import grant_worker_url

    done = grant_worker_url(config.database_url, role)
    out.emit(done, f"role {done['role']} may now call only the {len(done['functions'])} ql worker functions on "
                   f"database {done['database']} (schema {done['schema']}); no table privileges")
    return 0


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

    from ql_core.errors import DatabaseError

    connect_args: dict[str, object] = {}
    if url.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise DatabaseError("PostgreSQL needs the psycopg driver: pip install 'ql-runner[cluster]'") from None
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    return create_engine(url, poolclass=NullPool, connect_args=connect_args)


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
