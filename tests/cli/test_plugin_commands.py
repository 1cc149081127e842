"""`ql_register_commands`: a plugin's command is a `ql` command (real entry points, real `ql`)."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_support import ql_proc

HELLO = '''"""A third-party plugin with one command and one `ql db` action."""
import types

from ql_core.hookspecs import hookimpl

hello = types.SimpleNamespace(
    HELP="say hello (a test plugin's command)",
    EXIT_CODES=[("0", "said hello"), ("3", "refused to")],
    configure=lambda parser: parser.add_argument("--to", default="world"),
    run=lambda args, out: (out.emit({"hello": args.to}, f"hello {args.to}"), 3 if args.to == "nobody" else 0)[1],
)
vacuum = types.SimpleNamespace(HELP="vacuum WHAT: a test action", TARGET="WHAT",
                               run=lambda args, target, out: (out.emit({"vacuumed": target}, target), 0)[1])


@hookimpl
def ql_register_commands(register):
    register("hello", lambda: hello)
    register("db vacuum", vacuum)
'''

CLASH = '''from ql_core.hookspecs import hookimpl


@hookimpl
def ql_register_commands(register):
    register("status", lambda: None)
'''


def _site(root: Path, name: str, source: str) -> str:
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[ql.plugins]\n{name} = {name}_mod\n")
    (root / f"{name}_mod.py").write_text(source)
    return str(root)


def test_a_plugin_command_runs_and_is_listed(ql_env, tmp_path: Path) -> None:
    env = dict(ql_env, PYTHONPATH=_site(tmp_path / "site", "ql_hello", HELLO))
    out = ql_proc(["--json", "hello", "--to", "you"], env)
    assert (out.returncode, out.stderr) == (0, "")
    assert json.loads(out.stdout) == {"hello": "you"}
    assert ql_proc(["hello", "--to", "nobody"], env).returncode == 3  # its own exit status
    helped = ql_proc(["hello", "--help"], env)
    assert helped.returncode == 0 and "say hello" in helped.stdout and "  3     refused to" in helped.stdout
    top = ql_proc(["--help"], env).stdout
    assert "hello" in top and top.index("workers") < top.index("hello")  # after the bundled ones
    action = ql_proc(["db", "vacuum", "logs"], env)
    assert (action.returncode, action.stdout.strip()) == (0, "logs"), action.stderr
    assert "vacuum WHAT: a test action" in " ".join(ql_proc(["db", "--help"], env).stdout.split())
    disabled = ql_proc(["hello"], dict(env, QL_DISABLE_PLUGINS="ql_hello"))
    assert disabled.returncode == 2 and "invalid choice: 'hello'" in disabled.stderr


def test_a_plugin_may_not_take_a_core_command(ql_env, tmp_path: Path) -> None:
    env = dict(ql_env, PYTHONPATH=_site(tmp_path / "site", "ql_clash", CLASH))
    out = ql_proc(["--help"], env)
    assert out.returncode == 2, out.stdout
    (line,) = out.stderr.splitlines()
    assert "'status' is registered twice" in line and "QL_DISABLE_PLUGINS=ql_clash" in line


def test_a_broken_plugin_is_named_when_its_command_is_asked_for(ql_env, tmp_path: Path) -> None:
    env = dict(ql_env, PYTHONPATH=_site(tmp_path / "site", "ql_broken", "raise ImportError('no such thing')\n"))
    assert ql_proc(["--help"], env).returncode == 0  # the others still work
    out = ql_proc(["frobnicate"], env)
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert "ql_broken" in line and "no such thing" in line and "QL_DISABLE_PLUGINS=ql_broken" in line


NAP = '''"""A plugin command that does not stop on signals (no STOPS_ON_SIGNALS): a TERM ends it as always."""
import os
import time
import types

from ql_core.hookspecs import hookimpl


def _run(args, out):
    open(os.environ["NAP_MARKER"], "w").close()
    time.sleep(120)
    return 0


nap = types.SimpleNamespace(HELP="sleep (a test plugin's command)", configure=lambda parser: None, run=_run)


@hookimpl
def ql_register_commands(register):
    register("nap", nap)
'''


def test_a_plugin_command_that_does_not_stop_on_signals_gets_the_default_handlers_back(ql_env, tmp_path: Path
                                                                                      ) -> None:
    """ql arms its early stop handler for every plugin command (it cannot know yet which one runs
    until SIGTERM); a command without ``STOPS_ON_SIGNALS`` gets the default handlers back before it
    runs, so a TERM ends it as it would any program."""
    import signal
    import subprocess

    from ql_core.testing.executor import wait_until
    from tests.conftest import QL

    marker = tmp_path / "napping"
    env = dict(ql_env, PYTHONPATH=_site(tmp_path / "site", "ql_nap", NAP), NAP_MARKER=str(marker))
    proc = subprocess.Popen([*QL, "nap"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(marker.exists, "the plugin command to run", 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_signal_caught_before_the_command_was_known_is_delivered_again_on_release() -> None:
    import subprocess
    import sys

    code = ("import os, signal\n"
            "from ql_core.cli.common import early_stop, install_early_stop, release_early_stop\n"
            "install_early_stop()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "print('caught', early_stop().is_set(), flush=True)\n"
            "release_early_stop()\n"
            "print('not reached', flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -15 and out.stdout == "caught True\n", out
