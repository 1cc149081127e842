"""Spawn the POSIX launcher (``launcher.sh``) for one task attempt.

The launcher contract (see the header of ``launcher.sh``)::

    SHELL launcher.sh SHARD_DIR RUN_ID ATTEMPT_ID CALLBACK_SEQUENCE STARTED_AT_MS MODE [LIMITS] -- CMD [ARG...]

``LIMITS`` (:func:`limits_word`) carries what the launcher enforces itself — the deadline on the
boot clock, the KILL after a TERM's grace, the log quota — and how long an acknowledged publisher
waits for "ok" (docs/launcher.md, "Protections"). Numbers only: no secret, no command.

stdin is ``/dev/null``, stdout and stderr are the task's log descriptor, and the callback token arrives
on file descriptor 3 as one line, so it is never in any process's argv or environment.

How the pipe becomes fd 3: ``subprocess`` remaps only fds 0-2 (``pass_fds`` keeps a descriptor's
number, and the pipe gets whatever number the kernel hands out, rarely 3 in a real host), and a
``preexec_fn`` doing ``dup2`` is unsafe in a threaded host. Passing ``N`` and letting the shell do
``exec 3<&N`` fails too: dash only accepts single-digit descriptors in redirections. So the pipe is
handed over as the *stdin* of a one-line trampoline run by the same shell,
``sh -c 'exec 3<&0 0</dev/null; exec "$@"' ql-launcher sh launcher.sh ...``, which moves it to fd 3,
points stdin at ``/dev/null`` and execs the launcher in the same process - same pid, so the session
and group leader the host records is the launcher itself. The price is one extra exec of the shell.
The token is written into the pipe and the write end closed before the spawn: at most 129 bytes fit
the pipe buffer, and the launcher's ``read`` ends at the newline even if the host dies at once.

The executor's path (``hold=True``) skips the trampoline: the launcher's ``c`` flag tells it the
channel is on stdin, and it moves it to fd 3 itself. With ``awaited=True`` the channel is one end
of a ``socketpair`` that stays open after the token (flag ``a``, acknowledged completion): the
launcher exits with the command's status and leaves a publisher behind that publishes the receipt
only if the host does not send ``ok`` (see :func:`acknowledge`). A socket, unlike a pipe, cannot be
reopened through ``/proc/PID/fd`` (ENXIO), so a task cannot reach either end of it.

A *standby* launcher (compiled only: :func:`spawn_standby`) is started before any run exists, with
nothing of one: ``ql-launcher --standby``, its channel a ``SOCK_SEQPACKET`` socketpair on stdin.
Its identity is therefore known before the run's create commit, which records it, and the run
reaches it afterwards in one message (:func:`standby_message`, :func:`hand_over`): ids, command,
working directory, environment and token, with the log and the host's working directory as
descriptors. That message is the go-ahead too; the launcher's format is in launcher.c.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ql_core.ids import is_uuid7
from ql_core.lean_tuple import LeanNamedTuple
from ql_core.receipts.codec import MAX_SAFE_INTEGER, TOKEN_PATTERN

__all__ = [
    "MAX_SAFE_INTEGER",
    "TOKEN_PATTERN",
    "LaunchMode",
    "ACK_WAIT_MS",
    "Limits",
    "limits_word",
    "launcher_args",
    "launcher_path",
    "spawn_launcher",
    "release",
    "acknowledge",
    "LAUNCH_FLAGS",
    "STANDBY_SPEC_MAX",
    "spawn_standby",
    "standby_capacity",
    "EncodedTask",
    "encode_task",
    "standby_message",
    "standby_message_size",
    "hand_over",
]

LaunchMode = Literal["argv", "shell"]

#: The launcher's mode flags (after ``MODE+``): ``c`` channel on stdin, ``e`` GNU env known to reset
#: signals, ``p`` printf known to be a builtin, ``a`` acknowledged completion (launcher.sh header).
LAUNCH_FLAGS = "cepa"

# The launcher accepts exactly what the receipt codec accepts: one definition of each.

#: The largest spec message a standby launcher takes (launcher.c ``SPEC_MAX``); a larger task is
#: spawned the classic way. Well under the default socket send buffer, so a send never blocks.
STANDBY_SPEC_MAX = 192 * 1024
_STANDBY_MAGIC = b"ql-standby-2"

#: How long an acknowledged launcher's publisher waits for the host's "ok" before it publishes the
#: receipt anyway (launcher.c ``ACK_WAIT_MS_DEFAULT``, launcher.sh): a frozen host (SIGSTOP, a hung
#: disk) must not keep a finished task's receipt back for ever. A receipt published after this and
#: a status the host commits later are the same completion: the consumer discards the duplicate.
ACK_WAIT_MS = 30_000


class Limits(LeanNamedTuple):
    """What a launcher enforces itself (None: not enforced). ``start_boot_ms`` is CLOCK_BOOTTIME at
    the attempt's committed start; ``timeout_ms`` counts from it on that clock."""

    start_boot_ms: int | None = None
    timeout_ms: int | None = None
    grace_ms: int | None = None
    quota_bytes: int | None = None
    ack_wait_ms: int = ACK_WAIT_MS


