"""The adversarial kill loop: hosts, launchers, process groups, reconcilers, supervisors and `ql run`
processes SIGKILLed at random, waiting hosts SIGSTOPped for random spans (across their tasks' ends
and deadlines) then continued or killed while stopped, and hosts, reconcilers, supervisors and
submitters run with their wall clocks stepped (libfaketime: 1 h behind, 1 h ahead, or stepped while
they run) — while mixed runs (exit codes, deadlines, cancels, awaited or not) go on. Then every run
must end true: ``kill_loop_judge`` has the rules.

Nothing the loop runs may wait unboundedly on a stopped peer: each `ql reconcile`, `ql status`,
`ql cancel` and `ql run` it starts must end within :data:`BOUND_S` (after its own freeze, if it had
one) — longer is a violation, as is a traceback on its stderr.

Bounded and ``slow``-marked: ``QL_KILL_LOOP_HOSTS`` hosts (default :data:`DEFAULT_HOSTS`, a few
minutes on a loaded 2-core machine), each submitting :data:`PER_HOST` runs. The seed is printed; rerun
one with ``QL_KILL_LOOP_SEED``. At the end it prints the runs, their outcomes, and what was injected:
kills by kind, stops (continued or killed while stopped), clock steps and faked processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import dbview
from tests.conftest import QL, await_open

from .faked_clock import CLOCKS, Clocks, faketime_available
from .kill_loop_judge import RunFacts, judge
from .kill_loop_tasks import choose, parse_name, read_marks, script

HOST = Path(__file__).with_name("kill_host.py")
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
DEFAULT_HOSTS = 40
PER_HOST = 6
HOSTS = int(os.environ.get("QL_KILL_LOOP_HOSTS", str(DEFAULT_HOSTS)))
#: How long any `ql` command the loop starts may take (beyond a freeze of its own).
BOUND_S = 45.0
#: At most this many `ql` commands of the loop's own run at once (a 2-core machine).
MAX_BUSY = 3
#: Freeze spans (s) and their weights: short, across a task's end, across a 3 s deadline.
FREEZE_SPANS = (((0.05, 0.5), 4), ((0.5, 2.5), 3), ((2.5, 5.0), 3))


def _proc_stat(pid: int) -> tuple[bytes, list[bytes]] | None:
    """``/proc/PID/stat``: the command name and the fields after it (state first); None once gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    close = raw.rfind(b")")
    return raw[raw.index(b"(") + 1:close], raw[close + 2:].split()


def _state_and_status(pid: int) -> tuple[bytes, int | None] | None:
    """The process state letter and, for a zombie, its wait status (/proc/PID/stat field 52)."""
    stat = _proc_stat(pid)
    if stat is None:
        return None
    fields = stat[1]
    return fields[0], (int(fields[49]) if fields[0] == b"Z" and len(fields) > 49 else None)


def _wait_state(pid: int, states: tuple[bytes, ...], step_s: float) -> None:
    """Until ``pid`` is in one of ``states``, a zombie or gone (bounded)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = _state_and_status(pid)
        if state is None or state[0] in (*states, b"Z", b"X"):
            return
        time.sleep(step_s)


def _wait_dead(pid: int) -> None:
    """Until ``pid`` is gone or a zombie (bounded): a SIGKILLed process runs no more code then."""
    _wait_state(pid, (), 0.005)


def _wait_stopped(pid: int) -> None:
    """Until ``pid`` is stopped, a zombie or gone (bounded): it then runs no more code until continued."""
    _wait_state(pid, (b"T", b"t"), 0.001)


def _has_publisher(launcher: int) -> bool:
    """Does the (stopped) launcher have its acknowledged-path publisher: a child of its own with its
    command name (the command's processes were exec'd and carry theirs)?"""
    own = _proc_stat(launcher)
    if own is None:
        return False
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != launcher:
            member = _proc_stat(int(name))
            if member is not None and member[0] == own[0] and int(member[1][1]) == launcher:
                return True
    return False


def _boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _receipt(data_dir: Path, attempt_id: str) -> Path:
    return data_dir / "receipts" / attempt_id[-2:] / f"{attempt_id}.json"


def _rows(rt: Any) -> list[tuple[Any, Any]]:
    out = []
    for run in dbview.rows(rt, "SELECT * FROM ql_run"):
        out.append((run, dbview.row(rt, "ql_run_attempt", run.current_attempt_id)))
    return out


def _start_boot_s(attempt: Any) -> float | None:
    try:
        value = json.loads(attempt.handle).get("start_boot_ms") if attempt is not None and attempt.handle else None
    except ValueError:
        return None
    return value / 1000 if isinstance(value, int) else None


@dataclass
class Freeze:
    """A planned SIGSTOP of a waiting host: at ``at``, for ``span`` s, then SIGCONT or SIGKILL."""

    proc: subprocess.Popen[bytes]
    what: str
    at: float
    span: float
    then: str
    key: str
    stopped_at: float | None = None


@dataclass
class Command:
    """A `ql` command of the loop's own; it must end by ``bound_at`` (pushed back by its freeze)."""

    proc: subprocess.Popen[bytes]
    what: str
    started: float
    bound_at: float
    kill_at: float | None = None   # reconcilers and supervisors the loop SIGKILLs mid-work
    killed: bool = False
    frozen_s: float = 0.0


