"""Entry point of the ``ql`` command (contract: ``docs/cli.md``).

Parsing is cheap and imports nothing heavy; each command's module is imported
only when it runs, so ``ql --help`` and ``ql plugins`` never load SQLAlchemy.

Every failure is one line on stderr (with ``--json``: one JSON object), never a
traceback: expected failures (:class:`~ql_core.errors.QlError`, the run
store's and receipt store's own errors, OS errors) name the cause and the fix;
anything else is reported as an internal error of the command, with
``QL_DEBUG=1`` to see the traceback. Exit 2 for usage and configuration errors,
1 for operational failures.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, NoReturn, Sequence

from ql_core.cli.output import silence_stdout

if TYPE_CHECKING:
    import argparse

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_CODES", "HELP_ORDER", "all_commands", "exit_codes"]

#: core's subcommand -> module; each module defines ``configure(parser)`` and ``run(args, out) -> int``.
#: Plugins add theirs through the ``ql_register_commands`` hook (the cluster's worker, control, workers).
COMMANDS: dict[str, str] = {
    "run": "ql_core.cli.cmd_run",
    "status": "ql_core.cli.cmd_status",
    "events": "ql_core.cli.cmd_events",
    "list": "ql_core.cli.cmd_list",
    "logs": "ql_core.cli.cmd_logs",
    "wait": "ql_core.cli.cmd_wait",
    "cancel": "ql_core.cli.cmd_cancel",
    "reconcile": "ql_core.cli.cmd_reconcile",
    "supervise": "ql_core.cli.cmd_supervise",
    "audit": "ql_core.cli.cmd_audit",
    "plugins": "ql_core.cli.cmd_plugins",
    "doctor": "ql_core.cli.cmd_doctor",
    "db": "ql_core.cli.cmd_db",
    "web": "ql_core.cli.cmd_web",
}
#: The order of ``ql --help`` (the bundled cluster plugin's commands where they always were); other
#: plugins' commands follow, by name.
HELP_ORDER = ("run", "status", "events", "list", "logs", "cancel", "reconcile", "supervise", "worker", "control",
              "audit", "plugins", "doctor", "db", "workers", "web")

_FAIL = ("1", "an operational failure (one line on stderr names the cause and the fix)")
_USAGE = ("2", "a usage or configuration error")
#: Each command's exit codes, as its ``--help`` lists them (and docs/cli.md).
EXIT_CODES: dict[str, list[tuple[str, str]]] = {
    "run": [("N", "the task's own exit code (0-255) when it succeeded or failed"),
            ("124", "the run timed out (its deadline passed)"),
            ("130", "the run was cancelled (ql cancel, or Ctrl-C)"),
            ("75", "the run was lost: nothing proves how it ended"),
            ("125", "detached (a second Ctrl-C): the run goes on, this command stopped waiting"),
            ("0", "with --detach: the run was submitted"),
            ("1", "ql itself failed (one line on stderr says so; e.g. nothing could be started)"), _USAGE],
    "status": [("0", "the run was found and shown"), _FAIL, _USAGE],
    "events": [("0", "the run was found and its events shown"), _FAIL, _USAGE],
    "list": [("0", "the runs were listed (none is not an error)"), _FAIL, _USAGE],
    "logs": [("0", "the log was printed (without --follow)"),
             ("N", "with --follow: the run's exit status, as ql run's (the task's code, 124, 130, 75)"),
             _FAIL, _USAGE],
    "wait": [("N", "the run's exit status, as ql run's: the task's own code (0-255) when it succeeded or "
                   "failed; with several runs the first non-zero one"),
             ("124", "a run timed out"), ("130", "a run was cancelled"), ("75", "a run was lost"),
             ("125", "--timeout passed first: ql stopped waiting, the runs go on"),
             ("1", "a run was not found, or ql failed"), _USAGE],
    "cancel": [("0", "answered: requested, already requested or already terminal (see outcome)"),
               _FAIL, _USAGE],
    "reconcile": [("0", "the pass ran (complete or cut short by --max-rounds)"),
                  ("1", "the pass failed closed (a cursor did not advance) or another failure"), _USAGE],
    "supervise": [("0", "stopped by SIGTERM/SIGINT and drained in time"),
                  ("1", "the drain timed out, or ql failed"), _USAGE],
    "audit": [("0", "the shards were audited"), _FAIL, _USAGE],
    "plugins": [("0", "every active plugin loads and every selected seam is registered"),
                ("1", "a problem: a load error, a missing or duplicate plugin, a disabled but selected one"),
                _USAGE],
    "doctor": [("0", "every check passed"), ("1", "a check failed (its line says why and the fix)"), _USAGE],
    "db": [("0", "the schema is at head"), _FAIL, _USAGE],
    "web": [("0", "stopped by SIGTERM/SIGINT"), _FAIL, _USAGE],
}

#: The longest error line we print (a driver's message can be a page long).
_MAX_MESSAGE = 2000


#: Global options that take a value (``--data-dir DIR``), for finding the command before parsing.
_VALUED = ("--data-dir", "--config", "--profile")
#: Commands that run until SIGTERM: their stop handler is installed before anything else. A
#: plugin's command gets it too until its module is known; it keeps it only if the module says
#: ``STOPS_ON_SIGNALS = True`` (``ql worker``, ``ql control``), else the default handlers come back.
_EARLY_STOP_COMMANDS = ("supervise",)
#: Commands that run with the cyclic garbage collector off (``console_main``): each either ends after
#: a bounded amount of work (the reads: a page of runs, one run's events, a log up to its quota) or
#: calls ``ql_core.cli.common.start_up_over`` before anything that may last (``ql run``'s wait,
#: ``ql logs --follow``). No long-running command (supervise, web, a plugin's) is in it.
_GC_DEFERRED_COMMANDS = ("run", "status", "list", "events", "logs")
def _peek_command(argv: Sequence[str]) -> str | None:
    """The subcommand, found without argparse (and without importing any command module)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _VALUED:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        return arg
    return None