def limits_word(limits: Limits) -> str:
    """The ``LIMITS`` word: ``START_BOOT_MS,TIMEOUT_MS,GRACE_MS,QUOTA_BYTES,ACK_WAIT_MS``, each a
    canonical integer or empty for none (launcher.c, "LIMITS"). ``ValueError`` for a bad value."""
    fields = []
    for name, value in zip(Limits._fields, limits, strict=True):
        if value is None:
            fields.append("")
            continue
        _check_int(name, value, 0)
        fields.append(str(value))
    return ",".join(fields)

# Moves the token pipe from stdin to fd 3, makes stdin /dev/null, then execs the launcher in place.
_TRAMPOLINE = 'exec 3<&0 0</dev/null; exec "$@"'


_LAUNCHER_PATH: str | None = None


def launcher_path() -> str:
    """Absolute path of the packaged ``launcher.sh`` (found once per process).

    Tasks outlive the host, so the script must be a real file that stays put: a zipped install
    (which ``importlib.resources.as_file`` would extract to a temporary copy) is refused.
    """
    global _LAUNCHER_PATH
    if _LAUNCHER_PATH is not None:
        return _LAUNCHER_PATH
    # Next to this module: a zipped install has no such plain file and is refused below.
    path = os.path.abspath(os.path.join(os.path.dirname(__file__), "launcher.sh"))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"launcher.sh is not a regular file at {path!r}")
    _LAUNCHER_PATH = path
    return path


def _shell_argv(shell: str | Sequence[str]) -> list[str]:
    argv = [shell] if isinstance(shell, str) else list(shell)
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise ValueError("shell must be a path or a non-empty argv prefix such as ('busybox', 'sh')")
    return argv


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int")
    if not minimum <= value <= MAX_SAFE_INTEGER:
        raise ValueError(f"{name} must be in {minimum}..2**53-1")


def _check_attempt(shard_dir: str | os.PathLike[str], run_id: str, attempt_id: str, callback_sequence: int,
                   started_at_ms: int) -> str:
    """What every launcher checks of an attempt, as the receipt codec does; the shard as a str."""
    shard = os.fspath(shard_dir)
    if not os.path.isabs(shard) or "\0" in shard:
        raise ValueError("shard_dir must be absolute")
    if not is_uuid7(run_id) or not is_uuid7(attempt_id):
        raise ValueError("run_id and attempt_id must be lowercase UUIDv7 strings")
    _check_int("callback_sequence", callback_sequence, 1)
    _check_int("started_at_ms", started_at_ms, 0)
    return shard


def _check_token(token: object) -> None:
    if not isinstance(token, str) or TOKEN_PATTERN.fullmatch(token) is None:
        raise ValueError("token must be 32-128 characters of [A-Za-z0-9_-]")


def launcher_args(
    *,
    shard_dir: str | os.PathLike[str],
    run_id: str,
    attempt_id: str,
    callback_sequence: int,
    started_at_ms: int,
    mode: LaunchMode,
    command: Sequence[str],
    flags: str = "",
    limits: Limits | None = None,
) -> list[str]:
    """Validated launcher arguments (everything after ``launcher.sh``); raises ``ValueError``.
    Without ``limits`` the launcher enforces nothing itself (the LIMITS word is left out)."""
    shard = _check_attempt(shard_dir, run_id, attempt_id, callback_sequence, started_at_ms)
    cmd = list(command)
    if not all(isinstance(a, str) for a in cmd):
        raise ValueError("command items must be str")
    if mode == "argv":
        if not cmd:
            raise ValueError("argv mode needs at least one word")
    elif mode == "shell":
        if len(cmd) != 1:
            raise ValueError("shell mode takes exactly one command string")
    else:
        raise ValueError(f"mode must be 'argv' or 'shell', not {mode!r}")
    if not isinstance(flags, str) or any(f not in LAUNCH_FLAGS or flags.count(f) > 1 for f in flags):
        raise ValueError(f"flags must be distinct letters of {LAUNCH_FLAGS!r}")
    word = f"{mode}+{flags}" if flags else mode
    extra = [limits_word(limits)] if limits is not None else []
    return [shard, run_id, attempt_id, str(callback_sequence), str(started_at_ms), word, *extra, "--", *cmd]


