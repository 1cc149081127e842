"""The promises an artifact store makes to the log shipper and to ``ql logs`` (docs/plugins.md).

Subclass :class:`ArtifactStoreContract` and provide the ``artifact_writer`` fixture: a callable
that sets up ONE attempt the store may be written for and returns an :class:`ArtifactWriter`
(the store, the attempt id, a proof the store accepts and one it must refuse). Optionally override
``end_run`` to make the retention test run (a store without runs to age skips it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from ql_core.ports.artifact_store import MAX_CHUNK_BYTES, ArtifactStore

__all__ = ["ArtifactStoreContract", "ArtifactWriter", "sha256_hex"]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class ArtifactWriter:
    store: ArtifactStore
    attempt_id: str
    #: A proof the store accepts for ``attempt_id``.
    proof: Any
    #: A proof it must refuse for ``attempt_id`` (e.g. the right worker with a wrong token).
    foreign_proof: Any
    #: Another handle on the same artifacts (a second reader/writer connection), for visibility.
    reader: ArtifactStore | None = None


def _blob(n: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ from chunk to chunk (never all the same byte)."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


class ArtifactStoreContract:
    """Every artifact store passes these (the built-in ``postgres`` one runs them in tests/cluster)."""

    MAX_BYTES = 8 * MAX_CHUNK_BYTES

    @pytest.fixture
    def artifact_writer(self) -> Callable[[], ArtifactWriter]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError("provide an artifact_writer fixture")

    def end_run(self, writer: ArtifactWriter, *, ended_ago_s: float) -> None:
        """Make the run of ``writer.attempt_id`` terminal ``ended_ago_s`` ago (override to test retention)."""
        pytest.skip("this store's test does not age runs")

    @pytest.fixture
    def w(self, artifact_writer: Callable[[], ArtifactWriter]) -> ArtifactWriter:
        return artifact_writer()

    def _open(self, w: ArtifactWriter, max_bytes: int | None = None) -> None:
        state = w.store.open(w.attempt_id, w.proof, max_bytes=self.MAX_BYTES if max_bytes is None else max_bytes)
        assert not state.fenced, state.fence_reason
        assert state.committed_bytes == 0 and not state.finalized

    def _ship(self, w: ArtifactWriter, data: bytes, chunk: int, start: int = 0) -> None:
        at = start
        while at < len(data):
            piece = data[at:at + chunk]
            result = w.store.append(w.attempt_id, w.proof, at, piece, sha256_hex(piece))
            assert str(result.answer) == "appended", result
            at += len(piece)
            assert result.committed_bytes == at

    def _read_all(self, store: ArtifactStore, attempt_id: str, limit: int = MAX_CHUNK_BYTES) -> bytes:
        out = bytearray()
        while True:
            data = store.read(attempt_id, len(out), limit)
            if not data:
                return bytes(out)
            assert len(data) <= limit
            out += data

    # -- open / state ------------------------------------------------------------------------------
    def test_nothing_before_the_first_open(self, w: ArtifactWriter) -> None:
        assert w.store.state(w.attempt_id) is None
        assert w.store.read(w.attempt_id, 0) == b""

    def test_open_is_idempotent_and_reports_where_to_resume(self, w: ArtifactWriter) -> None:
        self._open(w)
        self._ship(w, b"hello ", 6)
        again = w.store.open(w.attempt_id, w.proof, max_bytes=self.MAX_BYTES * 2)
        assert again.committed_bytes == 6 and again.max_bytes == self.MAX_BYTES  # quota fixed at first open
        state = w.store.state(w.attempt_id)
        assert state is not None and state.committed_bytes == 6 and not state.finalized

    # -- append ------------------------------------------------------------------------------------
    def test_bytes_read_back_with_the_same_offsets(self, w: ArtifactWriter) -> None:
        data = _blob(MAX_CHUNK_BYTES * 2 + 12345)
        self._open(w)
        self._ship(w, data, MAX_CHUNK_BYTES)
        assert self._read_all(w.store, w.attempt_id) == data
        assert self._read_all(w.store, w.attempt_id, limit=1000) == data
        for offset in (0, 1, MAX_CHUNK_BYTES - 1, MAX_CHUNK_BYTES, len(data) - 1):
            # a read may stop early (at a chunk's end, like a short pread) but never returns nothing
            # before the end, and what it returns sits at exactly those offsets
            piece = w.store.read(w.attempt_id, offset, 7)
            assert 1 <= len(piece) <= 7 and piece == data[offset:offset + len(piece)]
        assert w.store.read(w.attempt_id, len(data)) == b""
        assert w.store.read(w.attempt_id, len(data) + 10) == b""
        if w.reader is not None:  # committed means visible to any other reader at once
            assert self._read_all(w.reader, w.attempt_id) == data

    def test_a_read_never_returns_more_than_one_chunk_limit(self, w: ArtifactWriter) -> None:
        data = _blob(MAX_CHUNK_BYTES + 10)
        self._open(w)
        self._ship(w, data, MAX_CHUNK_BYTES)
        assert len(w.store.read(w.attempt_id, 0, 10 * MAX_CHUNK_BYTES)) <= MAX_CHUNK_BYTES

    def test_an_identical_replay_is_a_no_op(self, w: ArtifactWriter) -> None:
        self._open(w)
        self._ship(w, b"abcdef", 3)
        result = w.store.append(w.attempt_id, w.proof, 3, b"def", sha256_hex(b"def"))
        assert str(result.answer) == "duplicate" and result.committed_bytes == 6
        assert self._read_all(w.store, w.attempt_id) == b"abcdef"

    def test_a_different_chunk_at_a_committed_offset_is_refused(self, w: ArtifactWriter) -> None:
        self._open(w)
        self._ship(w, b"abcdef", 3)
        for offset, piece in ((3, b"XYZ"), (3, b"de"), (4, b"ef")):
            result = w.store.append(w.attempt_id, w.proof, offset, piece, sha256_hex(piece))
            assert str(result.answer) == "conflict" and result.committed_bytes == 6
        assert self._read_all(w.store, w.attempt_id) == b"abcdef"

    def test_a_chunk_whose_sha_does_not_match_is_refused(self, w: ArtifactWriter) -> None:
        self._open(w)
        result = w.store.append(w.attempt_id, w.proof, 0, b"good", sha256_hex(b"evil"))
        assert str(result.answer) == "corrupt" and result.committed_bytes == 0
        assert w.store.read(w.attempt_id, 0) == b""
        self._ship(w, b"good", 4)  # the same offset takes the right bytes afterwards

    def test_a_gap_is_refused(self, w: ArtifactWriter) -> None:
        self._open(w)
        self._ship(w, b"abc", 3)
        result = w.store.append(w.attempt_id, w.proof, 4, b"e", sha256_hex(b"e"))
        assert str(result.answer) == "gap" and result.committed_bytes == 3

    def test_the_quota_is_enforced(self, w: ArtifactWriter) -> None:
        self._open(w, max_bytes=10)
        self._ship(w, b"0123456", 7)
        result = w.store.append(w.attempt_id, w.proof, 7, b"7890", sha256_hex(b"7890"))
        assert str(result.answer) == "quota" and result.committed_bytes == 7
        self._ship(w, b"0123456789", 3, start=7)

    def test_chunk_size_bounds(self, w: ArtifactWriter) -> None:
        self._open(w)
        big = b"x" * (MAX_CHUNK_BYTES + 1)
        with pytest.raises(ValueError):
            w.store.append(w.attempt_id, w.proof, 0, big, sha256_hex(big))
        with pytest.raises(ValueError):
            w.store.append(w.attempt_id, w.proof, 0, b"", sha256_hex(b""))
        self._ship(w, b"x" * MAX_CHUNK_BYTES, MAX_CHUNK_BYTES)

    # -- finalize ------------------------------------------------------------------------------------
    def test_finalize_checks_length_and_whole_sha(self, w: ArtifactWriter) -> None:
        data = _blob(3000, seed=1)
        self._open(w)
        self._ship(w, data, 1000)
        assert str(w.store.finalize(w.attempt_id, w.proof, total_bytes=2999, sha256=sha256_hex(data[:2999])).answer) \
            == "mismatch"
        assert str(w.store.finalize(w.attempt_id, w.proof, total_bytes=3001, sha256=sha256_hex(data)).answer) \
            == "mismatch"
        assert str(w.store.finalize(w.attempt_id, w.proof, total_bytes=3000, sha256=sha256_hex(b"other")).answer) \
            == "mismatch"
        state = w.store.state(w.attempt_id)
        assert state is not None and not state.finalized
        done = w.store.finalize(w.attempt_id, w.proof, total_bytes=3000, sha256=sha256_hex(data))
        assert str(done.answer) == "finalized" and done.acknowledged
        replay = w.store.finalize(w.attempt_id, w.proof, total_bytes=3000, sha256=sha256_hex(data))
        assert str(replay.answer) == "already_finalized" and replay.acknowledged
        state = w.store.state(w.attempt_id)
        assert state is not None and state.finalized and state.total_bytes == 3000
        assert state.sha256 == sha256_hex(data)
        late = w.store.append(w.attempt_id, w.proof, 3000, b"more", sha256_hex(b"more"))
        assert str(late.answer) == "finalized"
        # a replay of a committed chunk after finalize is still recognised
        assert str(w.store.append(w.attempt_id, w.proof, 0, data[:1000], sha256_hex(data[:1000])).answer) \
            == "duplicate"
        assert self._read_all(w.store, w.attempt_id) == data

    def test_an_empty_log_finalizes(self, w: ArtifactWriter) -> None:
        self._open(w)
        assert w.store.finalize(w.attempt_id, w.proof, total_bytes=0, sha256=sha256_hex(b"")).acknowledged

    # -- proofs --------------------------------------------------------------------------------------
    def test_a_foreign_proof_writes_nothing(self, w: ArtifactWriter) -> None:
        refused = w.store.open(w.attempt_id, w.foreign_proof, max_bytes=self.MAX_BYTES)
        assert refused.fenced
        assert w.store.state(w.attempt_id) is None
        self._open(w)
        self._ship(w, b"mine", 4)
        result = w.store.append(w.attempt_id, w.foreign_proof, 4, b"theirs", sha256_hex(b"theirs"))
        assert str(result.answer) == "fenced" and result.fence_reason
        final = w.store.finalize(w.attempt_id, w.foreign_proof, total_bytes=4, sha256=sha256_hex(b"mine"))
        assert str(final.answer) == "fenced"
        state = w.store.state(w.attempt_id)
        assert state is not None and state.committed_bytes == 4 and not state.finalized

    # -- retention -----------------------------------------------------------------------------------
    def test_retention_deletes_old_logs_in_bounded_pages(self, w: ArtifactWriter) -> None:
        self._open(w)
        self._ship(w, _blob(5000), 1000)
        assert w.store.sweep(retention_s=3600, limit=100).chunks_deleted == 0  # the run has not ended
        self.end_run(w, ended_ago_s=10)
        assert w.store.sweep(retention_s=3600, limit=100).chunks_deleted == 0  # ended, but recently
        self.end_run(w, ended_ago_s=7200)
        first = w.store.sweep(retention_s=3600, limit=2)
        assert first.chunks_deleted == 2 and first.artifacts_deleted == 0
        deleted = first.chunks_deleted
        while True:
            page = w.store.sweep(retention_s=3600, limit=2)
            assert page.chunks_deleted <= 2
            deleted += page.chunks_deleted
            if page.artifacts_deleted:
                break
            assert page.chunks_deleted, "retention made no progress"
        assert deleted == 5
        assert w.store.state(w.attempt_id) is None
