"""ql: crash-safe local task execution (ADR-0007).

Import nothing heavy here: ``ql --help`` must not pay for SQLAlchemy.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
