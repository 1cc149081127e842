"""The ``cluster-fenced`` plugin: PostgreSQL as the control plane of many ql workers (DESIGN.md §9).

Registers the journal backend ``cluster-fenced``, the artifact store ``postgres`` (shipped logs
as checksummed chunks in the control database, :mod:`.artifact_store`) and the cluster's commands
(``ql worker``, ``ql control``, ``ql workers``, ``ql db grant-worker`` / ``new-spec-key``; :mod:`.commands`). Its factory chooses by the profile:

- ``cluster-worker``: a :class:`~.worker_store.WorkerJournal` — the worker's own local run store
  (an edge-sqlite store at ``<data_dir>/worker.db``, plus the worker's lease/outbox table) and the
  ``ql worker`` service that claims, runs and completes attempts of the control plane;
- any other profile (``cluster-control``, or a standalone node with ``journal = "cluster-fenced"``
  and a PostgreSQL ``database_url``): a :class:`~.pg_store.PostgresJournal` — the whole run store
  on the control database, the queue (``ql run`` on a control node) and the ``ql control`` sweeper.

Kept import-light: ``ql plugins`` imports this module. psycopg is imported only when a store
connects (``pip install 'ql-runner[cluster]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql_core.hookspecs import RegisterArtifactStore, RegisterCommand, RegisterJournalBackend, hookimpl

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.ports import ArtifactStore, JournalBackend, RuntimeContext

__all__ = ["ql_register_journal_backends", "ql_register_artifact_stores", "ql_register_commands", "ql_check_config",
           "ql_limit_names", "ql_effective_settings", "make_journal", "make_artifact_store"]

NAME = "cluster-fenced"


def make_journal(context: RuntimeContext) -> JournalBackend:
    """The run store for this node's profile (see the module docstring)."""
    from ql_core.errors import ConfigError

    from .settings import parse_settings, profile_of

    config = context.config
    settings = parse_settings(context.plugin_config(NAME), node_id=context.node_id)
    if not config.database_url.startswith("postgresql"):
        raise ConfigError(f'journal = "{NAME}" needs database_url = "postgresql+psycopg://user@host/db" '
                          f"(the control database); for SQLite use journal = \"edge-sqlite\"")
    profile_of(config)  # the cluster numbers, range- and relation-checked before anything connects
    if config.profile.name == "cluster-worker":
        from .worker_store import WorkerJournal

        return WorkerJournal.from_context(context, settings)
    from .pg_store import PostgresJournal

    return PostgresJournal.from_context(context, settings)


@hookimpl
def ql_register_journal_backends(register: RegisterJournalBackend) -> None:
    register(NAME, make_journal)


def make_artifact_store(context: RuntimeContext) -> ArtifactStore:
    """The ``postgres`` artifact store on this node's control database (imported on first use)."""
    from .artifact_store import make_artifact_store as make

    return make(context)


@hookimpl
def ql_register_artifact_stores(register: RegisterArtifactStore) -> None:
    register("postgres", make_artifact_store)


@hookimpl
def ql_check_config(config: Config) -> None:
    """Every command refuses a ``[plugin.cluster-fenced]`` key or value the journal would refuse
    (the cluster numbers too, wherever the config sets them)."""
    table = config.plugin_settings.get(NAME)
    if table is not None or any(k in config.extra_limits for k in ql_limit_names()):
        from .settings import parse_settings, profile_of

        parse_settings(table or {}, node_id="check")
        profile_of(config)


@hookimpl
def ql_limit_names() -> list[str]:
    """The cluster numbers an older config still sets in ``[limits]`` (``[plugin.cluster-fenced]`` wins)."""
    from .settings import NUMBER_RANGES

    return list(NUMBER_RANGES)


@hookimpl
def ql_effective_settings(config: Config) -> dict[str, object] | None:
    """``[plugin.cluster-fenced]`` in force, the cluster numbers included (a worker id not set is
    this node's id: shown so)."""
    if config.profile.database != "postgresql" and NAME not in config.plugin_settings:
        return None
    from dataclasses import asdict

    from .settings import parse_settings, profile_of

    table = config.plugin_settings.get(NAME, {})
    shown = asdict(parse_settings(table, node_id="node"))
    if "worker_id" not in table:
        shown["worker_id"] = "(this node's id)"
    shown.update(profile_of(config).numbers())
    return {k: ("" if v is None else v) for k, v in shown.items()}


def _command(module: str):  # type: ignore[no-untyped-def]
    """A factory importing ``.commands.<module>`` when its command is built."""
    def load():  # type: ignore[no-untyped-def]
        import importlib

        return importlib.import_module(f"{__package__}.commands.{module}")

    return load


@hookimpl
def ql_register_commands(register: RegisterCommand) -> None:
    from .commands import COMMAND_MODULES

    for name, module in COMMAND_MODULES.items():
        register(name, _command(module))
