"""Schema migrations (Alembic), applied on start and by ``ql db upgrade``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["SCHEMA_HEAD", "MIGRATIONS_GROUP", "alembic_config", "version_locations", "upgrade", "migrate_url", "migrate_url_in_child", "current_revision", "head_revision"]

#: The head of the schema as shipped, core's revisions and the bundled cluster plugin's branch (a test
#: keeps this equal to :func:`head_revision`).
#: Knowing it without Alembic saves every start-up ~0.3 s of importing it.
SCHEMA_HEAD = "0017_cluster_spawn_complete,0020_sqlite_log_listing"


#: Entry-point group of plugins' schema branches: ``name = package``; ``<package>/versions`` holds the
#: plugin's Alembic revisions (one branch, labelled, on a core revision). Applied with core's.
MIGRATIONS_GROUP = "ql.migrations"


def version_locations() -> list[str]:
    """Core's revision directory, then each installed plugin branch's (by entry-point name)."""
    import importlib
    from importlib import metadata, resources

    found = [str(resources.files("ql_core.db") / "migrations" / "versions")]
    for ep in sorted(metadata.entry_points(group=MIGRATIONS_GROUP), key=lambda e: e.name):
        try:
            package = importlib.import_module(ep.value.strip())
        except ImportError as exc:
            raise DatabaseError(f"the schema of plugin {ep.name!r} ({ep.value}) cannot be loaded: {exc}; "
                                f"reinstall the package that provides it") from None
        location = str(resources.files(package) / "versions")
        if location not in found:
            found.append(location)
    return found


def alembic_config(connection=None):  # type: ignore[no-untyped-def]
    """Alembic's config for ql's schema: core's revisions and every plugin branch (``ql.migrations``)."""
    from importlib import resources

    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(resources.files("ql_core.db") / "migrations"))
    cfg.set_main_option("path_separator", "newline")  # a path may hold a space
    cfg.set_main_option("version_locations", "\n".join(version_locations()))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision this version of ql ships (core's and every installed plugin branch's
    heads, comma-separated, in order: what :func:`current_revision` reads after an upgrade)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    # A head another revision depends on (core's 0007 under the cluster branch's 0008) is implied
    # by it: alembic_version names only the dependent one after an upgrade.
    implied = {dep for rev in script.walk_revisions() for dep in _as_tuple(rev.dependencies)}
    heads = sorted(h for h in script.get_heads() if h not in implied)
    assert heads
    return ",".join(heads)


def _as_tuple(value: object) -> tuple[str, ...]:
    if not value:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)  # type: ignore[arg-type]


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database); several branch heads are
    named comma-separated, in order."""
    from sqlalchemy import inspect, text

    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return ",".join(sorted(rows)) or None  # one row per branch head (a plugin's branch adds one)


def upgrade(engine: Engine) -> str:
    """Bring the schema to head; idempotent. Returns the head revision."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        if current_revision(engine) == SCHEMA_HEAD:
            return SCHEMA_HEAD
        from alembic import command

        head = head_revision()
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "heads")
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot migrate the run database: {type(exc).__name__}: "
                            f"{str(exc.orig if getattr(exc, 'orig', None) else exc)[:200]}") from exc
    return head


def migrate_url(url: str) -> str:
    """Bring the database at ``url`` to head with a short-lived engine (the run stores' own
    connections never load SQLAlchemy). Returns the head revision."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    if url.startswith("postgresql"):
        from .engine import postgres_engine

        engine = postgres_engine(url, poolclass=NullPool)
    else:
        engine = create_engine(url, poolclass=NullPool)
    try:
        return upgrade(engine)
    finally:
        engine.dispose()


#: The child of :func:`migrate_url_in_child`: reads {"url", "path"} from stdin, migrates, prints one
#: JSON line ({"head"} or {"error"}). The URL travels on stdin: never in an argv (it may hold a secret).
_CHILD = (
    "import json, sys\n"
    "job = json.loads(sys.stdin.read())\n"
    "sys.path[:] = job['path']\n"
    "from ql_core.db.migrate import _child_main\n"
    "_child_main(job['url'])\n"
)

#: A migration that takes longer than this is reported as stuck (the child is then killed).
MIGRATION_TIMEOUT_S = 600


def _child_main(url: str) -> None:
    import json
    import sys

    try:
        head = migrate_url(url)
    except DatabaseError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(1)
    print(json.dumps({"head": head}))


def migrate_url_in_child(url: str, *, keep_fds: tuple[int, ...] = ()) -> str:
    """:func:`migrate_url` in a short-lived child process (same interpreter and ``sys.path``), so
    the calling process never imports the migration machinery. ``keep_fds`` are inherited (a
    lock the child must hold too). Returns the head revision; raises :class:`DatabaseError` with
    the child's own one-line reason."""
    import json
    import subprocess
    import sys

    job = json.dumps({"url": url, "path": sys.path})
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], input=job, capture_output=True, text=True,
                              pass_fds=keep_fds, timeout=MIGRATION_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise DatabaseError(f"migrating the run database took over {MIGRATION_TIMEOUT_S} s; another "
                            f"process may hold it locked: stop it and retry (`ql db upgrade`)") from None
    except OSError:
        # The interpreter cannot start itself here (e.g. a host under another uid whose Python lives
        # in a private directory): migrate in this process; it only costs the memory we wanted back.
        return migrate_url(url)
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if done.returncode == 0 and isinstance(answer.get("head"), str):
        return answer["head"]
    reason = answer.get("error") or (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    raise DatabaseError(reason if answer.get("error") else f"cannot migrate the run database: {reason[:300]}")
