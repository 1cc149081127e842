"""The promises a wake-up source makes to core (:mod:`ql_core.ports.wakeup`), as a pytest suite.

Subclass :class:`WakeupSourceContract` and provide ``make_source()``. Every
test waits on an event with a deadline (a wake-up is asynchronous by nature)
and stops its watch, so no thread outlives a test.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from ql_core.ports.wakeup import WakeupSource, WakeupWatch

__all__ = ["WakeupSourceContract"]

DEADLINE_S = 20.0


class _Recorder:
    def __init__(self, fail_first: bool = False) -> None:
        self.batches: list[set[tuple[str, str]]] = []
        self.event = threading.Event()
        self._fail = fail_first

    def __call__(self, changes: set[tuple[str, str]]) -> None:
        self.batches.append(set(changes))
        self.event.set()
        if self._fail:
            self._fail = False
            raise RuntimeError("a callback that fails once")

    def paths(self) -> set[str]:
        return {path for batch in self.batches for _kind, path in batch}

    def wait_for(self, path: Path) -> None:
        while str(path) not in self.paths():
            self.event.clear()
            if str(path) in self.paths():
                return
            assert self.event.wait(DEADLINE_S), f"no wake-up for {path} in {DEADLINE_S}s"


class WakeupSourceContract:
    """Subclass and provide ``make_source() -> WakeupSource``."""

    @pytest.fixture
    def make_source(self) -> Callable[[], WakeupSource]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide a make_source fixture")

    @pytest.fixture
    def watches(self) -> Any:
        started: list[WakeupWatch] = []
        yield started
        for watch in started:
            watch.stop()

    def _watch(self, source: WakeupSource, watches: list[WakeupWatch], paths: list[Path], on_change: Any,
               *, recursive: bool) -> WakeupWatch:
        watch = source.watch(paths, on_change, recursive=recursive, debounce_ms=100, step_ms=20,
                             thread_name="ql-contract-watch")
        watches.append(watch)
        return watch

    def test_has_a_name(self, make_source: Callable[[], WakeupSource]) -> None:
        source = make_source()
        assert isinstance(source.name, str) and source.name

    def test_a_new_file_wakes_the_callback_with_its_path(self, make_source: Any, watches: list, tmp_path: Path) -> None:
        seen = _Recorder()
        watch = self._watch(make_source(), watches, [tmp_path], seen, recursive=False)
        assert watch.alive
        (tmp_path / "new").write_bytes(b"x")
        seen.wait_for(tmp_path / "new")
        assert all(kind in ("added", "modified", "deleted") for batch in seen.batches for kind, _ in batch)

    def test_recursive_watches_see_nested_files(self, make_source: Any, watches: list, tmp_path: Path) -> None:
        (tmp_path / "sub").mkdir()
        seen = _Recorder()
        self._watch(make_source(), watches, [tmp_path], seen, recursive=True)
        (tmp_path / "sub" / "deep").write_bytes(b"x")
        seen.wait_for(tmp_path / "sub" / "deep")

    def test_a_failing_callback_never_kills_the_watch(self, make_source: Any, watches: list, tmp_path: Path) -> None:
        seen = _Recorder(fail_first=True)
        watch = self._watch(make_source(), watches, [tmp_path], seen, recursive=False)
        (tmp_path / "one").write_bytes(b"x")
        seen.wait_for(tmp_path / "one")
        (tmp_path / "two").write_bytes(b"x")
        seen.wait_for(tmp_path / "two")
        assert watch.alive

    def test_stop_ends_the_thread(self, make_source: Any, watches: list, tmp_path: Path) -> None:
        watch = self._watch(make_source(), watches, [tmp_path], _Recorder(), recursive=False)
        assert watch.stop(5.0) is True
        assert not watch.alive

    def test_a_missing_path_fails_at_start_not_later(self, make_source: Any, tmp_path: Path) -> None:
        with pytest.raises(OSError):
            make_source().watch([tmp_path / "missing"], _Recorder(), recursive=False, debounce_ms=100,
                                step_ms=20, thread_name="ql-contract-watch")
