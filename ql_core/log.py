"""ql's own log lines (loguru), quiet unless the host asks.

Library code logs ids, counts and reason codes — never a command, argv,
environment, token or task output. loguru is disabled for ``ql_core`` until a
host calls :func:`enable_logging` (or the CLI does with ``QL_LOG_LEVEL``).
"""

from __future__ import annotations

import sys

from loguru import logger

__all__ = ["logger", "enable_logging", "LEVELS"]

logger.disable("ql_core")
logger.disable("ql_executors")
logger.disable("ql_plugins")

#: The level names :func:`enable_logging` accepts (any case), quietest last.
LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")


def enable_logging(level: str = "INFO") -> None:
    """Route ql's log lines to stderr at ``level`` (one of :data:`LEVELS`, any case).

    An unknown level is a :class:`~ql_core.errors.ConfigError` naming the valid ones; nothing
    is changed then.
    """
    from .errors import ConfigError

    name = str(level).strip().upper()
    if name not in LEVELS:
        shown = str(level)[:40].encode("unicode_escape").decode("ascii")
        raise ConfigError(f"log level {shown!r} (QL_LOG_LEVEL) is not one of {', '.join(LEVELS)}; "
                          f"fix or unset QL_LOG_LEVEL")
    logger.remove()
    logger.add(sys.stderr, level=name, format="{time:YYYY-MM-DDTHH:mm:ss.SSS} {level} {message}")
    for module in ("ql_core", "ql_executors", "ql_plugins"):
        logger.enable(module)