def _spawn_with_fd3(
    shell: list[str],
    script_argv: list[str],
    fd3_payload: bytes | None,
    *,
    log_fd: int,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    hold: bool = False,
    awaited: bool = False,
    on_stdin: bool = False,
) -> tuple[subprocess.Popen[bytes], Any]:
    """Run ``shell + script_argv`` as a new session whose fd 3 is a pipe for ``fd3_payload``.

    Returns the process and, with ``hold``, the pipe's write end, still open and empty: the caller
    writes the payload later (:func:`release`), and if the caller dies first the child reads EOF.
    Without ``hold`` the payload is written and the write end closed before the spawn.
    ``fd3_payload=None`` starts it with fd 3 closed (tests use this).

    With ``hold`` the channel is the child's *stdin* (no trampoline: ``script_argv`` must carry the
    ``c`` flag), and with ``awaited`` it is a socket, returned as a :class:`socket.socket`.
    ``on_stdin`` puts the channel on stdin without ``hold`` too (the compiled launcher, which moves
    it itself, never needs the trampoline).
    """
    w: Any
    stdin: Any
    if fd3_payload is None:
        argv, stdin, w = [*shell, *script_argv], subprocess.DEVNULL, None
    else:
        if hold or on_stdin:
            argv = [*shell, *script_argv]
        else:
            argv = [*shell, "-c", _TRAMPOLINE, "ql-launcher", *shell, *script_argv]
        if awaited:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            w, stdin = ours, theirs.detach()
        else:
            stdin, w = os.pipe()
            if not hold:
                try:
                    os.write(w, fd3_payload)  # a few hundred bytes at most: fits the pipe buffer, never blocks
                except BaseException:
                    os.close(stdin)
                    raise
                finally:
                    os.close(w)
                    w = None
    try:
        process = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=log_fd,
            stderr=log_fd,
            close_fds=True,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )
    except BaseException:
        if isinstance(w, socket.socket):
            w.close()
        elif w is not None:
            os.close(w)
        raise
    finally:
        if stdin != subprocess.DEVNULL:
            os.close(stdin)  # the child has its own copy; ours must not outlive the spawn
    return process, w


def release(channel: int | socket.socket, token: str) -> None:
    """Hand a held launcher its token (the go-ahead); it fits the channel's buffer, never blocks.

    A pipe is closed at once; an acknowledged channel (a socket) stays open for :func:`acknowledge`.
    """
    line = (token + "\n").encode("ascii")
    if isinstance(channel, socket.socket):
        channel.sendall(line, socket.MSG_NOSIGNAL)  # a dead launcher is EPIPE, never our SIGPIPE
        return
    try:
        _write_no_sigpipe(channel, line)
    finally:
        os.close(channel)


def _write_no_sigpipe(fd: int, data: bytes) -> None:
    """``os.write`` to a pipe whose reader (a launcher) may have died: ``EPIPE`` is raised, and the
    SIGPIPE the kernel sends this thread for it is taken back — a host that restored SIGPIPE's
    default action (CPython ignores it; many CLIs do not) must never die of its launcher's death."""
    import signal

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    pending_before = signal.SIGPIPE in signal.sigpending()
    try:
        os.write(fd, data)
    except BrokenPipeError:
        if not pending_before:  # ours (thread-directed, pending while blocked): consume it
            signal.sigtimedwait({signal.SIGPIPE}, 0)
        raise
    finally:
        if signal.SIGPIPE not in blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGPIPE})


def acknowledge(channel: socket.socket, committed: bool) -> None:
    """End an acknowledged channel: ``ok`` when the host committed the status it reaped (the
    launcher's publisher then publishes nothing), a bare close otherwise (it publishes the
    receipt). A publisher already gone (killed with its group) is no error: the commit stands."""
    try:
        if committed:
            channel.sendall(b"ok\n", socket.MSG_NOSIGNAL)  # 3 bytes into an empty buffer: never blocks
    except OSError:
        pass
    finally:
        channel.close()


