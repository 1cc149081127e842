"""Session-wide test set-up shared by tests/ and examples/*/tests (this file is pytest's, not ql's).

A suite started in the background (``setsid nohup python -m pytest … &``, a non-interactive
shell's ``&``) inherits SIGHUP, SIGINT and SIGQUIT **ignored**, and an ignored disposition
survives fork and exec into every process a test starts. Tests that send one of them to a process
they started directly (a shell script, a bare launcher, a helper host) would then wait for a death
that never comes. That is an artefact of how the suite was started, not of the product: ql's
launcher resets every signal for the command it runs (docs/launcher.md, "What the command starts
with"), which tests/launcher/test_launcher_protections.py checks with signals ignored on purpose.
So the suite restores the dispositions a foreground run has, once, before any test starts.
"""

from __future__ import annotations

import os
import signal

__all__: list[str] = []

_RESET = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)


def _restore_inherited_ignored_signals() -> None:
    for sig in _RESET:
        if signal.getsignal(sig) is signal.SIG_IGN:
            # SIGINT: Python's own handler (KeyboardInterrupt, so ^C still stops pytest); children
            # exec'd from here then start with the default, as in a foreground run.
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


_restore_inherited_ignored_signals()


# The suite starts `ql` thousands of times in child processes. With PYTHONDONTWRITEBYTECODE set (common
# in container images and CI shells) no child may write a bytecode cache, so every one recompiles
# ql's modules from source: about 2-3x the CPU of each start. The children of the test run write
# and reuse caches as an installed package does (into the checkout's git-ignored __pycache__).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_xdist_auto_num_workers(config: object) -> int:
    """``-n auto``: two workers more than this process may use CPUs. Most tests spend their time
    waiting on real processes, timers and fsyncs, not computing: with one worker per CPU an idle
    two-core machine ran the suite at about half its CPU time (850 s of CPU in 800 s of wall), so
    two more workers fill what the waiting leaves. ``-n N`` still gives exactly N."""
    return len(os.sched_getaffinity(0)) + 2
