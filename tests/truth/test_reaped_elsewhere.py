"""A host that cannot reap its own launchers never reports a status it did not see.

Some hosts ignore SIGCHLD (the kernel then reaps every child at once) or reap all their children
themselves (``waitpid(-1)`` in a SIGCHLD handler). ``waitpid`` on the launcher then fails with
ECHILD, and ``subprocess.Popen`` turns that into exit status 0: a task that exited 3 used to end
``succeeded`` with 0, and its true receipt was quarantined as a forgery. Now the host records that
it has no status (``attempt.observation_lost``) and the launcher's receipt decides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import dbview

#: What a host that reaps every child itself runs on SIGCHLD (some process managers do this).
REAP_ALL = r"""
import os
def reap_all(signum, frame):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
"""

HOST = REAP_ALL + r"""
import json, os, signal, sys
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime

mode, data_dir, launcher, standby = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "standby"
if mode == "ignore":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
else:  # a host that reaps every child itself, as some process managers do
    signal.signal(signal.SIGCHLD, reap_all)
config = load_config(data_dir=data_dir, environ={}, cwd=data_dir)
import dataclasses
config = dataclasses.replace(config, plugin_settings={"local": {"launcher": launcher, "standby": standby}})
rt = Runtime.open(config)
out = []
for code in (3, 0):
    for awaited in (True, False):
        view = rt.wait(rt.submit(["sh", "-c", f"exit {code}"], awaited=awaited))
        out.append({"code": code, "awaited": awaited, "run_id": view.run_id, "status": view.status,
                    "exit_code": view.exit_code})
rt.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("launcher", ["compiled-standby", "compiled", "shell"])
@pytest.mark.parametrize("mode", ["ignore", "reap-all"])
def test_the_receipt_decides_when_the_host_cannot_reap(data_dir: Path, mode: str, launcher: str) -> None:
    from ql_core.config import load_config  # noqa: F401 - the host below needs an installed ql

    launcher, _, standby = launcher.partition("-")
    if launcher == "compiled":
        from ql_executors.local_process.compiled import CompiledLauncherError, compiled_launcher

        try:
            compiled_launcher({})
        except CompiledLauncherError as exc:
            pytest.skip(f"no compiled launcher here: {exc}")
    done = subprocess.run([sys.executable, "-c", HOST, mode, str(data_dir), launcher, standby], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    for run in runs:
        assert (run["status"], run["exit_code"]) == ("failed" if run["code"] else "succeeded", run["code"]), run
        events = [e["type"] for e in dbview.rows(f"sqlite:///{data_dir / 'ql.db'}",
                                                  "SELECT type FROM ql_run_event WHERE run_id = ? ORDER BY seq",
                                                  (run["run_id"],))]
        assert events.count(f"run.{run['status']}") == 1 and events[-1] == f"run.{run['status']}", events
        assert "attempt.receipt_rejected" not in events, events  # the true receipt is never called a forgery
    assert not list((data_dir / "receipts" / ".quarantine").rglob("*.json"))


REUSE_HOST = REAP_ALL + r"""
import dataclasses, json, os, signal, subprocess, sys, threading, time
from pathlib import Path
from ql_core.config import load_config
from ql_core.runtime import Runtime

data, standby, stranger = Path(sys.argv[1]), sys.argv[2] == "standby", sys.argv[3] == "stranger"
signal.signal(signal.SIGCHLD, reap_all)  # a host that reaps every child itself
config = load_config(data_dir=data, environ={}, cwd=data)
rt = Runtime.open(dataclasses.replace(config, plugin_settings={"local": {"standby": standby}}))
a = rt.submit(["sh", "-c", "exit 3"])
pid = a.task.live.process.pid
while os.path.exists(f"/proc/{pid}"):  # A's launcher exited and the host's handler reaped it
    time.sleep(0.005)
if stranger:  # ... to a process that is not ours: the shell gets pid - 1, its daemon sleep the pid
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 2))
    subprocess.run(["sh", "-c", "sleep 20 >/dev/null 2>&1 &"], check=True)
    for _ in range(200):  # the shell's child execs sleep a moment after the shell has exited
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"):
            break
        time.sleep(0.005)
    else:
        raise AssertionError("the stranger did not get the pid")
    taker = None
else:  # ... to our next launcher
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))  # the pid comes round again at once
    taker = rt.submit(["sh", "-c", "sleep 1; exit 0"])
    assert taker.task.live.process.pid == pid
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # the handler must not win this race too
started = time.monotonic()
view = rt.wait(a)
elapsed = time.monotonic() - started
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
if taker is not None:
    rt.wait(taker)
events = [e.type for e in rt.events(a.run_id)]
rt.close()
print(json.dumps({"status": view.status, "exit_code": view.exit_code, "events": events, "elapsed": elapsed}))
"""


@pytest.mark.root
@pytest.mark.parametrize("taker", ["our next launcher", "a stranger"])
@pytest.mark.parametrize("path", ["standby", "classic"])
def test_a_reused_pid_never_lends_its_status_or_blocks_the_wait(data_dir: Path, path: str, taker: str) -> None:
    """In a host that reaps its children itself, a launcher reaped behind our back can have its pid
    given to another process before the host waits: the wait follows the launcher's pidfd, never
    the number — no other child's status (the task's true receipt would be quarantined), no wait
    on a stranger. Produced for real in a private pid namespace (ns_last_pid)."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true runs as root with unshare (util-linux)")
        pytest.skip("needs root and unshare for a private pid namespace")
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSE_HOST,
                           str(data_dir), path, "stranger" if taker == "a stranger" else "ours"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["exit_code"]) == ("failed", 3), out
    assert "attempt.receipt_rejected" not in out["events"], out
    assert out["elapsed"] < 10, out  # the stranger sleeps 20 s: the wait never followed it


PROBE_HOST = r"""
import signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # every child's exit status now reads 0
from ql_executors.local_process.executor import _LaunchHints
print(_LaunchHints._probe(sys.argv[1]))
"""


def test_the_shell_launchers_probes_are_judged_by_output_not_exit_status(tmp_path: Path) -> None:
    """launcher.sh's per-host hints (GNU env resets signals: ``e``) are probed once; in a host that
    ignores SIGCHLD every probe "exits 0", so a busybox env (no --default-signal) must still not be
    taken for GNU env — with a wrong ``e`` hint no task could start."""
    import shutil

    busybox = shutil.which("busybox")
    if busybox is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true installs busybox")
        pytest.skip("busybox is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "env").symlink_to(busybox)
    done = subprocess.run([sys.executable, "-c", PROBE_HOST, str(bin_dir)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "e" not in done.stdout.strip(), done.stdout
