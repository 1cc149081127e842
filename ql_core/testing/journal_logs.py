"""Part 4 of the journal contract: the log ledger (:class:`~ql_core.ports.journal.LogLedger`).

The log artifact the create commit writes, truncation recorded once with its event, the live and
ended pages, final sizes and their running total, deletion.
"""

from __future__ import annotations

from ql_core.ids import new_id
from ql_core.ports.journal import EventSpec, JournalBackend, Transition

from .journal_support import OWNER, JournalFixtures, new_run

__all__ = ["LogLedgerContract"]


class LogLedgerContract(JournalFixtures):
    """The log ledger. Subclass and provide ``make_backend(tmp_path: Path)``."""

    # -- log facts -------------------------------------------------------------------------------
    def test_log_truncation_is_recorded_once_with_its_event(self, store: JournalBackend) -> None:
        new = new_run()
        store.create(new)
        event = EventSpec("log.truncated", attempt_id=new.attempt_id, reason="LOG_MAX_BYTES")
        first = store.mark_log_truncated(new.log_artifact_id, event)
        assert [(e.type, e.seq, e.reason) for e in first] == [("log.truncated", 2, "LOG_MAX_BYTES")]
        assert store.mark_log_truncated(new.log_artifact_id, event) == []
        assert store.log_facts(new.log_artifact_id).truncated is True  # type: ignore[union-attr]

    def test_log_pages_sizes_and_deletion(self, store: JournalBackend) -> None:
        live, ended = new_run(created_at_ms=1_000), new_run(created_at_ms=2_000)
        for new in (live, ended):
            store.create(new)
        store.transition(ended.attempt_id, lambda snap: (None, Transition(
            attempt={"status": "succeeded", "exit_code": 0}, run={"status": "succeeded", "exit_code": 0},
            events=(EventSpec("attempt.succeeded"), EventSpec("run.succeeded")), terminal=True)))
        assert [f.id for f in store.page_live_logs(OWNER, "", 10)] == [live.log_artifact_id]
        assert [f.id for f in store.ended_logs(OWNER, unsized=True, limit=10)] == [ended.log_artifact_id]
        store.record_log_sizes({ended.log_artifact_id: 77})
        assert store.ended_logs(OWNER, unsized=True, limit=10) == []
        assert [f.size_bytes for f in store.ended_logs(OWNER, sized=True, limit=10)] == [77]
        assert store.ended_log_bytes(OWNER) == 77
        assert [f.id for f in store.ended_logs(OWNER, created_before_ms=3_000, limit=10)] == [ended.log_artifact_id]
        assert store.ended_logs(OWNER, created_before_ms=1_500, limit=10) == []
        store.mark_log_deleted(ended.log_artifact_id, 4_000, 77)
        assert store.log_facts(ended.log_artifact_id).deleted  # type: ignore[union-attr]
        assert store.ended_log_bytes(OWNER) == 0 and store.ended_logs(OWNER, sized=True, limit=10) == []

    def test_an_unknown_log_reads_as_none(self, store: JournalBackend) -> None:
        assert store.log_facts(new_id()) is None
        assert store.mark_log_truncated(new_id(), EventSpec("log.truncated")) == []
