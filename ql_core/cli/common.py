"""Helpers shared by the command modules: config from the global options, the runtime, safe text."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    import threading

    from ql_core.config import Config
    from ql_core.records import RunView
    from ql_core.runtime import Runtime

__all__ = ["install_early_stop", "early_stop", "release_early_stop", "stop_on_signals", "config_from_args",
           "runtime_from_args", "reader_from_args", "reader_for_run", "settle_shown", "printable",
           "loaded_sqlite_path", "names_plugins", "defer_gc", "start_up_over"]


#: True while :func:`defer_gc` holds the cyclic garbage collector off (until :func:`start_up_over`).
_gc_deferred = False


def defer_gc() -> None:
    """Hold the cyclic garbage collector off while a one-shot command starts (``ql run``, the reads).

    Start-up is imports and the objects they build (classes, functions, the generated methods of
    dataclasses): ~100 000 objects, none of them garbage, which the collector would traverse again
    and again as they are allocated — ~3% of a ``ql run -- true``. Reference counting still frees
    everything else. Only the ``ql`` executable calls this (``console_main``), never an embedding
    host or a test that calls :func:`ql_core.cli.main.main`."""
    import gc

    global _gc_deferred
    if gc.isenabled():
        gc.disable()
        _gc_deferred = True


def start_up_over() -> None:
    """Turn the collector back on once the command's start-up is over (before it waits, which may
    take hours): what start-up built is frozen (``gc.freeze``: never traversed again, like a forking
    server's start-up), and what comes after is collected as usual. Does nothing unless
    :func:`defer_gc` held the collector off."""
    import gc

    global _gc_deferred
    if _gc_deferred:
        _gc_deferred = False
        gc.freeze()
        gc.enable()


#: Set by the early SIGTERM/SIGINT handler of a long-running command (see :func:`install_early_stop`).
_early_stop = None
#: The signal the early handler caught first (re-delivered by :func:`release_early_stop`).
_early_signal: list[int] = []


def install_early_stop() -> None:
    """Arm SIGTERM/SIGINT to set an event instead of killing us (the command picks it up later)."""
    import signal
    import threading

    global _early_stop
    event = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if not _early_signal:
            _early_signal.append(signum)
        event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    _early_stop = event


def early_stop():  # type: ignore[no-untyped-def]
    """The stop event armed by :func:`install_early_stop` (None when nothing armed one)."""
    return _early_stop


def release_early_stop() -> None:
    """Undo :func:`install_early_stop` for a command that turned out not to stop on signals (a
    plugin's short command): the default handlers come back, and a signal caught meanwhile is
    delivered again, so it does what it would have done (TERM ends us, Ctrl-C interrupts)."""
    import signal

    global _early_stop
    if _early_stop is None:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _early_stop = None
    if _early_signal:
        signal.raise_signal(_early_signal.pop())


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """Within the block SIGTERM and SIGINT set ``stop`` instead of killing us (a long-running
    command stops cleanly, even while it is still starting); the previous handlers come back after."""
    import signal

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def config_from_args(args: argparse.Namespace, *, reports_plugins: bool = False, check_plugins: bool = True) -> Config:
    """The config the command line asks for: options, then ``QL_*`` variables, then the file.

    Plugin names that name nothing and settings a plugin refuses are configuration errors here.
    ``reports_plugins`` (doctor, plugins): a plugin that cannot load or lacks its package is left to
    the command, which reports it as a failed check or a problem row. ``check_plugins=False``: the
    caller checks :func:`names_plugins` itself and takes a path that checks them when it is true
    (the read commands' quick path)."""
    from ql_core.config import load_config

    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None  # the working directory was removed: there is no ./ql.toml to find
    config = load_config(
        config_path=getattr(args, "config", None),
        data_dir=getattr(args, "data_dir", None),
        profile=getattr(args, "profile", None),
        environ=os.environ,
        cwd=cwd,
    )
    # Before anything is created or run: a misspelled [plugin.X] table or QL_PLUGINS entry must stop
    # every command alike, not be ignored (tasks would run as root without [plugin.local] run_as).
    # A config that names no plugin has nothing to check here, and a reader then imports no pluggy.
    if check_plugins and names_plugins(config):
        from ql_core.plugins import check_config_plugins

        check_config_plugins(config, os.environ, reports_plugins=reports_plugins)
    _LOADED[:] = [config]
    return config


def names_plugins(config: Config) -> bool:
    """Does the config or the environment name a plugin beyond the profile's own (a ``[plugin.X]``
    table, ``disable_plugins``, extra ``plugins``, ``QL_PLUGINS`` / ``QL_DISABLE_PLUGINS``)?"""
    return bool(config.plugin_settings or config.disabled_plugins
                or set(config.plugins) - set(config.profile.default_plugins)
                or os.environ.get("QL_PLUGINS") or os.environ.get("QL_DISABLE_PLUGINS"))


#: The config this command loaded: an error that reaches ``main`` raw can still name its database.
_LOADED: list[Config] = []


def loaded_sqlite_path() -> str | None:
    """The SQLite run database of the config this command loaded (None: none loaded, or PostgreSQL)."""
    if not _LOADED or not _LOADED[0].database_url.startswith("sqlite:///"):
        return None
    from urllib.parse import unquote

    return os.path.abspath(unquote(_LOADED[0].database_url[len("sqlite:///"):]))


#: Runtimes the writing commands opened: closed before the process exits (``close_opened``), so
#: the writer — not the next reader — folds the database's write-ahead log back into it.
_OPENED: list[Runtime] = []


def runtime_from_args(args: argparse.Namespace) -> Runtime:
    """An opened runtime for a command that writes (run, cancel, reconcile, supervise): the data dir
    and its database are created and migrated when missing."""
    from ql_core.plugins import check_plugin_config, require_selected_seams
    from ql_core.runtime import Runtime

    config = config_from_args(args)
    if not os.path.lexists(os.path.join(config.data_dir, "node_id")):
        # First use: a config that cannot run (a seam no plugin registers, a setting a plugin refuses)
        # fails before the data dir and its database are created — a failing config leaves no trace.
        # Later starts skip this second plugin load: Runtime.open checks the same.
        require_selected_seams(config, check_plugin_config(config, os.environ))
    rt = Runtime.open(config)
    _OPENED.append(rt)
    return rt


def close_opened() -> None:
    """Close what :func:`runtime_from_args` opened (the ``ql`` executable exits without teardown)."""
    while _OPENED:
        try:
            _OPENED.pop().close()
        except Exception:  # noqa: BLE001 - committed work is durable; closing only tidies up
            pass


def reader_from_args(args: argparse.Namespace, *, run_id: str | None = None) -> Runtime:
    """An opened runtime for a command that reads (status, list, events, logs): nothing is created or
    migrated; a missing data dir or database is a one-line error naming the fix (with ``run_id``:
    "run X not found: <why>")."""
    from ql_core.errors import NotFoundError
    from ql_core.runtime import Runtime

    try:
        return Runtime.open(config_from_args(args), create=False)
    except NotFoundError as exc:
        if run_id is None:
            raise
        raise NotFoundError(f"run {printable(run_id[:80])!r} not found: {exc}") from None


def reader_for_run(args: argparse.Namespace, attr: str = "run_id") -> tuple[Runtime, str]:
    """A reader (:func:`reader_from_args`) and the full run id that ``args.<attr>`` names: a full id, a
    unique prefix or ``last`` (:mod:`ql_core.cli.run_ids`). A malformed argument is a usage error
    before anything is opened."""
    from ql_core.cli.run_ids import check_run_argument, resolve_run_id

    text = getattr(args, attr)
    check_run_argument(text)
    rt = reader_from_args(args, run_id=text)
    try:
        return rt, resolve_run_id(rt, text)
    except BaseException:
        rt.close()
        raise


def settle_shown(rt: Runtime, views: list[RunView], *, limit: int) -> list[RunView]:
    """Settle the non-terminal runs a reader is about to show (at most ``limit`` of them), so a run
    whose task ended is shown ended even when no supervisor runs; returns the views to show. On a
    read-only file system nothing is settled: the committed state is shown."""
    from ql_core.db.integrity import on_read_only_fs
    from ql_core.ports.journal import StoreBusyError, ConflictError

    shown: list[RunView] = []
    # A data dir on a read-only file system can only be read: show what is committed, settle nothing.
    budget = 0 if on_read_only_fs(rt.config.data_dir) else limit
    for view in views:
        if not view.terminal and budget > 0:
            budget -= 1
            try:
                rt.settle(view)
            except (StoreBusyError, ConflictError):
                pass  # another process is writing right now: show what is committed, settle next time
            else:
                view = rt.status(view.run_id)
        shown.append(view)
    return shown


#: What :func:`printable` escapes; compiled on first use (``re.compile`` at import cost every command
#: ~0.3 ms, ``ql run`` included, which prints nothing through it on success).
_UNPRINTABLE_PATTERN = r"[\x00-\x1f\x7f-\x9f\\\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\udc80-\udcff]"


def printable(text: str | None) -> str:
    """``text`` safe for a terminal: control characters (newlines, escapes), bidi overrides and
    backslashes are escaped (``\\n``, ``\\x1b``, ``\\u202e``, ``\\\\``), and so is a byte of a non-UTF-8 file
    name (``\\xe9``); other text is unchanged."""
    if not text:
        return ""

    def escape(match: re.Match[str]) -> str:
        ch = match.group(0)
        if ch == "\\":
            return "\\\\"
        if ch in "\n\r\t":
            return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch]
        code = ord(ch)
        if 0xdc80 <= code <= 0xdcff:  # a byte of a non-UTF-8 file name (surrogateescape): the byte itself
            return f"\\x{code - 0xdc00:02x}"
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return re.compile(_UNPRINTABLE_PATTERN).sub(escape, text)  # re's own cache keeps it compiled


def mask_url(url: str) -> str:
    """``scheme://user:secret@host/db`` -> ``scheme://user:***@host/db`` (never print a password)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<unparsable database_url>"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def database_failure(exc: BaseException, url: str) -> str:
    """One line for a database that cannot be reached or read, naming the fix."""
    orig = getattr(exc, "orig", None) or exc
    first = " ".join(str(orig).split())[:240] or type(orig).__name__
    if url.startswith("postgresql"):
        return (f"cannot use the database {mask_url(url)}: {first}; check database_url and that the "
                f"PostgreSQL server is up and reachable")
    return f"cannot use the database {mask_url(url)}: {first}; check the data dir with `ql doctor`"
