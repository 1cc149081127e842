"""``ql logs RUN_ID [--follow] [--offset N]``: the log from a byte offset.

With ``--follow`` it keeps printing until the run has ended and its log is
drained — even when no supervisor runs (the follower settles the run itself).
The log's bytes go to stdout untouched; notes (truncated by the quota, deleted
by retention) go to stderr.

``--json`` prints one object per chunk, ``{"run_id", "offset", "end",
"encoding", "data"}``: ``encoding`` is ``utf-8`` (``data`` is the text) or
``base64`` (``data`` is the bytes, base64-encoded: a chunk that is not valid
UTF-8). A chunk never ends inside a UTF-8 character: an incomplete character
waits for its next bytes. The last object is the run's state,
``{"run_id", "status", "exit_code", "reason", "end", "log_truncated",
"log_deleted"}``; ``end`` is the byte offset to resume from (``--offset END``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Iterable

from ql_core.cli.output import Output
from ql_core.errors import DatabaseError

HELP = "print a run's log from a byte offset; --follow until the run ends"
EPILOG = ("--json: one object per chunk {run_id, offset, end, encoding: utf-8|base64, data}, then one "
          "with the run's state {run_id, status, exit_code, reason, end, log_truncated, log_deleted}. "
          "Resume with --offset END.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN", help="a run id, a unique prefix of one, or `last` (the newest run)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    parser.add_argument("--offset", type=int, default=0, metavar="N", help="start at this byte offset")


def utf8_incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a UTF-8 character that is not complete yet (0-3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        if byte & 0x80 == 0:  # ASCII: complete
            return 0
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 0
        return back if need > back else 0
    return 0


class JsonChunks:
    """Turns log chunks into ``--json`` records that never split a UTF-8 character."""

    def __init__(self, run_id: str, offset: int) -> None:
        self.run_id = run_id
        self.end = offset  # the offset after the last byte emitted
        self._pending = b""

    def feed(self, data: bytes) -> list[dict[str, object]]:
        buf = self._pending + data
        keep = utf8_incomplete_tail(buf)
        ready, self._pending = (buf[:-keep], buf[-keep:]) if keep else (buf, b"")
        return self._records(ready)

    def flush(self) -> list[dict[str, object]]:
        """The held-back bytes of an incomplete character at the very end (kept, as base64)."""
        ready, self._pending = self._pending, b""
        return [self._record("base64", ready)] if ready else []

    def _records(self, data: bytes) -> list[dict[str, object]]:
        """Valid UTF-8 as text; a line holding bytes that are not UTF-8 as base64 (from the first bad
        byte to the end of its line), so text around binary stays readable."""
        out: list[dict[str, object]] = []
        while data:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                if exc.start:
                    out.append(self._record("utf-8", data[:exc.start]))
                newline = data.find(b"\n", exc.end - 1)
                cut = len(data) if newline < 0 else newline + 1
                out.append(self._record("base64", data[exc.start:cut]))
                data = data[cut:]
                continue
            out.append(self._record("utf-8", data))
            break
        return out

    def _record(self, encoding: str, data: bytes) -> dict[str, object]:
        import base64

        text = data.decode("utf-8") if encoding == "utf-8" else base64.b64encode(data).decode("ascii")
        record = {"run_id": self.run_id, "offset": self.end, "end": self.end + len(data),
                  "encoding": encoding, "data": text}
        self.end += len(data)
        return record


def run(args: argparse.Namespace, out: Output) -> int:
    from ql_core.cli.common import reader_for_run, start_up_over
    from ql_core.errors import UsageError

    if args.follow:
        start_up_over()  # following lasts as long as the run: the garbage collector is back on
    if args.offset < 0:
        raise UsageError("--offset must be >= 0")
    if not args.follow:  # a read without --follow settles nothing: the quick path may answer it
        from ql_core.cli.quick_read import quick_reader_for_run

        quick = quick_reader_for_run(args)
        if quick is not None:
            reader, run_id = quick
            try:
                done = _run_quick(args, out, reader, run_id)
            finally:
                reader.close()
            if done is not None:
                return done
    rt, args.run_id = reader_for_run(args)
    try:
        if rt.config.artifact_store:
            return _run_shipped(args, out, rt)
        return _run_local(args, out, rt)
    finally:
        rt.close()


def _run_local(args: argparse.Namespace, out: Output, rt: Any) -> int:
    from ql_core.follow import follow_log
    from ql_core.logs import log_facts

    chunks = JsonChunks(args.run_id, args.offset) if out.json_mode else None
    _write_chunks(follow_log(rt.node, args.run_id, offset=args.offset, follow=args.follow), chunks, out)
    view = rt.status(args.run_id)
    facts = log_facts(rt.node, view.log_artifact_id) if view.log_artifact_id else None
    return _finish_local(args, out, rt.config.data_dir, view, facts, chunks)


def _run_quick(args: argparse.Namespace, out: Output, reader: Any, run_id: str) -> int | None:
    """The log of a known run, without ``--follow``, on the quick path (as :func:`follow_log` reads it
    then: from the offset to the end, never past the quota, nothing of a deleted log); None when the
    run cannot be read here (the full path then says why)."""
    from ql_core.logs import LOG_CHUNK_BYTES, read_log_chunk

    try:
        view = reader.status(run_id)
        facts = reader.log_facts(view.log_artifact_id) if view is not None and view.log_artifact_id else None
    except Exception:  # noqa: BLE001 - the full path reports it
        return None
    if view is None:
        return None
    args.run_id = run_id
    data_dir = reader.config.data_dir

    def chunks_of() -> Iterable[bytes]:
        if view.log_artifact_id is None or not view.attempts or (facts is not None and facts.deleted):
            return
        offset = args.offset
        while data := read_log_chunk(data_dir, view.log_artifact_id, offset, LOG_CHUNK_BYTES,
                                     max_bytes=facts.max_bytes if facts is not None else None):
            yield data
            offset += len(data)

    chunks = JsonChunks(run_id, args.offset) if out.json_mode else None
    _write_data(chunks_of(), chunks, out)
    return _finish_local(args, out, data_dir, view, facts, chunks)


def _finish_local(args: argparse.Namespace, out: Output, data_dir: Any, view: Any, facts: Any,
                  chunks: JsonChunks | None) -> int:
    """After the log's bytes: the ``--json`` state record, or the note of a truncated or deleted log."""
    from ql_core.cli.notes import note, note_end_status
    from ql_core.logs import log_size

    if chunks is not None:
        if view.terminal:  # nothing will complete a character cut at the very end any more
            for record in chunks.flush():
                out.emit(record)
        end = chunks.end
        if end == args.offset and end > 0:  # nothing read from --offset: past the log's real end?
            size = log_size(data_dir, view.log_artifact_id) if view.log_artifact_id else None
            size = 0 if size is None else size
            if facts is not None and facts.max_bytes is not None:
                size = min(size, facts.max_bytes)
            end = min(end, size)
        out.emit({"run_id": view.run_id, "status": view.status, "exit_code": view.exit_code,
                  "reason": view.reason, "end": end,
                  "log_truncated": bool(facts is not None and facts.truncated),
                  "log_deleted": bool(facts is not None and facts.deleted)})
    elif facts is not None:
        if facts.deleted:
            note(False, "log_deleted", f"ql: the log of run {args.run_id} was deleted by retention")
        elif facts.truncated:
            note(False, "log_truncated", f"ql: log truncated at {facts.max_bytes} bytes (log_max_bytes); "
                                         f"later output of the task was dropped")
    if args.follow and view.terminal:
        return note_end_status(out.json_mode, view)
    return 0


