"""The exceptions ql raises for expected failures.

Every :class:`QlError` carries a one-line message that names the fix; the CLI
prints it without a traceback and exits with :attr:`QlError.exit_code`.
Messages never contain a command, argv, environment, token or user output.
"""

from __future__ import annotations

__all__ = [
    "QlError",
    "UsageError",
    "ConfigError",
    "PluginError",
    "DatabaseError",
    "PersistBeforeSpawnError",
    "NotFoundError",
    "UnsafePathError",
]


class QlError(Exception):
    """Base of every expected ql failure."""

    exit_code: int = 1


class UsageError(QlError):
    """Wrong command-line usage."""

    exit_code = 2


class ConfigError(QlError):
    """The configuration file or an override is invalid; the message names the key."""

    exit_code = 2


class PluginError(QlError):
    """A named plugin is missing or failed to load; the message lists what is installed."""

    exit_code = 2


class DatabaseError(QlError):
    """The run database cannot be opened, migrated or written."""


class PersistBeforeSpawnError(DatabaseError):
    """The create transaction failed, so nothing was spawned (ADR-0007 §2.2)."""


class NotFoundError(QlError):
    """A run or attempt id that the database does not know."""


class UnsafePathError(QlError):
    """A path under the data dir is a symlink or escapes its canonical root."""