def _plain_run(argv: Sequence[str]) -> SimpleNamespace | None:
    """The arguments argparse would give ``ql [GLOBAL OPTIONS] run -- CMD [ARG...]`` (no option of
    ``run`` itself), built without building the parser; None for any other command line, which the
    parser then reads (and explains, when it is wrong).

    Building the parser is ~2 ms of a one-shot ``ql run``'s CPU (argparse's objects, and the
    gettext look-ups and locale import its first messages do; issue 25 item 3). Only the exact
    spellings argparse accepts unambiguously are taken here: ``--data-dir``, ``--config`` and
    ``--profile`` once each with a value that does not start with ``-``, ``--json``; an
    abbreviation, an ``=value`` form or anything else goes to the parser
    (tests/cli/test_plain_run.py compares the two on many command lines). The arguments are a
    ``SimpleNamespace`` (the same attributes as argparse's ``Namespace``): a plain run does not
    import argparse at all (~1-2 ms with the gettext it imports)."""
    values: dict[str, object] = {"data_dir": None, "config": None, "profile": None, "json": False}
    seen: set[str] = set()
    i = 0
    while i < len(argv) and argv[i] != "run":
        option = argv[i]
        if option == "--json":
            values["json"] = True
            i += 1
        elif option in _VALUED and option not in seen and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            seen.add(option)
            values[option[2:].replace("-", "_")] = argv[i + 1]
            i += 2
        else:
            return None
    command = list(argv[i + 1:])
    if i >= len(argv) or len(command) < 2 or command[0] != "--":
        return None
    module = importlib.import_module(COMMANDS["run"])
    return SimpleNamespace(**values, command=command, **module.DEFAULTS, _module=module)


def _wants_json(argv: Sequence[str]) -> bool:
    """``--json`` among the options (before a ``--`` that starts a task's command)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; imports only the small command modules.

    ``only``: the command about to run (found by :func:`_peek_command`) — the parser then knows
    just that one, so a command imports and configures nothing of the others. Help and usage
    errors without a known command get the full parser.
    """
    from ql_core.cli.parser import build_parser as build

    return build(_command_modules(only), exit_rows=_exit_rows, report_usage=_report_usage)


def _exit_rows(name: str, module: object) -> list[tuple[str, str]]:
    return EXIT_CODES.get(name) or list(getattr(module, "EXIT_CODES", None) or [_FAIL, _USAGE])


def _report_usage(message: str, prog: str, json_mode: bool) -> None:
    _report(f"{message} (see {prog} --help)", kind="usage", exit_code=2, json_mode=json_mode,
            prefix=f"{prog}: error: ")


