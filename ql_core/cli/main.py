"""Entry point of the ``ql`` command (contract: DESIGN.md §7).

Parsing is cheap and imports nothing heavy; each command's module is imported
only when it runs, so ``ql --help`` and ``ql plugins`` never load SQLAlchemy.
Expected failures (:class:`~ql_core.errors.QlError`) print one line on stderr
and exit with their code (2 for usage and config errors); no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, Sequence

__all__ = ["main", "build_parser", "COMMANDS"]

#: subcommand -> module; each module defines ``configure(parser)`` and ``run(args, out) -> int``.
COMMANDS: dict[str, str] = {
    "run": "ql_core.cli.cmd_run",
    "status": "ql_core.cli.cmd_status",
    "events": "ql_core.cli.cmd_events",
    "list": "ql_core.cli.cmd_list",
    "logs": "ql_core.cli.cmd_logs",
    "cancel": "ql_core.cli.cmd_cancel",
    "reconcile": "ql_core.cli.cmd_reconcile",
    "supervise": "ql_core.cli.cmd_supervise",
    "worker": "ql_core.cli.cmd_worker",
    "control": "ql_core.cli.cmd_control",
    "audit": "ql_core.cli.cmd_audit",
    "plugins": "ql_core.cli.cmd_plugins",
    "doctor": "ql_core.cli.cmd_doctor",
    "db": "ql_core.cli.cmd_db",
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (usage errors exit 2, no usage dump)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--data-dir", default=default, metavar="DIR",
                        help="data directory (env QL_DATA_DIR)")
    parser.add_argument("--config", default=default, metavar="FILE",
                        help="TOML config (env QL_CONFIG; default ./ql.toml if present)")
    parser.add_argument("--profile", default=default, metavar="NAME",
                        help="edge | standalone | cluster-control | cluster-worker (env QL_PROFILE)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="machine-readable output: one JSON object per line")


def build_parser() -> argparse.ArgumentParser:
    """The full parser; cheap, imports only the small command modules."""
    from ql_core import __version__

    parser = _Parser(prog="ql", description="Run local commands so that nothing is lost when the host dies.")
    parser.add_argument("--version", action="version", version=f"ql {__version__}")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # a command whose module is not part of this build
            raise
        child = sub.add_parser(name, help=module.HELP, description=module.HELP)
        _global_options(child, suppress=True)
        module.configure(child)
        child.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ql`` command; returns (and exits with) its status."""
    from ql_core.cli.output import Output
    from ql_core.errors import QlError

    args = build_parser().parse_args(argv)
    out = Output(json_mode=bool(args.json))
    if os.environ.get("QL_LOG_LEVEL"):
        from ql_core.log import enable_logging

        enable_logging(os.environ["QL_LOG_LEVEL"])
    try:
        status = int(args._module.run(args, out))
    except QlError as exc:
        sys.stderr.write(f"ql: error: {exc}\n")
        status = exc.exit_code
    except KeyboardInterrupt:
        status = 130
    except BrokenPipeError:
        # `ql logs ... | head`: the reader left; not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 0
    return status


def console_main() -> NoReturn:
    raise SystemExit(main())


if __name__ == "__main__":
    console_main()