def spawn_launcher(
    *,
    shell: str | Sequence[str] = "/bin/sh",
    shard_dir: str | os.PathLike[str],
    run_id: str,
    attempt_id: str,
    callback_sequence: int,
    started_at_ms: int,
    mode: LaunchMode,
    command: Sequence[str],
    token: str,
    log_fd: int,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    hold: bool = False,
    awaited: bool = False,
    hints: str = "",
    compiled: str | None = None,
    limits: Limits | None = None,
) -> Any:
    """Spawn the launcher for one attempt and return its ``Popen``.

    With ``hold`` it returns ``(Popen, channel)``: the launcher waits for its token, which the
    caller hands over with :func:`release` once the launcher's durable handle is committed (if the
    caller dies first, the launcher reads EOF and exits 125 without running the command).
    ``awaited`` (implies ``hold``) makes the channel a socket for acknowledged completion
    (:func:`acknowledge`). ``hints`` are the flags ``e``/``p`` the caller verified for this shell
    and PATH (launcher.sh header); wrong hints break the task, so pass only what was probed.
    ``compiled`` is the path of the compiled launcher (:mod:`.compiled`) to run instead of
    ``shell`` + ``launcher.sh``: the same contract, its channel always on stdin, no hints needed.

    The child is a new session and process-group leader (``start_new_session``), its stdin is
    ``/dev/null``, its stdout/stderr are ``log_fd`` (opened by the caller with ``O_WRONLY|O_APPEND``),
    no descriptor other than 0-2 and the token pipe reaches it, and ``token`` travels only through
    the pipe. ``shell`` is a path or an argv prefix (``("/bin/busybox", "sh")``). ``env=None``
    inherits the host's environment. Raises ``ValueError`` for arguments the launcher would refuse
    and ``OSError`` when the spawn itself fails; in both cases nothing was started.
    """
    _check_token(token)
    args = launcher_args(
        shard_dir=shard_dir,
        run_id=run_id,
        attempt_id=attempt_id,
        callback_sequence=callback_sequence,
        started_at_ms=started_at_ms,
        mode=mode,
        command=command,
        flags=("c" + hints + ("a" if awaited else "")) if (hold or awaited or compiled) else hints,
        limits=limits,
    )
    if any(h not in "ep" for h in hints):
        raise ValueError("hints may only be 'e' and 'p'")
    if compiled is not None:
        if not os.path.isabs(compiled):
            raise ValueError("the compiled launcher's path must be absolute")
        program, script = [compiled], args
    else:
        program, script = _shell_argv(shell), [launcher_path(), *args]
    process, write_fd = _spawn_with_fd3(
        program,
        script,
        (token + "\n").encode("ascii"),
        log_fd=log_fd,
        cwd=cwd,
        env=env,
        hold=hold or awaited,
        awaited=awaited,
        on_stdin=compiled is not None,
    )
    return (process, write_fd) if (hold or awaited) else process


