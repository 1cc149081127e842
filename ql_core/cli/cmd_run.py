"""``ql run``: submit a command, stream its log, exit with its exit code.

124 timed out, 130 cancelled, 75 lost. Ctrl-C cancels the run (a second
Ctrl-C detaches: 125). Killing ``ql run`` itself leaves the task running.
When our stdout goes away (``ql run ... | head -1``), streaming stops and
``ql run`` keeps waiting: it still exits with the task's code.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

from ql_core.cli.output import Output, silence_stdout

if TYPE_CHECKING:
    import argparse

    from ql_core.node import Node

HELP = "run a command crash-safely: ql run [--timeout S] [--name N] [--detach] -- CMD [ARG...]"
EPILOG = ("The task's stdin is /dev/null and it has no terminal: `echo x | ql run -- cat` prints nothing "
          "(ql warns when its own stdin holds data). Give input as a file argument, or --shell 'cmd < FILE'. "
          "The task's output (stdout and stderr, merged) streams to our stdout; ql's own notes go to stderr "
          "(--json: one JSON object per note). "
          "Ctrl-C commits a cancel intent (the run ends cancelled unless the task had already finished); "
          "a second Ctrl-C detaches. If our stdout is closed or its reader leaves, streaming stops and we "
          "keep waiting. The log stays on disk: ql logs RUN_ID.")
#: ``ql run`` stopped waiting (second Ctrl-C); the run goes on. Distinct from 130 (the run was cancelled).
EXIT_DETACHED = 125
#: Every option's value when it is not given: :func:`configure` declares them with these, and
#: ``ql_core.cli.main`` builds the arguments of a plain ``ql run -- CMD`` from them without argparse.
DEFAULTS: dict[str, object] = {"timeout": None, "name": None, "detach": False, "shell": False, "cwd": None,
                               "env": None, "retries": 0, "many": None}


def configure(parser: argparse.ArgumentParser) -> None:
    import argparse  # here: a plain ql run is read without argparse (ql_core.cli.main._plain_run)

    parser.add_argument("--timeout", type=float, default=DEFAULTS["timeout"], metavar="S",
                        help="persisted deadline in seconds")
    parser.add_argument("--name", default=DEFAULTS["name"], metavar="N", help="a label for the run")
    parser.add_argument("--detach", action="store_true", default=DEFAULTS["detach"],
                        help="submit and return at once")
    parser.add_argument("--shell", action="store_true", default=DEFAULTS["shell"],
                        help="run one string with /bin/sh -c")
    parser.add_argument("--cwd", default=DEFAULTS["cwd"], metavar="DIR", help="working directory of the task")
    parser.add_argument("--env", action="append", default=DEFAULTS["env"], metavar="K=V|K",
                        help="add K=V to the task's environment (K alone: copy K from ours); repeatable")
    parser.add_argument("--retries", type=int, default=DEFAULTS["retries"], metavar="N",
                        help="cluster only: run again up to N times after a lost attempt (for tasks safe to "
                             "run twice)")
    parser.add_argument("--many", default=DEFAULTS["many"], metavar="FILE",
                        help="with --detach: submit one run per line of a JSON-lines FILE (- for stdin), e.g. "
                             '{"command": ["prog", "arg"], "name": "N", "timeout": 60}; prints the run ids in order')
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import printable, runtime_from_args, start_up_over
    from ql_core.cli.notes import note
    from ql_core.errors import UsageError
    from ql_core.states import exit_status_for

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.many is not None:
        return _run_many(args, command, out)
    if not command:
        raise UsageError("nothing to run: ql run [options] -- CMD [ARG...]")
    if args.shell and len(command) != 1:
        raise UsageError("--shell runs exactly one string: ql run --shell -- 'CMD ARG | CMD2'")
    if args.timeout is not None and not (0 < args.timeout <= 366 * 24 * 3600):
        raise UsageError("--timeout must be a positive number of seconds (at most a year)")
    from ql_core.cli.env_options import parse_env_options

    env_add = parse_env_options(args.env, os.environ)
    rt = runtime_from_args(args)
    interrupts = {"n": 0, "cancelled": False}

    def on_sigint(_signum: int, _frame: object) -> None:
        interrupts["n"] += 1

    # Installed before submit: a Ctrl-C while the task starts must cancel it, not orphan it.
    previous = signal.signal(signal.SIGINT, on_sigint) if not args.detach else None
    if args.retries < 0:
        raise UsageError("--retries must be >= 0")
    sub = rt.submit(command, shell=args.shell, name=args.name, timeout_s=args.timeout, cwd=args.cwd,
                    max_attempts=args.retries + 1, awaited=not args.detach, env_add=env_add)
    start_up_over()  # the task runs: the garbage collector is back on for the wait, however long
    # From here on the run exists: a reader that leaves our stdout must not change our exit status.
    out.tolerate_broken_pipe = True
    if _stdin_holds_data():
        note(out.json_mode, "stdin_ignored", "ql: warning: the task's stdin is /dev/null: the data on ql's stdin "
             "is not passed on (give it as a file argument, or --shell 'CMD < FILE')", run_id=sub.run_id)
    state = "queued" if sub.attempt_id is None else "running"
    if args.detach:
        out.emit({"run_id": sub.run_id, "attempt_id": sub.attempt_id, "status": state},
                 sub.run_id)  # the bare id: RUN=$(ql run --detach -- ...)
        return 0
    if out.json_mode:
        out.emit({"run_id": sub.run_id, "attempt_id": sub.attempt_id, "status": state})
    shipped = streamer = None
    if not out.json_mode and sub.task is None and rt.config.artifact_store:
        from ql_core.cli.run_stream import ShippedStreamer

        shipped = streamer = ShippedStreamer(rt, sub.run_id)  # a worker runs it: from the shipped chunks
    elif not out.json_mode and sub.log_artifact_id is not None:
        streamer = _LogStreamer(rt.node, sub.log_artifact_id)

    def on_tick() -> None:
        if streamer is not None:
            streamer.pump()
        if interrupts["n"] >= 2:
            note(out.json_mode, "detached", f"ql: detached; run {sub.run_id} goes on (ql status / ql cancel)",
                 run_id=sub.run_id)
            raise SystemExit(EXIT_DETACHED)
        if interrupts["n"] == 1 and not interrupts["cancelled"]:
            interrupts["cancelled"] = True
            note(out.json_mode, "cancelling", f"ql: cancelling run {sub.run_id} (Ctrl-C again to detach)",
                 run_id=sub.run_id)
            rt.cancel(sub.run_id, "user")

    try:
        while shipped is not None and not shipped.done:
            on_tick()  # streams until the run ended and its log is drained; then the wait is a look
        view = rt.wait(sub, on_tick=on_tick)
    finally:
        signal.signal(signal.SIGINT, previous)
        if shipped is not None:
            shipped.close()
    if streamer is not None:
        streamer.pump(drain=True)
    status = exit_status_for(view.status, view.exit_code)
    _note_truncated(rt, sub.log_artifact_id, out.json_mode, view.run_id)
    if out.json_mode:
        out.emit({"run_id": view.run_id, "attempt_id": sub.attempt_id, "status": view.status,
                  "exit_code": view.exit_code, "reason": view.reason})
    elif view.status not in ("succeeded", "failed"):
        # stdout is the task's output; our own verdict goes to stderr.
        note(False, "ended", f"ql: run {view.run_id} ended {view.status}"
             + (f" ({printable(view.reason)})" if view.reason else ""))
    return status


def _run_many(args: argparse.Namespace, command: list[str], out: Output) -> int:
    """``--many FILE``: the runs come from the file's lines, each with its own options."""
    from ql_core.cli.common import runtime_from_args, start_up_over
    from ql_core.cli.run_many import submit_file
    from ql_core.errors import UsageError

    start_up_over()  # a file of any length: its submits run with the garbage collector on
    if not args.detach:
        raise UsageError("--many submits and returns: give --detach too (then ql wait RUN_ID for any of them)")
    given = [flag for flag, value in (("--timeout", args.timeout), ("--name", args.name), ("--shell", args.shell),
                                      ("--cwd", args.cwd), ("--env", args.env), ("--retries", args.retries))
             if value]
    if command or given:
        raise UsageError("with --many each line of the file is a whole run: put "
                         + (f"{', '.join(given)} into the lines" if given else "the command into the lines")
                         + ' (keys "command", "name", "timeout", "shell", "cwd", "env", "retries")')
    return submit_file(runtime_from_args(args), args.many, out)


