"""``ql web [--listen HOST:PORT]``: a read-only page of runs, their logs (live) and the cluster's workers."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

HELP = "serve a read-only web page of runs, their live logs and (cluster) workers and queue"
EPILOG = ("Binds 127.0.0.1:8470 by default. Any address that is not loopback needs a token: "
          "web_token_file = \"/path\" in the config, a file of mode 0600 (docs/operations.md). The pages show "
          "what `ql status`, `ql events` and `ql logs` print, never a command or environment. Needs "
          "pip install 'ql-runner[web]'. SIGTERM or Ctrl-C stops it.")

DEFAULT_LISTEN = "127.0.0.1:8470"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to bind (default {DEFAULT_LISTEN}; port 0 picks a free one)")


def run(args: argparse.Namespace, out: Output) -> int:
    import threading

    from ql_core.cli.common import stop_on_signals

    # First: a SIGTERM while we open the data dir must stop us cleanly (exit 0), not kill us. uvicorn
    # installs its own handlers while it serves and, once stopped, raises the signal again for this one.
    with stop_on_signals(threading.Event()) as stopped:
        return _serve(args, out, stopped)


def _serve(args: argparse.Namespace, out: Output, stopped: threading.Event) -> int:
    import socket

    from ql_core.cli.common import reader_from_args
    from ql_core.errors import ConfigError, QlError
    from ql_core.metrics import parse_listen
    from ql_core.web.auth import is_loopback, load_token, token_required_error

    host, port = parse_listen(args.listen, "--listen")
    rt = reader_from_args(args)
    try:
        token = load_token(rt.config.web_token_file)
        if token is None and not is_loopback(host):
            raise ConfigError(token_required_error(host))
        from ql_core.web import create_app

        app = create_app(rt, token=token)
        try:
            import uvicorn
        except ImportError:
            from ql_core.web import INSTALL_HINT

            raise ConfigError(f"`ql web` needs uvicorn, which is not installed: {INSTALL_HINT}") from None

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise QlError(f"cannot bind {args.listen[:80]}: {exc.strerror or exc}; choose a free port or "
                          f"another --listen address") from None
        sock.listen(128)
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
        out.emit({"type": "listening", "url": f"http://{shown}:{bound[1]}/", "token": token is not None},
                 f"ql web: http://{shown}:{bound[1]}/ (profile {rt.profile.name}"
                 + (", token required" if token is not None else "") + "); SIGTERM or Ctrl-C stops")
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                               proxy_headers=False))
        if not stopped.is_set():
            server.run(sockets=[sock])
        sock.close()
        out.emit({"type": "stopped"}, "ql web: stopped")
        return 0
    finally:
        rt.close()
