"""Helpers of the operator-facing tests: real `ql` processes, a scrape, a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, TypeVar

from ql_core.testing.executor import wait_until
from tests.conftest import QL, run_ql

T = TypeVar("T")
DEADLINE_S = 90.0

__all__ = ["QL", "free_port", "ql_env", "spawn", "ql", "scrape", "sample", "wait_for", "stop", "http_get"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ql_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update({"HOME": str(home), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def spawn(args: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(QL + args, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def ql(args: list[str], *, env: dict[str, str], timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return run_ql(args, env, timeout=timeout)


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def scrape(port: int) -> str | None:
    """The metrics text, or None while nothing answers on the port."""
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except OSError:
        return None
    return body if status == 200 else None


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value in a Prometheus text (0 when the series does not exist yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def wait_for(predicate: Callable[[], T], *, timeout: float = DEADLINE_S, what: str = "condition",
             every: float = 0.05, diagnose: Callable[[], Any] | None = None) -> T:
    """ql_core.testing's poller (``wait_until``), with this folder's keyword names and 50 ms default."""
    return wait_until(predicate, what, timeout, interval=every, diagnose=diagnose)