def spawn_standby(compiled: str) -> tuple[subprocess.Popen[bytes], socket.socket, int]:
    """Start a standby launcher (``compiled --standby``): it, our channel end, and the largest
    message that channel takes at once.

    A new session and process-group leader, stdin its channel, stdout/stderr ``/dev/null``, no
    other descriptor (``close_fds``; the launcher also closes any above 2 but its channel itself),
    signals as ``Popen`` leaves them for any child, and an **empty environment**: its task gets the
    run's environment from the message, and a task can read its parent's (``/proc/PPID/environ``),
    so the host's own must not be there. (Not ``posix_spawn``: glibc's leaves its own internal
    signals ignored in the child, and the command would inherit them ignored.) Raises ``OSError``
    when nothing was started.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        capacity = standby_capacity(ours)
        process = subprocess.Popen([compiled, "--standby"], stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True, env={})
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours, capacity


def standby_capacity(ours: socket.socket) -> int:
    """Make room in our end of a standby's channel for the largest message, and say how much there
    really is: a datagram larger than the send buffer is refused (EMSGSIZE), and
    ``net.core.wmem_max`` caps what we may ask for."""
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STANDBY_SPEC_MAX + 64 * 1024)
    return min(STANDBY_SPEC_MAX, ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 1024)


class EncodedTask(LeanNamedTuple):
    """The run-independent part of a standby message, encoded once (:func:`encode_task`)."""

    mode: LaunchMode
    words: list[bytes]
    env: list[bytes]
    cwd: bytes
    #: Bytes of ``words`` and ``env`` as execve counts them (strings, NULs and pointers).
    exec_bytes: int
    #: The longest single word or environment entry.
    longest: int


def encode_task(command: Sequence[str], *, shell: bool, cwd: str | os.PathLike[str] | None,
                env: Mapping[str, str] | None) -> EncodedTask:
    """Encode what a standby launcher needs of a task, as ``Popen`` encodes it (``ValueError`` for
    what it would refuse). ``env=None`` is this host's environment now, as ``Popen(env=None)``."""
    mode: LaunchMode = "shell" if shell else "argv"
    cmd = list(command)
    if not cmd or not all(isinstance(a, str) for a in cmd) or (shell and len(cmd) != 1):
        raise ValueError("argv mode needs at least one word, shell mode exactly one command string")
    words = [os.fsencode(a) for a in cmd]
    if env is None:
        # CPython keeps os.environ's entries as bytes in one dict that os.environb shares: joined in
        # one C-level pass (the Mapping interface decodes and re-looks-up every entry, ~50 us per
        # submit for a typical host environment).
        data = getattr(os.environb, "_data", None)
        items = data.items() if isinstance(data, dict) else os.environb.items()
        pairs = list(map(b"=".join, items))
    else:
        pairs = []
        for k, v in env.items():
            key = os.fsencode(k)
            if not key or b"=" in key:
                raise ValueError("an environment variable name must be non-empty and contain no '='")
            pairs.append(key + b"=" + os.fsencode(v))
    cwd_bytes = os.fsencode(cwd) if cwd is not None else b""
    # Every check over the whole environment (the host's: tens of entries, on every submit) is one
    # C-level pass (join, map) instead of a Python loop per entry; the answers are the same.
    # `0 in` (a byte value), not `b"\0" in`: bytes.__contains__ tries an int first, and a bytes argument
    # costs a formatted TypeError before the substring search.
    if 0 in b"".join(words) or 0 in b"".join(pairs) or 0 in cwd_bytes:
        raise ValueError("a command argument, environment entry or working directory contains a NUL byte")
    if shell:  # what the launcher will exec: /bin/sh -c WORD
        exec_words = [b"/bin/sh", b"-c", *words]
    else:
        exec_words = words
    # execve counts each string with its NUL and its pointer (9 bytes more on 64 bits), plus the two
    # terminating pointers.
    exec_bytes = sum(map(len, exec_words)) + sum(map(len, pairs)) + 9 * (len(exec_words) + len(pairs)) + 16
    longest = max(max(map(len, exec_words)), max(map(len, pairs), default=0))
    return EncodedTask(mode, words, pairs, cwd_bytes, exec_bytes, longest)


def standby_message_size(task: EncodedTask) -> int:
    """An upper bound of :func:`standby_message`'s length for ``task`` (ids, token, PATH_MAX shard)."""
    return (4096 + 640 + len(task.cwd) + sum(map(len, task.words)) + len(task.words) + sum(map(len, task.env))
            + len(task.env))


def standby_message(
    *,
    shard_dir: str | os.PathLike[str],
    run_id: str,
    attempt_id: str,
    callback_sequence: int,
    started_at_ms: int,
    task: EncodedTask,
    token: str,
    awaited: bool,
    limits: Limits | None = None,
) -> bytes:
    """The one message that hands a run to a standby launcher (format: launcher.c, "Standby mode").
    Validated as :func:`launcher_args` validates (``ValueError``: nothing may be sent)."""
    _check_token(token)
    shard = os.fsencode(_check_attempt(shard_dir, run_id, attempt_id, callback_sequence, started_at_ms))
    word = b"shell+c" if task.mode == "shell" else b"argv+c"
    fields = [_STANDBY_MAGIC, shard, run_id.encode(), attempt_id.encode(), str(callback_sequence).encode(),
              str(started_at_ms).encode(), word + b"a" if awaited else word,
              limits_word(limits).encode() if limits is not None else b",,,,", task.cwd,
              str(len(task.words)).encode(), *task.words, str(len(task.env)).encode(), *task.env,
              token.encode("ascii")]
    return b"\0".join(fields) + b"\0"


def hand_over(channel: socket.socket, message: bytes, *, log_fd: int, cwd_fd: int) -> None:
    """Send a standby launcher its run (:func:`standby_message`) with the log and working directory.

    One datagram: it arrives whole or not at all, and never blocks (``MSG_DONTWAIT``). Raises
    ``OSError`` when it was not sent (then the launcher has nothing and never runs anything).
    """
    sent = socket.send_fds(channel, [message], [log_fd, cwd_fd], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
    if sent != len(message):  # a datagram socket never sends part of a message; be sure anyway
        raise OSError("the standby launcher's spec was cut short")
