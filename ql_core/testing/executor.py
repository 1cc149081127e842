"""The promises an executor makes to core: detached start, durable identity, honest receipts."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Callable

import pytest

from ql_core.ids import new_id, shard_of
from ql_core.interfaces import Executor, IdentityState, SignalOutcome, SpawnRequest
from ql_core.receipts.codec import Receipt, parse_receipt

__all__ = ["ExecutorContract"]


def _wait(predicate: Callable[[], object], timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


class ExecutorContract:
    """Subclass and provide ``make_executor() -> Executor`` as a fixture."""

    @pytest.fixture
    def make_executor(self) -> Callable[[], Executor]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide a make_executor fixture")

    def _spawn(self, executor: Executor, tmp_path: Path, command: list[str]) -> tuple[object, SpawnRequest, Path]:
        attempt_id = new_id()
        shard = tmp_path / "receipts" / shard_of(attempt_id)
        shard.mkdir(parents=True, mode=0o700)
        log = tmp_path / "task.log"
        request = SpawnRequest(run_id=new_id(), attempt_id=attempt_id, callback_sequence=1,
                               token=secrets.token_urlsafe(32), started_at_ms=int(time.time() * 1000),
                               command=tuple(command), shell=False, log_path=log, receipt_shard_dir=shard)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            task = executor.spawn(request, log_fd=fd)
        finally:
            os.close(fd)
        return task, request, shard / f"{attempt_id}.json"

    def test_has_an_executor_type(self, make_executor: Callable[[], Executor]) -> None:
        executor = make_executor()
        assert isinstance(executor.executor_type, str) and executor.executor_type

    def test_task_publishes_a_receipt_with_its_true_exit_code(self, make_executor, tmp_path: Path) -> None:
        executor = make_executor()
        task, request, final = self._spawn(executor, tmp_path, ["sh", "-c", "echo hi; exit 7"])
        data = _wait(lambda: final.exists() and final.read_bytes())
        receipt = parse_receipt(data)  # type: ignore[arg-type]
        assert isinstance(receipt, Receipt), receipt
        assert (receipt.exit_code, receipt.token, receipt.attempt_id) == (7, request.token, request.attempt_id)
        assert receipt.finished_at_ms >= receipt.started_at_ms
        assert (tmp_path / "task.log").read_bytes() == b"hi\n"
        if getattr(task, "process", None) is not None:
            task.process.wait()

    def test_identity_is_running_then_exited(self, make_executor, tmp_path: Path) -> None:
        executor = make_executor()
        task, _request, final = self._spawn(executor, tmp_path, ["sleep", "0.5"])
        handle = executor.capture_handle(task)  # type: ignore[arg-type]
        assert handle is not None
        assert executor.inspect(handle) is IdentityState.RUNNING
        if getattr(task, "process", None) is not None:
            task.process.wait()
        _wait(lambda: executor.inspect(handle) is IdentityState.EXITED)

    def test_no_handle_is_unverifiable_and_never_signalled(self, make_executor) -> None:
        executor = make_executor()
        assert executor.inspect(None) is IdentityState.UNVERIFIABLE
        assert executor.signal(None, signal.SIGTERM) is SignalOutcome.BLOCKED

    def test_signal_reaches_the_task_and_the_receipt_says_so(self, make_executor, tmp_path: Path) -> None:
        executor = make_executor()
        task, _request, final = self._spawn(executor, tmp_path, ["sleep", "30"])
        handle = executor.capture_handle(task)  # type: ignore[arg-type]
        time.sleep(0.2)
        assert executor.signal(handle, signal.SIGTERM) is SignalOutcome.SIGNALLED
        receipt = parse_receipt(_wait(lambda: final.exists() and final.read_bytes()))  # type: ignore[arg-type]
        assert isinstance(receipt, Receipt) and receipt.exit_code == 143
        if getattr(task, "process", None) is not None:
            task.process.wait()
        _wait(lambda: executor.inspect(handle) is IdentityState.EXITED)
        assert executor.signal(handle, signal.SIGTERM) in (SignalOutcome.ALREADY_EXITED, SignalOutcome.BLOCKED)
