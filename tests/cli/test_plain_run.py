"""A plain ``ql run -- CMD`` is read without building the parser (``ql_core.cli.main._plain_run``):
the arguments are exactly argparse's, and every other command line still goes to argparse."""

from __future__ import annotations

import pytest

from ql_core.cli.main import _plain_run, build_parser

PLAIN = [
    ["run", "--", "true"],
    ["run", "--", "sh", "-c", "exit 3"],
    ["run", "--", "--"],
    ["run", "--", "run", "--", "x"],
    ["run", "--", ""],
    ["run", "--", "ls", "--help", "-x", "--json"],
    ["--json", "run", "--", "true"],
    ["--json", "--json", "run", "--", "true"],
    ["--data-dir", "/d", "run", "--", "true"],
    ["--data-dir", "", "run", "--", "true"],
    ["--data-dir", "run", "run", "--", "true"],
    ["--config", "c.toml", "--profile", "edge", "--data-dir", "/d", "--json", "run", "--", "echo", "hi"],
    ["--profile", "standalone", "run", "--", "true"],
    ["--data-dir", "/d e/f", "run", "--", "a b"],
]

#: Left to argparse: options of ``run`` itself, other spellings, errors, other commands.
OTHERS = [
    ["run", "--"],
    ["run", "true"],
    ["run", "--detach", "--", "true"],
    ["run", "--timeout", "5", "--", "true"],
    ["run", "--data-dir", "/d", "--", "true"],
    ["--data", "/d", "run", "--", "true"],
    ["--data-dir=/d", "run", "--", "true"],
    ["--data-dir", "/a", "--data-dir", "/b", "run", "--", "true"],
    ["--data-dir", "-d", "run", "--", "true"],
    ["--data-dir"],
    ["--verbose", "run", "--", "true"],
    ["-h", "run", "--", "true"],
    ["status", "--", "x"],
    ["list"],
    [],
]


@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_a_plain_run_gets_argparses_arguments(argv: list[str]) -> None:
    plain = _plain_run(argv)
    assert plain is not None
    assert vars(plain) == vars(build_parser("run").parse_args(argv))


@pytest.mark.parametrize("argv", OTHERS, ids=lambda a: " ".join(a) or "(none)")
def test_anything_else_goes_to_the_parser(argv: list[str]) -> None:
    assert _plain_run(argv) is None
