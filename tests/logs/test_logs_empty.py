"""A task that printed nothing leaves no log file; a log someone still holds open is kept (issue 25)."""

from __future__ import annotations

import os

from tests.conftest import run_ql


def test_an_empty_log_is_removed_once_its_size_is_recorded(runtime) -> None:
    from ql_core.logs import log_facts

    quiet = runtime.run(["true"])
    spoke = runtime.run(["sh", "-c", "echo hello"])
    assert quiet.status == spoke.status == "succeeded"
    assert not runtime.log_path(quiet.run_id).exists()
    facts = log_facts(runtime.node, quiet.log_artifact_id)
    assert facts.size_bytes == 0 and not facts.deleted  # recorded empty, not "deleted by retention"
    assert runtime.log_path(spoke.run_id).read_bytes() == b"hello\n"
    assert log_facts(runtime.node, spoke.log_artifact_id).size_bytes == 6  # sized by the waiting host too
    # Every reader sees the missing file as the empty log it was.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    done = run_ql(["--data-dir", str(runtime.node.config.data_dir), "logs", quiet.run_id], env)
    assert done.returncode == 0 and done.stdout == "" and "deleted" not in done.stderr


def test_an_empty_log_held_open_elsewhere_is_kept(runtime) -> None:
    sub = runtime.submit(["sh", "-c", "sleep 0.5"])
    path = runtime.log_path(sub.run_id)
    held = os.open(path, os.O_RDONLY)  # a reader (or a descendant of the task) still has it
    try:
        assert runtime.wait(sub).status == "succeeded"
        assert path.exists() and path.stat().st_size == 0
    finally:
        os.close(held)


def test_an_awaited_empty_log_held_open_elsewhere_is_kept_and_sized(runtime) -> None:
    """The acknowledged path records the size (0) in its terminal commit; the file it then cannot
    drop (another descriptor of it is open) stays, empty, with that size."""
    from ql_core.logs import log_facts

    sub = runtime.submit(["sh", "-c", "sleep 0.5"], awaited=True)
    path = runtime.log_path(sub.run_id)
    held = os.open(path, os.O_RDONLY)
    try:
        assert runtime.wait(sub).status == "succeeded"
        assert path.exists() and path.stat().st_size == 0
        assert log_facts(runtime.node, sub.log_artifact_id).size_bytes == 0
    finally:
        os.close(held)


def test_a_log_found_empty_that_grew_before_its_drop_is_kept(runtime, tmp_path) -> None:
    """An ``EmptyLog`` is dropped only if it is still empty then: a descendant of the task that wrote
    after the look keeps the file, and the caller is told to size it again."""
    from ql_core.ids import new_id
    from ql_core.logs import open_empty_log, open_log_artifact
    from ql_core.paths import log_path

    data, log_id = runtime.node.config.data_dir, new_id()
    writer = open_log_artifact(data, log_id)
    try:
        empty = open_empty_log(data, log_id)
        assert empty is not None
        os.write(writer, b"late\n")  # after the look, before the drop
        assert empty.drop() is None
    finally:
        os.close(writer)
    assert log_path(data, log_id).read_bytes() == b"late\n"
    quiet = open_empty_log(data, new_id())
    assert quiet is None  # no such log: nothing to drop
