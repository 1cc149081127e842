"""The quick path of the read commands (``ql status``, ``list``, ``events``, ``logs``): no plugins loaded.

On the plain configuration — the built-in SQLite run store (``journal = "edge-sqlite"``), the
profile's own executor and receipt store, no plugin named by the config or the environment, no
artifact store — a read needs nothing but the database: :class:`QuickReader` answers it with
:class:`ql_core.db.sqlite_reads.SqliteReads` and never imports pluggy, the plugin host, the journal
kernel or the node (about half of a read command's CPU; issue 25).

It answers only what needs no decision: a *terminal* run (a run that is not terminal is settled
first, which needs the node), events, a log read without ``--follow``. Anything else — another
configuration, a missing data dir or database, another schema, a run not found, any error — returns
None or is declined by the command, which then takes the full path (``reader_from_args``): the same
output for what both can answer, and the full path's one-line errors for the rest.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.db.sqlite_reads import SqliteReads
    from ql_core.records import EventRecord, LogFacts, RunView

__all__ = ["QuickReader", "quick_reader", "quick_reader_for_run"]


class QuickReader:
    """The few members of a reading ``Runtime`` that the read commands use, over :class:`SqliteReads`."""

    def __init__(self, config: _Place, reads: SqliteReads) -> None:
        #: Only ``data_dir``: the rest of the configuration is the plain one (:func:`_plain`).
        self.config = config
        #: ``resolve_run_id`` looks up prefixes here, as on a runtime's journal.
        self.journal = reads

    def status(self, run_id: str) -> RunView | None:
        """The committed view (None: no such run; the full path says so)."""
        return self.journal.view(run_id)

    def events(self, run_id: str) -> list[EventRecord] | None:
        return self.journal.events(run_id)

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunView]:
        return self.journal.list_views(status=status, limit=limit)

    def log_facts(self, log_id: str) -> LogFacts | None:
        return self.journal.log_facts(log_id)

    def close(self) -> None:
        self.journal.close()


def _plain(config: Config) -> bool:
    """Is this the configuration whose run store the quick path can read (see the module doc)?"""
    from ql_core.cli.common import names_plugins

    profile = config.profile
    return (config.journal == "edge-sqlite" and config.database_url.startswith("sqlite:///")
            and config.executor == profile.default_executor
            and config.receipt_store == profile.default_receipt_store
            and config.artifact_store is None and not names_plugins(config))


def _database_path(url: str) -> Path | None:
    from urllib.parse import unquote

    raw = unquote(url[len("sqlite:///"):])
    if not raw or raw.startswith(":memory:") or "?" in raw or "mode=memory" in raw:
        return None
    return Path(os.path.abspath(raw))


def quick_reader(args: argparse.Namespace) -> QuickReader | None:
    """A reader for the command line's data dir on the quick path, or None: take the full path."""
    try:
        found = _builtin(args)
        if found is None:
            found = _configured(args)
        if found is None:
            return None
        data_dir, url, busy_timeout_ms = found
        from ql_core.paths import existing_data_dir, read_node_id

        data_dir = existing_data_dir(data_dir)
        if read_node_id(data_dir) is None:
            return None
        path = _database_path(url)
        if path is None:
            return None
        from ql_core.db.migrate import SCHEMA_HEAD
        from ql_core.db.sqlite_reads import SqliteReads

        reads = SqliteReads.open(path, busy_timeout_ms=busy_timeout_ms, schema_head=SCHEMA_HEAD)
    except Exception:  # noqa: BLE001 - the full path explains every failure, in its own words
        return None
    return None if reads is None else QuickReader(_Place(data_dir), reads)


def _builtin(args: argparse.Namespace) -> tuple[Path, str, int] | None:
    """(data dir, database URL, busy timeout) when the built-in edge defaults are the whole
    configuration (:func:`ql_core.config_paths.builtin_data_dir`): then neither the config nor the
    profile dataclasses are loaded — about a third of a read's CPU."""
    from ql_core.config_paths import builtin_data_dir
    from ql_core.db.sqlite_reads import EDGE_BUSY_TIMEOUT_MS

    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
    directory = builtin_data_dir(getattr(args, "data_dir", None), getattr(args, "config", None),
                                 getattr(args, "profile", None), os.environ, cwd)
    if directory is None:
        return None
    return directory, f"sqlite:///{directory / 'ql.db'}", EDGE_BUSY_TIMEOUT_MS


def _configured(args: argparse.Namespace) -> tuple[Path, str, int] | None:
    """The same from the loaded configuration, when it is the plain one (:func:`_plain`)."""
    from ql_core.cli.common import config_from_args

    config = config_from_args(args, check_plugins=False)
    if not _plain(config):
        return None
    return config.data_dir, config.database_url, config.profile.busy_timeout_ms


class _Place:
    """What a reader's ``config`` tells the read commands: the (canonical) data dir."""

    __slots__ = ("data_dir",)

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir


def quick_reader_for_run(args: argparse.Namespace, attr: str = "run_id") -> tuple[QuickReader, str] | None:
    """A quick reader and the full run id ``args.<attr>`` names (``last``, a prefix, a full id), or
    None: take the full path (``reader_for_run``), which also explains a malformed or unknown id."""
    from ql_core.cli.run_ids import check_run_argument, resolve_run_id

    try:
        check_run_argument(getattr(args, attr))
    except Exception:  # noqa: BLE001 - the full path reports it, before opening anything
        return None
    reader = quick_reader(args)
    if reader is None:
        return None
    try:
        return reader, resolve_run_id(reader, getattr(args, attr))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - not found, ambiguous, an error: the full path says which
        reader.close()
        return None
