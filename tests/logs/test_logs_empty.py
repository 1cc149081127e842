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