def _note_truncated(rt: object, log_artifact_id: str | None, json_mode: bool, run_id: str) -> None:
    """One note when the task wrote more than its log quota (the ``log.truncated`` event)."""
    if log_artifact_id is None:
        return
    from ql_core.cli.notes import note
    from ql_core.logs import log_facts

    facts = log_facts(rt.node, log_artifact_id)  # type: ignore[attr-defined]
    if facts is not None and facts.truncated:
        note(json_mode, "log_truncated", f"ql: the task's output was truncated at {facts.max_bytes} bytes "
             f"(log_max_bytes); later output was dropped", run_id=run_id, max_bytes=facts.max_bytes)


def _stdin_holds_data() -> bool:
    """Is ql's stdin a pipe or socket with bytes waiting, or a regular file with bytes left?"""
    import stat

    try:
        st = os.fstat(0)
        if stat.S_ISREG(st.st_mode):
            return st.st_size > os.lseek(0, 0, os.SEEK_CUR)
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            # Imported only for a pipe: a terminal or /dev/null (cron, most hosts) never pays termios.
            import fcntl
            import struct
            import termios

            pending = fcntl.ioctl(0, termios.FIONREAD, struct.pack("i", 0))
            return struct.unpack("i", pending)[0] > 0
    except OSError:
        pass
    return False


