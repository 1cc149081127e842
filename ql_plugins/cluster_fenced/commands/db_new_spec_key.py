"""``ql db new-spec-key PATH``: create a task-spec key file (32 random bytes, 0600, never replacing
a file); prints its key id only."""

from __future__ import annotations

import argparse

from ql_core.cli.output import Output

__all__ = ["HELP", "TARGET", "run"]

HELP = "new-spec-key PATH: create a task-spec key file"
TARGET = "PATH"


def run(args: argparse.Namespace, path: str, out: Output) -> int:
    import os

    from ..sealing import new_key_file

    key_id = new_key_file(os.path.abspath(path))
    out.emit({"path": os.path.abspath(path), "key_id": key_id},
             f"created {os.path.abspath(path)} (key id {key_id}, mode 600); copy it to every control node and "
             f"worker and set [plugin.cluster-fenced] spec_key_file to it")
    return 0