def _command_modules(only: str | None) -> list[tuple[str, object]]:
    """(name, module) of the commands the parser knows: ``only`` if it is core's, else core's and
    every plugin's (``ql_register_commands``), in :data:`HELP_ORDER`."""
    found: list[tuple[str, object]] = []
    listed = None
    if only is None or only not in COMMANDS:
        from ql_core.errors import PluginError
        from ql_core.plugins import plugin_commands

        listed = plugin_commands(reserved=COMMANDS)
        if only is not None and only not in listed.commands:
            if listed.problems:  # `ql worker` with its plugin broken: say why, not "invalid choice"
                raise PluginError(f"`ql {only}` is not one of ql's commands and a plugin failed to load: "
                                  f"{listed.problems[0]}")
            only = None  # a typo: the full parser lists the choices
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            found.append((name, importlib.import_module(module_name)))
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            # a command whose module is not part of this build
    if listed is not None:
        for name, command in sorted(listed.commands.items()):
            if " " not in name and (only is None or name == only):
                found.append((name, command.load()))
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    return sorted(found, key=lambda item: (rank.get(item[0], len(rank)), item[0]))


def all_commands() -> dict[str, object]:
    """Every command ``ql`` knows here, core's and the plugins', by name (in ``ql --help`` order)."""
    return dict(_command_modules(None))


def exit_codes(name: str) -> list[tuple[str, str]]:
    """The exit codes ``ql <name> --help`` lists (a plugin command's own ``EXIT_CODES``)."""
    return _exit_rows(name, all_commands()[name])


# -- the one-line error contract ------------------------------------------------------------------
def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= _MAX_MESSAGE else line[:_MAX_MESSAGE - 3] + "..."


def _report(message: str, *, kind: str, exit_code: int, json_mode: bool, prefix: str = "ql: error: ") -> None:
    """Print one error line on stderr (or one JSON object with ``--json``); never raises."""
    import json

    from ql_core.cli.output import escape_undecodable

    message = escape_undecodable(_one_line(message))  # a non-UTF-8 path prints as \xNN, never a crash
    if json_mode:
        line = json.dumps({"error": kind, "message": message, "exit_code": exit_code}, separators=(",", ":"))
    else:
        line = prefix + message
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr is gone too: the exit status is all we can give


def classify(exc: BaseException, command: str | None) -> tuple[str, str, int]:
    """(kind, one-line message, exit code) for an exception that ended a command."""
    from ql_core.errors import (
        ConfigError,
        DatabaseError,
        DataDirError,
        NotFoundError,
        PluginError,
        QlError,
        UnsafePathError,
        UsageError,
        explain_os_error,
    )

    if isinstance(exc, QlError):
        kind = next((k for cls, k in ((UsageError, "usage"), (ConfigError, "config"), (PluginError, "plugin"),
                                      (NotFoundError, "not_found"), (DatabaseError, "database"),
                                      (DataDirError, "data_dir"), (UnsafePathError, "unsafe_path"))
                     if isinstance(exc, cls)), "error")
        return kind, str(exc), exc.exit_code
    family = _known_family(exc)
    if family == "receipts":
        return family, (f"receipt store: {str(exc) or type(exc).__name__}; `ql doctor` checks the data dir's "
                        f"receipts directory"), 1
    if family == "database":
        explained = _explain_database(exc)
        if explained is not None:
            return family, explained, 1
    if family is not None:
        return family, str(exc) or type(exc).__name__, 1
    if isinstance(exc, OSError):
        return "os", explain_os_error(exc, f"`ql {command}` failed" if command else "ql failed"), 1
    if isinstance(exc, RecursionError):
        return "internal", (f"`ql {command}` hit Python's recursion limit (input nested too deeply?); "
                            f"rerun with QL_DEBUG=1 for the traceback and report it"), 1
    if isinstance(exc, MemoryError):
        return "internal", f"`ql {command}` ran out of memory; free memory or lower limits, then retry", 1
    text = _one_line(str(exc))[:300]
    where = f"`ql {command}`" if command else "ql"
    return "internal", (f"internal error in {where}: {type(exc).__name__}" + (f": {text}" if text else "")
                        + "; this is a bug: rerun with QL_DEBUG=1 for the traceback and report it"), 1