def _note(line: str) -> None:
    """A line of ours on stderr; a closed stderr never changes the outcome."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _LogStreamer:
    """Copies new bytes of the task's log to our stdout; never blocks the task (it writes a file).

    Reads stop at the artifact's quota: bytes past it are about to be cut, so nobody sees them.
    """

    def __init__(self, node: Node, log_artifact_id: str) -> None:
        from ql_core.logs import log_facts

        self._data_dir = node.config.data_dir
        self._log_id = log_artifact_id
        facts = log_facts(node, log_artifact_id)
        self._max_bytes = facts.max_bytes if facts is not None else None
        self._offset = 0
        #: Our stdout went away (its reader left), or the log file was replaced: stop streaming,
        #: keep waiting for the task.
        self.stopped = False

    def pump(self, *, drain: bool = False) -> None:
        from ql_core.errors import UnsafePathError
        from ql_core.logs import LOG_CHUNK_BYTES, read_log_chunk

        while not self.stopped:
            try:
                chunk = read_log_chunk(self._data_dir, self._log_id, self._offset, max_bytes=self._max_bytes)
            except UnsafePathError as exc:
                # Something replaced the log (a FIFO, a directory...): stop streaming, keep waiting.
                self.stopped = True
                _note(f"ql: not streaming the log any more: {exc}")
                return
            if not chunk:
                return
            self._offset += len(chunk)
            try:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            except (BrokenPipeError, ValueError):
                self._stop()
                return
            except OSError as exc:
                import errno

                if exc.errno not in (errno.EPIPE, errno.EBADF):
                    raise
                self._stop()
                return
            if not drain and len(chunk) < LOG_CHUNK_BYTES:
                return

    def _stop(self) -> None:
        self.stopped = True
        silence_stdout()  # the rest of our output (and Python's final flush) goes nowhere
