"""ql's own log lines (loguru), quiet unless the host asks — and free until then.

Library code logs ids, counts and reason codes — never a command, argv,
environment, token or task output. ql's messages are disabled until a host
calls :func:`enable_logging` (the CLI does with ``QL_LOG_LEVEL``), or enables
``ql_core`` / ``ql_executors`` / ``ql_plugins`` in its own loguru logger.

:data:`logger` is a small proxy so that loguru (which imports asyncio, ~20 ms)
is imported only when a message can actually be shown: when the host has
loguru loaded already (it decides what is enabled) or after
:func:`enable_logging`. Otherwise a message costs one dictionary lookup.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["logger", "enable_logging", "LEVELS"]

_OURS = ("ql_core", "ql_executors", "ql_plugins")
#: loguru's level names ``QL_LOG_LEVEL`` may take.
LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
_state = {"enabled": False, "quieted": False}


def _quiet(module: Any) -> None:
    """Turn ours off in the host's loguru once — unless the host already decided about them."""
    if _state["quieted"]:
        return
    _state["quieted"] = True
    if _state["enabled"]:
        return
    rules = getattr(getattr(module.logger, "_core", None), "activation_list", [])
    if any(isinstance(rule, tuple) and str(rule[0]).split(".")[0] in _OURS for rule in rules):
        return  # the host enabled or disabled ours explicitly: its call
    for name in _OURS:  # ours stay off in a host that uses loguru, until it enables them
        module.logger.disable(name)


def _loguru() -> Any:
    """loguru's logger if a message may be shown, else None (without importing loguru)."""
    module = sys.modules.get("loguru")
    if module is None:
        if not _state["enabled"]:
            return None
        import loguru as module
    _quiet(module)
    return module.logger


class _Logger:
    """The few loguru methods ql uses, forwarded only when loguru may show them."""

    def _emit(self, level: str, message: str, *args: Any, **kwargs: Any) -> None:
        target = _loguru()
        if target is not None:
            getattr(target.opt(depth=2), level)(message, *args, **kwargs)

    def debug(self, message: str, *args: Any, **kwargs: Any) -> None:
        self._emit("debug", message, *args, **kwargs)

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        self._emit("info", message, *args, **kwargs)

    def warning(self, message: str, *args: Any, **kwargs: Any) -> None:
        self._emit("warning", message, *args, **kwargs)

    def error(self, message: str, *args: Any, **kwargs: Any) -> None:
        self._emit("error", message, *args, **kwargs)


logger = _Logger()
if "loguru" in sys.modules:  # a host that imported loguru first: ours are off before it can log them
    _quiet(sys.modules["loguru"])


def enable_logging(level: str = "INFO") -> None:
    """Route ql's log lines to stderr at ``level`` (one of :data:`LEVELS`)."""
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    _state["enabled"] = True
    from loguru import logger as real

    real.remove()
    real.add(sys.stderr, level=level, format="{time:YYYY-MM-DDTHH:mm:ss.SSS} {level} {message}")
    for name in _OURS:
        real.enable(name)
    _state["quieted"] = True
