"""``ql run --env K=V`` / ``--env K``: the variables a run adds to its task's environment.

``K=V`` sets ``K``; a bare ``K`` copies ``K`` from this ``ql`` process's environment (the
submitter's: for a cluster run that is not the worker's). Repeatable; the last one for a name wins.
Values are never printed or logged: an error names the option by its position and the rule, never a
name's value. The names and the count are checked again by ``Runtime.submit`` (``env_add``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ql_core.errors import UsageError
from ql_core.submit import MAX_ENV_ADD, check_env_add

__all__ = ["parse_env_options"]


def _nth(i: int) -> str:
    return f"the {i}{'st' if i == 1 else 'nd' if i == 2 else 'rd' if i == 3 else 'th'} --env"


def parse_env_options(options: Sequence[str] | None, environ: Mapping[str, str]) -> dict[str, str] | None:
    """The ``--env`` options as ``env_add`` (None when there are none); UsageError naming the fix."""
    if not options:
        return None
    if len(options) > MAX_ENV_ADD:
        raise UsageError(f"--env is given {len(options)} times, more than {MAX_ENV_ADD}; pass large settings "
                         f"in a file instead")
    added: dict[str, str] = {}
    for i, option in enumerate(options, 1):
        name, sep, value = option.partition("=")
        if not sep:
            if name not in environ:
                raise UsageError(f"{_nth(i)} names a variable that is not set in ql's environment: export it "
                                 f"first, or give --env NAME=VALUE")
            value = environ[name]
        try:
            check_env_add({name: value})
        except UsageError:
            raise UsageError(f"{_nth(i)} needs NAME=VALUE or NAME, a NAME of letters, digits and _ not starting "
                             f"with a digit (e.g. --env BUILD_ID=42)") from None
        added[name] = value
    return added