def _explain_database(exc: BaseException) -> str | None:
    """The one line for a SQLite error that reached us raw (or wrapped by SQLAlchemy): a damaged file
    or a full or read-only disk, named with the database this command configured."""
    import sqlite3

    from ql_core.cli.common import loaded_sqlite_path
    from ql_core.db.integrity import explain_sqlite_error

    orig = exc if isinstance(exc, sqlite3.Error) else getattr(exc, "orig", None)
    return explain_sqlite_error(orig, loaded_sqlite_path()) if isinstance(orig, sqlite3.Error) else None


def _known_family(exc: BaseException) -> str | None:
    """Errors of ql's stores whose messages are written for users (one line naming the fix)."""
    from ql_core.ports.journal import StoreError
    from ql_core.ports.receipt_store import ReceiptStoreError

    if isinstance(exc, StoreError):
        return "database"
    if isinstance(exc, ReceiptStoreError):
        return "receipts"
    if type(exc).__name__ == "CursorStuckError":
        return "database"
    mod = type(exc).__module__ or ""
    if mod.startswith("ql_plugins.cluster_fenced") and type(exc).__name__.endswith("Error"):
        return "database"
    if mod.startswith(("sqlite3", "psycopg", "sqlalchemy")):
        return "database"
    return None


def _ensure_std_fds() -> None:
    """Give closed stdin/stdout/stderr a /dev/null, before anything else opens a file.

    A command started with ``>&-`` would otherwise hand fd 1 to the first file ql opens — the
    run database, a log — and our output would be written into it.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    import io

    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            raw = io.FileIO(fd, mode, closefd=False)
            stream = io.TextIOWrapper(raw if mode == "r" else io.BufferedWriter(raw), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=mode == "w")
            setattr(sys, name, stream)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ql`` command; returns (and exits with) its status."""
    _ensure_std_fds()
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = _peek_command(args_in)
    early = first in _EARLY_STOP_COMMANDS or (first is not None and first not in COMMANDS)
    if early:
        # First thing: a SIGTERM while we import and open the database must stop us cleanly.
        from ql_core.cli.common import install_early_stop

        install_early_stop()
    json_mode = _wants_json(args_in)
    command: str | None = None
    debug = os.environ.get("QL_DEBUG", "") not in ("", "0")
    try:
        peeked = _peek_command(args_in)
        args = _plain_run(args_in) if peeked == "run" else None
        if args is None:
            from ql_core.cli.parser import Parser

            Parser.json_errors = json_mode
            args = build_parser(peeked).parse_args(args_in)
        command = args.command
        if early and command not in _EARLY_STOP_COMMANDS and not getattr(args._module, "STOPS_ON_SIGNALS", False):
            from ql_core.cli.common import release_early_stop

            release_early_stop()
        from ql_core.cli.output import Output

        out = Output(json_mode=bool(args.json))
        if os.environ.get("QL_LOG_LEVEL"):
            from ql_core.log import enable_logging

            enable_logging(os.environ["QL_LOG_LEVEL"])
        return int(args._module.run(args, out))
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `ql list | head`: the reader left; not an error of ours.
        silence_stdout()
        return 0
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, never a traceback
        kind, message, code = classify(exc, command)
        if debug and kind == "internal":  # an expected failure's line is the whole story
            import traceback

            traceback.print_exc()
        _report(message, kind=kind, exit_code=code, json_mode=json_mode)
        return code


def console_main() -> NoReturn:
    """The ``ql`` executable: :func:`main`, then exit without the interpreter's teardown.

    Everything a command writes is committed (the database) or flushed (stdout, stderr) before
    it returns; tearing down every module and object would only cost time (a few ms per command).
    A one-shot ``ql run`` (and a read) starts with the cyclic garbage collector off (``defer_gc``: it
    would only traverse what start-up imports); ``ql run`` turns it back on before it waits for its task.
    """
    if _peek_command(sys.argv[1:]) in _GC_DEFERRED_COMMANDS:
        from ql_core.cli.common import defer_gc

        defer_gc()
    status = main()
    common = sys.modules.get("ql_core.cli.common")
    if common is not None:
        common.close_opened()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            if stream is sys.stdout:
                silence_stdout()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(status if 0 <= status <= 255 else 1)


if __name__ == "__main__":
    console_main()