@dataclass
class Loop:
    rng: random.Random
    rt: Any
    data_dir: Path
    marks: Path
    env: dict[str, str]
    clocks: Clocks | None
    killed: dict[str, str] = field(default_factory=dict)   # attempt id -> what was killed
    published_before_kill: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    injected: Counter[str] = field(default_factory=Counter)
    faked: Counter[str] = field(default_factory=Counter)
    finished: Counter[str] = field(default_factory=Counter)   # "what rc" of the loop's commands
    commands: list[Command] = field(default_factory=list)
    freezes: list[Freeze] = field(default_factory=list)
    host_saw: dict[str, list[tuple[str, int | None]]] = field(default_factory=dict)
    ql_run_exits: dict[str, list[int]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    submitted: int = 0
    #: Key prefix of a host's or submitter's runs -> what was done to it (for violation messages).
    about: dict[str, list[str]] = field(default_factory=dict)
    longest: float = 0.0
    #: Every process the loop started (none outlives the test; libfaketime's leftovers go by pid).
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # -- processes ------------------------------------------------------------------------------
    def _env(self, what: str, faked_share: float, key: str | None = None) -> dict[str, str]:
        """The environment of a process the loop starts: now and then on a faked clock."""
        if self.clocks is None or self.rng.random() >= faked_share:
            return self.env
        clock = self.rng.choice(CLOCKS)
        self.faked[f"{what} {clock}"] += 1
        if key is not None:
            self.about.setdefault(key, []).append(f"clock {clock}")
        return self.clocks.env(self.env, clock)

    def _start(self, args: list[str], what: str, faked_share: float, kill_after: float | None = None) -> Command:
        proc = subprocess.Popen(QL + args, env=self._env(what, faked_share), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.procs.append(proc)
        now = time.monotonic()
        command = Command(proc, what, now, now + BOUND_S, None if kill_after is None else now + kill_after)
        self.commands.append(command)
        if any(f.stopped_at is not None for f in self.freezes):
            self.injected["commands started while a host was stopped"] += 1
        return command

    def _busy(self) -> int:
        return sum(1 for c in self.commands if c.proc.poll() is None)

    def _plan_freeze(self, proc: subprocess.Popen[bytes], what: str, start: float, end: float, key: str) -> Freeze:
        (low, high), = self.rng.choices([s for s, _ in FREEZE_SPANS], weights=[w for _, w in FREEZE_SPANS])
        freeze = Freeze(proc, what, self.rng.uniform(start, end), self.rng.uniform(low, high),
                        "kill" if self.rng.random() < 0.3 else "cont", key)
        self.freezes.append(freeze)
        return freeze

    def _thaw(self, freeze: Freeze) -> None:
        if freeze.then == "kill":
            freeze.proc.send_signal(signal.SIGKILL)  # reaches a stopped process too
        else:
            freeze.proc.send_signal(signal.SIGCONT)
        self.injected[f"stopped {freeze.what}, then {freeze.then}"] += 1
        self.about.setdefault(freeze.key, []).append(f"{freeze.then} at boot {_boot():.2f}")
        for command in self.commands:
            if command.proc is freeze.proc:
                frozen = time.monotonic() - (freeze.stopped_at or time.monotonic())
                command.bound_at += frozen
                command.frozen_s += frozen
                command.killed = command.killed or freeze.then == "kill"

    def _freezes(self, now: float) -> None:
        for freeze in list(self.freezes):
            if freeze.proc.poll() is not None:
                self.freezes.remove(freeze)
            elif freeze.stopped_at is None and now >= freeze.at:
                freeze.proc.send_signal(signal.SIGSTOP)
                freeze.stopped_at = now
                self.about.setdefault(freeze.key, []).append(f"stopped at boot {_boot():.2f}")
            elif freeze.stopped_at is not None and now >= freeze.stopped_at + freeze.span:
                self._thaw(freeze)
                self.freezes.remove(freeze)

    def _commands(self, now: float) -> None:
        """Collect the loop's commands that ended; SIGKILL those due (a violation: past the bound)."""
        for command in list(self.commands):
            proc = command.proc
            if proc.poll() is None:
                if command.kill_at is not None and now >= command.kill_at:
                    proc.send_signal(signal.SIGKILL)
                    command.killed = True
                    self.injected[command.what] += 1
                elif now >= command.bound_at:
                    proc.kill()
                    command.killed = True
                    self.violations.append(f"`ql {command.what}` did not end within {BOUND_S:g} s")
                continue
            out, err = proc.communicate(timeout=30)
            self.commands.remove(command)
            if command.kill_at is not None and command.killed:
                continue
            self.finished[f"{command.what} {proc.returncode}"] += 1
            if not command.killed:
                self.longest = max(self.longest, now - command.started - command.frozen_s)
            if b"Traceback" in err:
                self.violations.append(f"`ql {command.what}` wrote a traceback: "
                                       f"{err.decode(errors='replace')[-2000:]}")
            if command.what == "run (waiting)" and not command.killed:
                self._ql_run_ended(proc.returncode, out)

    def _ql_run_ended(self, rc: int, out: bytes) -> None:
        lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        if not lines:
            return  # it never got as far as submitting (no run of its own to judge it by)
        run_id = lines[0]["run_id"]
        self.ql_run_exits.setdefault(run_id, []).append(rc)
        if len(lines) > 1 and "exit_code" in lines[-1]:
            self.host_saw.setdefault(run_id, []).append((lines[-1]["status"], lines[-1]["exit_code"]))

    # -- faults ---------------------------------------------------------------------------------
    def _running(self) -> list[dict]:
        rows = []
        for run, attempt in _rows(self.rt):
            if attempt is not None and attempt.status == "running" and attempt.handle:
                rows.append({"run": run.id, "attempt": attempt.id, "pid": json.loads(attempt.handle)["pid"]})
        return rows

    def _kill_task(self, choice: str, target: dict) -> None:
        before = _state_and_status(target["pid"])
        if before is None or before[0] in (b"Z", b"X"):
            return  # the launcher already ended on its own: a kill now would hit nothing
        publisher = False
        try:
            if choice == "group":
                os.killpg(target["pid"], signal.SIGKILL)
            else:
                # Stopped first, the launcher creates nothing more; whether it had already left its
                # acknowledged-path publisher (created only after it reaped the command's status,
                # which that publisher holds and publishes once the host closes the channel) is
                # then known exactly at the moment of the kill.
                os.kill(target["pid"], signal.SIGSTOP)
                _wait_stopped(target["pid"])
                publisher = _has_publisher(target["pid"])
                self.injected["launcher killed beside its publisher"] += publisher
                os.kill(target["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return
        self.killed[target["attempt"]] = choice
        # Once the launcher is really dead it can publish nothing more: a receipt there now
        # was published before the kill (a true verdict, not a false success) — or by its
        # publisher, which holds the true status.
        _wait_dead(target["pid"])
        if publisher or _receipt(self.data_dir, target["attempt"]).exists():
            self.published_before_kill.add(target["attempt"])
        after = _state_and_status(target["pid"])
        if after is not None and after[1] is not None and after[1] & 0x7F == 0:
            # It exited with a status of its own (not our signal) in the microseconds
            # between the look and the kill: its status is the kernel's, a true verdict.
            self.published_before_kill.add(target["attempt"])
        self.injected[choice] += 1

    def _submit(self) -> None:
        self.submitted += 1
        asked = choose(self.rng, f"s{self.submitted}")
        detach = self.rng.random() < 0.4
        env = self._env("submitter", 0.5, asked.key)
        # A faked submitter's task runs without libfaketime: its sleep is the real duration.
        task = ["--", "env", "-u", "LD_PRELOAD", "sh", "-c"] if "LD_PRELOAD" in env else ["--shell", "--"]
        args = ["--json", "run", *(["--detach"] if detach else []), "--name", asked.name,
                *(["--timeout", str(asked.timeout)] if asked.timeout else []), *task, script(asked, self.marks)]
        proc = subprocess.Popen(QL + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(proc)
        now = time.monotonic()
        self.commands.append(Command(proc, "run --detach" if detach else "run (waiting)", now, now + BOUND_S))
        if not detach and self.rng.random() < 0.3:
            self._plan_freeze(proc, "ql run", now + 0.2, now + 2.5, asked.key)
        self.injected["submit"] += 1

    def tick(self) -> None:
        now = time.monotonic()
        self._freezes(now)
        self._commands(now)
        choice = self.rng.choices(
            ["group", "launcher", "cancel", "reconciler", "supervisor", "reconcile", "status", "submit",
             "step", "nothing"], weights=[2, 2, 2, 2, 1, 1, 1, 1, 1, 3])[0]
        if choice in ("reconciler", "supervisor", "reconcile", "status", "cancel", "submit") and self._busy() >= MAX_BUSY:
            return
        if choice in ("group", "launcher", "cancel"):
            targets = self._running()
            if not targets:
                return
            target = self.rng.choice(targets)
            if choice == "cancel":
                self.cancelled.add(target["run"])
                self._start(["cancel", target["run"]], "cancel", 0.2)
                self.injected["cancel"] += 1
            else:
                self._kill_task(choice, target)
        elif choice == "reconciler":
            self._start(["reconcile"], "reconciler", 0.3, kill_after=self.rng.uniform(0.0, 0.3))
        elif choice == "supervisor":
            life = self.rng.uniform(0.0, 0.3) if self.rng.random() < 0.7 else self.rng.uniform(0.3, 3.0)
            self._start(["--profile", "standalone", "supervise"], "supervisor", 0.3, kill_after=life)
        elif choice == "reconcile":  # a whole pass, which must end within the bound
            self._start(["--json", "reconcile"], "reconcile", 0.3)
        elif choice == "status":
            runs = dbview.rows(self.rt, "SELECT id FROM ql_run")
            if runs:
                self._start(["--json", "status", self.rng.choice(runs).id], "status", 0.2)
        elif choice == "submit":
            self._submit()
        elif choice == "step" and self.clocks is not None:
            self.injected[f"clock step to {self.clocks.step()}"] += 1

    def host(self, number: int) -> None:
        env = self._env("host", 0.3, f"h{number}")
        host = subprocess.Popen([sys.executable, str(HOST), str(self.data_dir), str(self.rng.randrange(1 << 30)),
                                 str(PER_HOST), str(self.marks), f"h{number}"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(host)
        # Its death is timed from the moment its runtime is open: a Python start takes seconds on a
        # loaded machine, and timed from the spawn nearly every host died before its first submit.
        # Now and then one dies before (most likely) opening, on purpose.
        if self.rng.random() < 0.15:
            dies_at = time.monotonic() + self.rng.uniform(0.0, 0.3)
        else:
            await_open(host, "a kill-loop host")
            now = time.monotonic()
            dies_at = now + (self.rng.uniform(0.1, 1.5) if self.rng.random() < 0.8 else self.rng.uniform(1.5, 4.0))
            if self.rng.random() < 0.6:
                freeze = self._plan_freeze(host, "host", now, dies_at, f"h{number}")
                if freeze.then == "cont":
                    dies_at += freeze.span  # a life after the freeze, to wait for its runs
        while time.monotonic() < dies_at and host.poll() is None:
            self.tick()
            time.sleep(self.rng.uniform(0.0, 0.15))
        if host.poll() is None:
            host.send_signal(signal.SIGKILL)  # a stopped host too
            self.injected["host"] += 1
            if any(f.proc is host and f.stopped_at is not None for f in self.freezes):
                self.injected["stopped host, then kill"] += 1  # its life ended during its freeze
                self.about.setdefault(f"h{number}", []).append(f"killed at boot {_boot():.2f}")
        out, err = host.communicate(timeout=60)
        self.freezes = [f for f in self.freezes if f.proc is not host]
        for line in out.decode().splitlines():
            if line.startswith("waited "):
                _, run_id, status, code = line.split()
                self.host_saw.setdefault(run_id, []).append((status, None if code == "None" else int(code)))
        if host.returncode not in (0, -signal.SIGKILL):
            self.violations.append(f"a host exited {host.returncode}: {err.decode(errors='replace')[-2000:]}")

    def settle(self) -> None:
        """Thaw every frozen process as planned, and let every command of the loop's end (bounded)."""
        for freeze in list(self.freezes):
            if freeze.proc.poll() is None and freeze.stopped_at is not None:
                self._thaw(freeze)
        self.freezes.clear()
        now = time.monotonic()
        for command in self.commands:
            if command.kill_at is not None:
                command.kill_at = now
        while self.commands:
            self._commands(time.monotonic())  # past its bound, a command is killed and counted
            time.sleep(0.05)

    def abandon(self) -> set[int]:
        """SIGKILL whatever the loop started that still runs (a test that failed half way), reap
        it; the pids of all it ever started."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # stopped or not
                proc.communicate(timeout=30)
        return {proc.pid for proc in self.procs}

    def summary(self, seed: int, rows: list, outcomes: Counter[str], violations: int) -> str:
        def part(prefix: str) -> dict[str, int]:
            return {k[len(prefix):]: v for k, v in sorted(self.injected.items()) if k.startswith(prefix)}

        kills = {k: self.injected[k] for k in ("host", "group", "launcher", "reconciler", "supervisor")}
        steps = part("clock step to ")
        return (f"kill loop seed {seed}: {len(rows)} runs checked, outcomes {dict(sorted(outcomes.items()))}; "
                f"SIGKILLs {kills} (launchers beside their publisher {self.injected['launcher killed beside its publisher']}); stops {part('stopped ')}; cancels {self.injected['cancel']}, "
                f"commands started while a host was stopped {self.injected['commands started while a host was stopped']}, "
                f"submitters {self.injected['submit']}; clock steps {sum(steps.values())} {steps}; "
                f"faked processes {sum(self.faked.values())} {dict(sorted(self.faked.items()))}; "
                f"commands (exit status) {dict(sorted(self.finished.items()))}, longest {self.longest:.1f} s; "
                f"violations {violations}")

    def facts(self, run: Any, attempt: Any) -> RunFacts:
        asked = parse_name(run.name)
        return RunFacts(
            run_id=run.id, asked=asked, status=run.status, exit_code=run.exit_code, reason=run.reason,
            events=[e.type for e in self.rt.events(run.id)], marks=read_marks(self.marks, asked.key),
            start_boot_s=_start_boot_s(attempt), killed=self.killed.get(attempt.id),
            published_before_kill=attempt.id in self.published_before_kill,
            cancel_asked=run.id in self.cancelled, receipt_left=_receipt(self.data_dir, attempt.id).exists(),
            host_saw=self.host_saw.get(run.id, []), ql_run_exits=self.ql_run_exits.get(run.id, []),
            context="; ".join(self.about.get(asked.key.split("-")[0], [])))


def _recover(rt: Any) -> list[tuple[Any, Any]]:
    """Every host is dead: recover until every run has ended (orphaned commands end on their own)."""
    deadline = time.monotonic() + 120
    while True:
        rt.reconcile()
        rows = _rows(rt)
        if all(run.status in TERMINAL for run, _ in rows):
            return rows
        assert time.monotonic() < deadline, [(r.id, r.status) for r, _ in rows if r.status not in TERMINAL]
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(max(300, HOSTS * 12))
def test_random_kills_stops_and_clock_steps_never_break_an_invariant(open_rt, data_dir: Path,
                                                                     tmp_path: Path) -> None:
    seed = int(os.environ.get("QL_KILL_LOOP_SEED", time.time_ns() % 1_000_000))
    print(f"kill loop seed {seed}")
    rng = random.Random(seed)
    rt = open_rt(cancel_grace_s=0.3, publish_grace_ms=20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_DATA_DIR"] = str(data_dir)
    if not faketime_available() and os.environ.get("CI") == "true":
        pytest.fail("faketime is required under CI=true (apt-get install faketime)")
    clocks = Clocks(tmp_path / "clock", rng) if faketime_available() else None
    if clocks is None:
        print("kill loop: faketime is not installed, so no clock steps")
    marks = tmp_path / "marks"
    marks.mkdir()
    loop = Loop(rng, rt, data_dir, marks, env, clocks)
    try:
        for number in range(HOSTS):
            loop.host(number)
        loop.settle()
        rows = _recover(rt)
    finally:
        pids = loop.abandon()
        if clocks is not None:  # the faked processes' forks include the launchers they started
            launchers = {json.loads(a.handle)["pid"] for _r, a in _rows(rt) if a is not None and a.handle}
            clocks.remove_leftovers(pids | launchers)

    outcomes: Counter[str] = Counter()
    violations = list(loop.violations)
    for run, attempt in rows:
        outcomes[run.status] += 1
        violations.extend(judge(loop.facts(run, attempt)))
    print(loop.summary(seed, rows, outcomes, len(violations)))
    assert len(rows) >= 3 * HOSTS, f"only {len(rows)} runs were created"
    if HOSTS >= 20:  # the faults this loop is about did happen (each near certain at this size)
        assert sum(v for k, v in loop.injected.items() if k.startswith("stopped ")) > 0, "no host was stopped"
        assert clocks is None or sum(loop.faked.values()) > 0, "no process ran on a faked clock"
    assert violations == [], "\n".join(violations[:20])
