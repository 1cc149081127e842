"""ql's own log lines (loguru), quiet unless the host asks.

Library code logs ids, counts and reason codes — never a command, argv,
environment, token or task output. loguru is disabled for ``ql_core`` until a
host calls :func:`enable_logging` (or the CLI does with ``QL_LOG_LEVEL``).
"""

from __future__ import annotations

import sys

from loguru import logger

__all__ = ["logger", "enable_logging"]

logger.disable("ql_core")
logger.disable("ql_executors")
logger.disable("ql_plugins")


def enable_logging(level: str = "INFO") -> None:
    """Route ql's log lines to stderr at ``level``."""
    logger.remove()
    logger.add(sys.stderr, level=level.upper(), format="{time:YYYY-MM-DDTHH:mm:ss.SSS} {level} {message}")
    for name in ("ql_core", "ql_executors", "ql_plugins"):
        logger.enable(name)
