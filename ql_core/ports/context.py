"""What every plugin factory receives (:class:`RuntimeContext`) and what observers see (:class:`RunEventInfo`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ql_core.lean_tuple import LeanNamedTuple

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["RuntimeContext", "RunEventInfo"]


class RuntimeContext(LeanNamedTuple):
    """Handed to every plugin factory when a runtime first needs that plugin.

    ``config`` is the validated configuration; ``node_id`` this node's stable
    id (the ``runtime_owner`` of the attempts it starts). A plugin reads its
    own ``[plugin.<name>]`` table with :meth:`plugin_config`, validates it and
    raises :class:`~ql_core.errors.ConfigError` with a one-line message naming
    the key and the fix when it is wrong.
    """

    config: Config
    node_id: str
    #: The runtime was opened with ``create=False`` (``ql status``/``list``/``events``/``logs``): a
    #: plugin must create and migrate nothing — a missing database, directory or schema is an error
    #: naming the fix. (Writes that settle an attempt it shows are still allowed.)
    existing_only: bool = False
    #: This node's data dir existed before this runtime (it holds a node id): a store that finds its
    #: database missing or empty must refuse to start a fresh one (history would vanish silently).
    data_dir_in_use: bool = False

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    def plugin_config(self, name: str) -> dict[str, Any]:
        """The ``[plugin.<name>]`` table of the config file (a copy; ``{}`` when absent)."""
        return dict(self.config.plugin_settings.get(name, {}))


class RunEventInfo(LeanNamedTuple):
    """A committed run event, reduced to low-sensitivity fields (never a command, env or output)."""

    run_id: str
    seq: int
    type: str
    attempt_id: str | None = None
    status: str | None = None
    exit_code: int | None = None
    reason: str | None = None
