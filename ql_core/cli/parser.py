"""The ``ql`` command's argparse parser (contract: ``docs/cli.md``), apart from ``ql_core.cli.main``
so that a plain ``ql run -- CMD``, which ``main`` reads without a parser, never imports argparse.
``main`` hands it the commands, their exit codes and its one-line error reporter."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, NoReturn, Sequence

__all__ = ["Parser", "build_parser"]

#: A command's exit codes for its ``--help``: (name, module) -> [(code, meaning)].
ExitRows = Callable[[str, object], Sequence[tuple[str, str]]]
#: Reports a usage error (message, prog, json mode): one line on stderr.
UsageReporter = Callable[[str, str, bool], None]


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, as argparse's formatter asks it, without importing
    shutil (and its bz2, lzma, zlib): argparse builds a formatter for every option it adds, so every
    command paid ~3 ms for a width only ``--help`` uses."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return columns


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (usage errors exit 2, no usage dump)."""

    #: ``--json`` was given: a usage error is one JSON object (``ql_core.cli.main`` sets it).
    json_errors = False
    #: Set by :func:`build_parser` (the parser's subparsers are made by argparse, without them).
    exit_rows: ExitRows | None = None
    report_usage: UsageReporter | None = None
    #: (command name, module) whose epilog :meth:`format_help` writes first: wrapping it (textwrap)
    #: is for ``--help`` only, not for every command's start.
    _epilog_of: tuple[str, object] | None = None

    def format_help(self) -> str:
        if self._epilog_of is not None:
            self.epilog, self._epilog_of = _command_epilog(self.epilog, *self._epilog_of), None
        return super().format_help()

    def _get_formatter(self) -> argparse.HelpFormatter:
        return self.formatter_class(prog=self.prog, width=_terminal_columns() - 2)

    def error(self, message: str) -> NoReturn:
        if Parser.report_usage is not None:
            Parser.report_usage(message, self.prog, Parser.json_errors)
        raise SystemExit(2)


def _command_epilog(own: str | None, name: str, module: object) -> str:
    """A command's ``--help`` epilog: its module's ``EPILOG`` (or what ``configure`` set), wrapped,
    then its exit codes."""
    extra = getattr(module, "EPILOG", None) or own
    if extra:
        import textwrap

        extra = "\n\n".join(textwrap.fill(p, 78) for p in extra.split("\n\n"))
    return (f"{extra}\n\n" if extra else "") + _exit_epilog(name, module)


def _exit_epilog(name: str, module: object) -> str:
    rows = Parser.exit_rows(name, module) if Parser.exit_rows is not None else ()
    return "exit codes:\n" + "\n".join(f"  {code:<5} {text}" for code, text in rows)


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--data-dir", default=default, metavar="DIR",
                        help="data directory (env QL_DATA_DIR; default $XDG_STATE_HOME/ql or ~/.local/state/ql)")
    parser.add_argument("--config", default=default, metavar="FILE",
                        help="TOML config (env QL_CONFIG; default ./ql.toml if present)")
    parser.add_argument("--profile", default=default, metavar="NAME",
                        help="edge | standalone | cluster-control | cluster-worker (env QL_PROFILE)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="machine-readable output: one JSON object per line (errors: one on stderr)")


def build_parser(commands: Sequence[tuple[str, object]], *, exit_rows: ExitRows,
                 report_usage: UsageReporter) -> argparse.ArgumentParser:
    """The parser of ``commands`` ((name, module), in ``--help`` order; each module has ``HELP``,
    ``configure(parser)`` and ``run``); ``exit_rows`` gives each one's exit codes for its ``--help``,
    ``report_usage`` writes a usage error."""
    from ql_core import __version__

    Parser.exit_rows, Parser.report_usage = exit_rows, report_usage
    parser = Parser(prog="ql", description="Run local commands so that nothing is lost when the host dies.",
                     epilog="Each command's --help lists its exit codes. Errors are one line on stderr; "
                            "QL_DEBUG=1 adds the traceback of an internal error. Docs: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"ql {__version__}")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name, module in commands:
        child = sub.add_parser(name, help=module.HELP, description=module.HELP,  # type: ignore[attr-defined]
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        _global_options(child, suppress=True)
        module.configure(child)  # type: ignore[attr-defined]
        child._epilog_of = (name, module)  # type: ignore[attr-defined]
        child.set_defaults(_module=module)
    return parser
