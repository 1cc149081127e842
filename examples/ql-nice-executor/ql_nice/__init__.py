"""ql-nice-executor: run ql tasks under ``nice``, ``ionice`` and ``prlimit`` (a third-party ql plugin)."""

__version__ = "1.0.0"
