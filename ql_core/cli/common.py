"""Helpers shared by the command modules: config from the global options, the runtime."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ql_core.config import Config
    from ql_core.runtime import Runtime

__all__ = ["config_from_args", "runtime_from_args"]


def config_from_args(args: argparse.Namespace) -> Config:
    from ql_core.config import load_config

    return load_config(
        config_path=getattr(args, "config", None),
        data_dir=getattr(args, "data_dir", None),
        profile=getattr(args, "profile", None),
    )


def runtime_from_args(args: argparse.Namespace) -> Runtime:
    """An opened runtime (schema migrated, plugins loaded) for the command's config."""
    from ql_core.runtime import Runtime

    return Runtime.open(config_from_args(args))
