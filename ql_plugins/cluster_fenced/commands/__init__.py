"""The cluster plane's commands, registered through ``ql_register_commands`` (plugin.py).

``ql worker``, ``ql control``, ``ql workers``, and the cluster actions of ``ql db``
(``grant-worker ROLE``, ``new-spec-key PATH``). Each module is imported only when its command is
built (``ql --help``, or that command runs).
"""

from __future__ import annotations

__all__ = ["FAIL", "USAGE", "COMMAND_MODULES"]

FAIL = ("1", "an operational failure (one line on stderr names the cause and the fix)")
USAGE = ("2", "a usage or configuration error")

#: command name -> module of this package (``db <action>``: an action of ``ql db``).
COMMAND_MODULES = {
    "worker": "worker",
    "control": "control",
    "workers": "workers",
    "db grant-worker": "db_grant_worker",
    "db new-spec-key": "db_new_spec_key",
}
