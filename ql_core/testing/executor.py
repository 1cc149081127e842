"""The promises an executor makes to core (:mod:`ql_core.ports.executor`), as a pytest suite.

Subclass :class:`ExecutorContract` and provide ``make_executor``; for the
end-to-end tests also ``executor_name`` (the name your plugin registers) and
``plugin_name`` (your entry point in ``ql.plugins``) — they run a real
:class:`~ql_core.runtime.Runtime` with ``executor = "<executor_name>"``, so your
package must be installed. Tasks are plain POSIX commands (``sh``); receipts
are read back through a receipt store (``make_receipt_store``, by default the
built-in ``file`` store that the local launcher publishes to) — nothing here
assumes a path, a shard layout, a launcher or an exit status of the built-ins.
Synchronization is by conditions (a log line, a file), never by sleeping.

Every task test runs twice for an executor that offers standby tasks
(:class:`~ql_core.ports.executor.StandbyExecutor`): spawned and released, and
taken with ``standby()`` and handed its run with ``start()`` — the same promises
either way (the standby variant is skipped for executors without the capability).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from ql_core.ids import new_id
from ql_core.ports.executor import (
    MAX_HANDLE_BYTES,
    Executor,
    ExitObservation,
    IdentityState,
    SignalOutcome,
    SpawnedTask,
    SpawnRequest,
    StandbyExecutor,
)
from ql_core.ports.journal import TaskSpec
from ql_core.ports.receipt_store import ReceiptStore

__all__ = ["ExecutorContract", "wait_until"]

#: Failure detection only: nothing waits this long when the executor works.
DEADLINE_S = 30.0


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE_S, *,
               interval: float = 0.01, diagnose: Callable[[], Any] | None = None) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy (a condition,
    not a fixed sleep); a costly predicate (a scan of /proc) wants a longer ``interval``. On a time-out
    the failure names ``what`` and, given ``diagnose``, adds what it returns (a process's log)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{diagnose()}" if diagnose is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(interval)


@dataclass
class Started:
    """One spawned task of a contract test; ``go()`` lets a held one start (what core does once its
    handle is committed: ``release``, or ``start`` for a standby task)."""

    task: SpawnedTask
    request: SpawnRequest
    log: Path
    go: Callable[[], None]


class ExecutorContract:
    """Subclass and provide ``make_executor() -> Executor`` (and, for end-to-end, ``executor_name``)."""

    @pytest.fixture
    def make_executor(self) -> Callable[[], Executor]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide a make_executor fixture")

    @pytest.fixture
    def executor_name(self) -> str | None:
        """The name your plugin registers (None skips the end-to-end tests)."""
        return None

    @pytest.fixture
    def plugin_name(self, executor_name: str | None) -> str | None:
        """Your entry point in ``ql.plugins`` (defaults to the executor's name)."""
        return executor_name

    @pytest.fixture
    def make_receipt_store(self) -> Callable[[Path], ReceiptStore]:
        """The store your executor's tasks publish to (default: the built-in ``file`` store)."""
        from ql_core.receipts.file_store import FileReceiptStore

        def make(root: Path) -> ReceiptStore:
            root.mkdir(mode=0o700, exist_ok=True)
            return FileReceiptStore(root)

        return make

    @pytest.fixture(params=["spawn", "standby"])
    def start_path(self, request: pytest.FixtureRequest) -> str:
        """How tasks are started: spawned after their create commit, or taken as standby tasks."""
        return str(request.param)

    @pytest.fixture
    def env(self, make_executor: Callable[[], Executor], make_receipt_store: Callable[[Path], ReceiptStore],
            tmp_path: Path, start_path: str) -> Any:
        executor, store = make_executor(), make_receipt_store(tmp_path / "receipts")
        if start_path == "standby" and not isinstance(executor, StandbyExecutor):
            pytest.skip("this executor offers no standby tasks (StandbyExecutor)")
        started: list[Started] = []

        def open_log(log: Path) -> int:
            return os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def spawn(command: list[str], *, shell: bool = False, hold: bool = False, awaited: bool = False) -> Started:
            attempt_id = new_id()
            log = tmp_path / f"{attempt_id}.log"
            request = SpawnRequest(run_id=new_id(), attempt_id=attempt_id, callback_sequence=1,
                                   token=secrets.token_urlsafe(32), started_at_ms=time.time_ns() // 1_000_000,
                                   command=tuple(command), shell=shell, log_path=log,
                                   receipt_location=store.prepare(attempt_id), awaited=awaited)
            if start_path == "standby":
                taken = executor.standby(TaskSpec(command=tuple(command), shell=shell),  # type: ignore[attr-defined]
                                         awaited=awaited)
                if taken is None:
                    pytest.skip("the executor offered no standby task here")
                task: SpawnedTask = taken
                os.close(open_log(log))  # the log exists from the start, as on the spawn path

                def go() -> None:
                    fd = open_log(log)
                    try:
                        executor.start(task, request, log_fd=fd)  # type: ignore[attr-defined]
                    finally:
                        os.close(fd)
            else:
                fd = open_log(log)
                try:
                    task = executor.spawn(request, log_fd=fd)
                finally:
                    os.close(fd)

                def go() -> None:
                    executor.release(task)
            one = Started(task, request, log, go)
            started.append(one)
            if not hold:
                go()  # what core does once the handle is committed
            return one

        yield executor, store, spawn, tmp_path
        for one in started:  # never leave a task behind, whatever a test did
            if executor.inspect(one.task.handle) is IdentityState.RUNNING:
                executor.signal(one.task.handle, signal.SIGKILL)
            executor.abort(one.task)
        if isinstance(executor, StandbyExecutor):
            executor.close()

    # -- spawn and receipts --------------------------------------------------------------
    def test_task_publishes_a_receipt_with_its_true_exit_code(self, env: Any) -> None:
        executor, store, spawn, _ = env
        one = spawn(["sh", "-c", "echo hi; exit 7"])
        read = wait_until(lambda: (r := store.read(one.request.attempt_id)).status == "valid" and r, "the receipt")
        receipt = read.receipt
        assert (receipt.exit_code, receipt.token, receipt.attempt_id, receipt.run_id) == (
            7, one.request.token, one.request.attempt_id, one.request.run_id)
        assert receipt.callback_sequence == one.request.callback_sequence
        assert receipt.finished_at_ms >= receipt.started_at_ms
        assert one.log.read_bytes() == b"hi\n"

    def test_shell_mode_runs_one_string(self, env: Any) -> None:
        executor, store, spawn, _ = env
        one = spawn(["echo a; echo b >&2; exit 3"], shell=True)
        observed = executor.wait(one.task, DEADLINE_S)
        assert observed is not None and observed.exit_code == 3
        assert one.log.read_bytes() == b"a\nb\n"

    def test_the_token_reaches_neither_environment_nor_output(self, env: Any) -> None:
        executor, store, spawn, _ = env
        one = spawn(["sh", "-c", "env; exit 0"])
        assert executor.wait(one.task, DEADLINE_S) is not None
        assert one.request.token.encode() not in one.log.read_bytes()
        assert b"PATH=" in one.log.read_bytes()  # the task really printed its environment

    # -- held until released ---------------------------------------------------------------
    def test_a_task_never_released_never_runs(self, env: Any) -> None:
        """A host that dies before committing the handle never released it: nothing may run."""
        executor, store, spawn, tmp_path = env
        marker = tmp_path / "ran"
        one = spawn(["sh", "-c", f'touch "{marker}"; exit 0'], hold=True)
        assert one.task.handle is not None  # it exists (and can be identified) while held
        executor.abort(one.task)
        wait_until(lambda: executor.inspect(one.task.handle) is IdentityState.EXITED, "identity exited")
        assert not marker.exists()
        assert str(store.read(one.request.attempt_id).status) == "missing"
        assert one.log.read_bytes() == b""

    def test_a_released_task_runs(self, env: Any) -> None:
        executor, store, spawn, tmp_path = env
        marker = tmp_path / "ran"
        one = spawn(["sh", "-c", f'touch "{marker}"; exit 0'], hold=True)
        assert not marker.exists() and one.log.read_bytes() == b""
        one.go()
        assert executor.wait(one.task, DEADLINE_S).exit_code == 0  # type: ignore[union-attr]
        assert marker.exists()

    def test_a_standby_task_is_alive_and_identified_before_its_run(self, env: Any, start_path: str) -> None:
        """Standby only: the handle core commits with the run names a live process that has run
        nothing yet; aborted, it ends without running anything or publishing a receipt."""
        if start_path != "standby":
            pytest.skip("standby tasks only")
        executor, store, spawn, tmp_path = env
        marker = tmp_path / "ran"
        one = spawn(["sh", "-c", f'touch "{marker}"; exit 0'], hold=True)
        assert executor.inspect(one.task.handle) is IdentityState.RUNNING
        executor.abort(one.task)
        wait_until(lambda: executor.inspect(one.task.handle) is IdentityState.EXITED, "identity exited")
        assert not marker.exists() and str(store.read(one.request.attempt_id).status) == "missing"

    # -- the durable handle ----------------------------------------------------------------
    def test_handle_is_a_small_json_document(self, env: Any) -> None:
        executor, _store, spawn, _ = env
        one = spawn(["sh", "-c", "exit 0"])
        assert isinstance(one.task.handle, str)
        assert len(one.task.handle.encode("utf-8")) <= MAX_HANDLE_BYTES
        json.loads(one.task.handle)

    def test_identity_is_running_then_exited(self, env: Any) -> None:
        executor, _store, spawn, tmp_path = env
        go = tmp_path / "go"
        one = spawn(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done'])
        assert executor.inspect(one.task.handle) is IdentityState.RUNNING
        go.touch()
        assert executor.wait(one.task, DEADLINE_S) is not None
        wait_until(lambda: executor.inspect(one.task.handle) is IdentityState.EXITED, "identity exited")

    @pytest.mark.parametrize("handle", [None, "", "{}", "not json", "[1, 2]", '{"pid": "x"}', "x" * 600])
    def test_a_missing_or_broken_handle_is_unverifiable_and_never_signalled(self, env: Any, handle: Any) -> None:
        executor = env[0]
        assert executor.inspect(handle) is IdentityState.UNVERIFIABLE
        assert executor.signal(handle, signal.SIGTERM) is SignalOutcome.BLOCKED

    def test_host_handle_names_the_calling_process(self, env: Any) -> None:
        executor = env[0]
        handle = executor.host_handle()
        assert handle is not None and len(handle.encode("utf-8")) <= MAX_HANDLE_BYTES
        assert executor.inspect(handle) is IdentityState.RUNNING

    # -- signals ---------------------------------------------------------------------------
    def test_signal_reaches_the_task_and_the_receipt_says_so(self, env: Any) -> None:
        executor, store, spawn, _ = env
        one = spawn(["sh", "-c", "echo ready; while :; do sleep 0.05; done"])
        wait_until(lambda: b"ready" in one.log.read_bytes(), "the task to start")
        assert executor.signal(one.task.handle, signal.SIGTERM) is SignalOutcome.SIGNALLED
        read = wait_until(lambda: (r := store.read(one.request.attempt_id)).status == "valid" and r, "the receipt")
        assert read.receipt.exit_code == 128 + signal.SIGTERM
        executor.wait(one.task, DEADLINE_S)
        wait_until(lambda: executor.inspect(one.task.handle) is IdentityState.EXITED, "identity exited")
        assert executor.signal(one.task.handle, signal.SIGTERM) in (SignalOutcome.ALREADY_EXITED,
                                                                     SignalOutcome.BLOCKED)

    # -- the live path -----------------------------------------------------------------------
    def test_wait_returns_none_while_running_then_the_exit(self, env: Any) -> None:
        executor, _store, spawn, tmp_path = env
        go = tmp_path / "go"
        one = spawn(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; exit 5'])
        assert executor.wait(one.task, 0.05) is None
        go.touch()
        observed = executor.wait(one.task, DEADLINE_S)
        assert isinstance(observed, ExitObservation)
        assert observed.exit_code == 5 and observed.finished_at_ms >= one.request.started_at_ms

    def test_an_acknowledged_held_receipt_is_never_published(self, env: Any) -> None:
        executor, store, spawn, _ = env
        one = spawn(["sh", "-c", "exit 3"], awaited=True)
        observed = executor.wait(one.task, DEADLINE_S)
        assert observed is not None and observed.exit_code == 3
        if not observed.held_receipt:  # this executor does not hold receipts: it publishes as usual
            executor.acknowledge(one.task, committed=True)  # a no-op then
            wait_until(lambda: store.read(one.request.attempt_id).status == "valid", "the receipt")
            return
        assert store.read(one.request.attempt_id).status == "missing"
        executor.acknowledge(one.task, committed=True)
        wait_until(lambda: executor.inspect(one.task.handle) is IdentityState.EXITED, "the task to be gone")
        assert store.read(one.request.attempt_id).status == "missing"

    def test_an_unacknowledged_held_receipt_is_published_with_the_true_status(self, env: Any) -> None:
        executor, store, spawn, _ = env
        one = spawn(["sh", "-c", "exit 4"], awaited=True)
        observed = executor.wait(one.task, DEADLINE_S)
        assert observed is not None and observed.exit_code == 4
        executor.acknowledge(one.task, committed=False)  # the host could not commit: publish it
        read = wait_until(lambda: (r := store.read(one.request.attempt_id)).status == "valid" and r, "the receipt")
        assert (read.receipt.exit_code, read.receipt.token) == (4, one.request.token)

    def test_abort_stops_a_task_it_just_started(self, env: Any) -> None:
        executor, _store, spawn, _ = env
        one = spawn(["sh", "-c", "echo ready; while :; do sleep 0.05; done"])
        wait_until(lambda: b"ready" in one.log.read_bytes(), "the task to start")
        executor.abort(one.task)
        wait_until(lambda: executor.inspect(one.task.handle) is IdentityState.EXITED, "identity exited")

    # -- end to end, through a real runtime ----------------------------------------------------
    @pytest.fixture
    def node_data_dir(self, tmp_path: Path) -> Path:
        """The data dir of the end-to-end runtime: a path that does not exist yet (ql creates and
        migrates it). Override it to hand a pre-migrated copy and save the migration per test."""
        return tmp_path / "data"

    @pytest.fixture
    def runtime(self, executor_name: str | None, plugin_name: str | None, node_data_dir: Path,
                tmp_path: Path) -> Any:
        if executor_name is None:
            pytest.skip("no executor_name fixture: end-to-end tests need the installed plugin")
        from ql_core.config import load_config
        from ql_core.runtime import Runtime

        data = node_data_dir
        toml = tmp_path / "ql.toml"
        toml.write_text(f'executor = "{executor_name}"\nplugins = ["{plugin_name}"]\n')
        rt = Runtime.open(load_config(config_path=toml, data_dir=data, environ={}, cwd=tmp_path))
        yield rt
        rt.close()

    def test_the_attempt_records_the_registered_name_and_completes(self, runtime: Any, executor_name: str) -> None:
        sub = runtime.submit(["sh", "-c", "exit 4"])
        assert sub.executor == executor_name
        view = runtime.wait(sub)
        assert (view.status, view.exit_code) == ("failed", 4)
        assert [a.executor for a in view.attempts] == [executor_name]

    def test_recovery_finds_a_receipt_the_host_never_consumed(self, runtime: Any) -> None:
        sub = runtime.submit(["sh", "-c", "exit 6"])
        executor = runtime.executor_for(sub.executor)
        executor.wait(sub.task, DEADLINE_S)  # the task ended; this host "died" before completing it
        runtime.reconcile()
        view = runtime.status(sub.run_id)
        assert (view.status, view.exit_code) == ("failed", 6)

    def test_a_waiting_host_completes_through_the_acknowledged_path(self, runtime: Any) -> None:
        view = runtime.run(["sh", "-c", "exit 9"])
        assert (view.status, view.exit_code) == ("failed", 9)

    def test_cancel_goes_through_the_attempts_executor(self, runtime: Any) -> None:
        sub = runtime.submit(["sh", "-c", "while :; do sleep 0.05; done"])
        assert str(runtime.cancel(sub.run_id)) == "requested"
        view = runtime.wait(sub)
        assert view.status == "cancelled"