def _write_chunks(stream: Iterable[Any], chunks: JsonChunks | None, out: Output) -> None:
    """Each chunk as it comes: raw bytes to stdout, or (``--json``) records that never split a character."""
    _write_data((chunk.data for chunk in stream), chunks, out)


def _write_data(stream: Iterable[bytes], chunks: JsonChunks | None, out: Output) -> None:
    for data in stream:
        if chunks is not None:
            for record in chunks.feed(data):
                out.emit(record)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()


def _run_shipped(args: argparse.Namespace, out: Output, rt: object) -> int:
    """``ql logs`` on a cluster node: the shipped chunks, from the artifact store."""
    from ql_core.ports.artifact_store import ArtifactAccessDenied, ArtifactStoreError

    config = rt.config  # type: ignore[attr-defined]
    store = rt.plugins.artifact_stores.create(config.artifact_store, rt.context)  # type: ignore[attr-defined]
    try:
        return _print_shipped(args, out, store, config)
    except ArtifactAccessDenied:
        raise DatabaseError("this node's database role may not read shipped logs (a least-privilege worker "
                            "role can only call the worker functions): run ql logs with a control node's "
                            "config, or a database_url whose role may read the run and artifact tables "
                            "(docs/cluster.md, Logs)") from None
    except ArtifactStoreError as exc:
        raise DatabaseError(f"cannot read the shipped log: {exc}") from None
    finally:
        store.close()


def _print_shipped(args: argparse.Namespace, out: Output, store: Any, config: Any) -> int:
    """The shipped chunks from ``args.offset`` (following when asked), then the state record or note."""
    from ql_core.follow import follow_artifact

    chunks = JsonChunks(args.run_id, args.offset) if out.json_mode else None
    _write_chunks(follow_artifact(store, args.run_id, offset=args.offset, follow=args.follow,
                                  unfinalized_s=float(config.profile.log_follow_unfinalized_s)), chunks, out)
    ref = store.run_log(args.run_id)
    state = store.state(ref.attempt_id) if ref is not None and ref.attempt_id else None
    if chunks is not None:
        if ref is not None and ref.terminal:
            for record in chunks.flush():
                out.emit(record)
        out.emit({"run_id": args.run_id, "status": ref.status if ref else None,
                  "exit_code": ref.exit_code if ref else None, "reason": ref.reason if ref else None,
                  "end": chunks.end, "log_truncated": False, "log_deleted": False,
                  "log_finalized": bool(state is not None and state.finalized)})
    elif args.follow and ref is not None and ref.terminal and not (state is not None and state.finalized) \
            and ref.attempt_id is not None:
        sys.stderr.write(f"ql: the worker has not finalized the log of run {args.run_id} yet; "
                         f"run ql logs again later to read the rest\n")
    if args.follow and ref is not None and ref.terminal:
        from ql_core.cli.notes import note, end_status_text
        from ql_core.states import exit_status_for

        status = exit_status_for(ref.status, ref.exit_code)
        note(out.json_mode, "ended", end_status_text(args.run_id, ref.status, ref.exit_code, ref.reason),
             run_id=args.run_id, status=ref.status, exit_code=ref.exit_code, reason=ref.reason,
             exit_status=status)
        return status
    return 0
