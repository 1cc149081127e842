"""Compare-and-set writes of runs and attempts, with their ordered events.

Every state change goes through :func:`change_run` / :func:`change_attempt`:
an ``UPDATE ... WHERE version = :seen`` that must touch exactly one row, plus
events numbered from the run's ``event_seq``. A lost race raises
:class:`ConflictError` and the caller's transaction rolls back and retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .interfaces import RunEventInfo

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

    from .db.models import Run, RunAttempt

__all__ = [
    "ConflictError",
    "EventSpec",
    "load_run",
    "load_attempt",
    "change_run",
    "change_attempt",
    "with_retries",
]

T = TypeVar("T")


class ConflictError(Exception):
    """Another transaction changed the row first (compare-and-set lost)."""


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A low-sensitivity event to append: only ids, type, status, exit code, reason."""

    type: str
    attempt_id: str | None = None
    status: str | None = None
    exit_code: int | None = None
    reason: str | None = None


def load_run(session: Session, run_id: str) -> Run | None:
    from sqlmodel import select

    from .db.models import Run

    return session.exec(select(Run).where(Run.id == run_id).with_for_update()).first()


def load_attempt(session: Session, attempt_id: str) -> RunAttempt | None:
    from sqlmodel import select

    from .db.models import RunAttempt

    return session.exec(select(RunAttempt).where(RunAttempt.id == attempt_id).with_for_update()).first()


def change_run(session: Session, run: Run, values: dict[str, Any], events: list[EventSpec],
               now_ms: int) -> list[RunEventInfo]:
    """CAS-update ``run`` (version and event_seq) and append ``events`` in order."""
    from sqlalchemy import update

    from .db.models import Run, RunEvent

    first_seq = run.event_seq + 1
    result = session.execute(
        update(Run)
        .where(Run.id == run.id, Run.version == run.version, Run.event_seq == run.event_seq)
        .values(version=run.version + 1, event_seq=run.event_seq + len(events), updated_at_ms=now_ms, **values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        raise ConflictError(run.id)
    infos = []
    for offset, spec in enumerate(events):
        seq = first_seq + offset
        session.add(RunEvent(run_id=run.id, seq=seq, type=spec.type, attempt_id=spec.attempt_id,
                             status=spec.status, exit_code=spec.exit_code, reason=spec.reason, at_ms=now_ms))
        infos.append(RunEventInfo(run_id=run.id, seq=seq, type=spec.type, attempt_id=spec.attempt_id,
                                  status=spec.status, exit_code=spec.exit_code, reason=spec.reason))
    session.flush()
    return infos


def change_attempt(session: Session, attempt: RunAttempt, values: dict[str, Any]) -> None:
    """CAS-update ``attempt`` on its version."""
    from sqlalchemy import update

    from .db.models import RunAttempt

    result = session.execute(
        update(RunAttempt)
        .where(RunAttempt.id == attempt.id, RunAttempt.version == attempt.version)
        .values(version=attempt.version + 1, **values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        raise ConflictError(attempt.id)


def with_retries(engine: Engine, work: Callable[[Session], T], *, retries: int, write: bool = True) -> T:
    """Run ``work`` in one transaction; retry a bounded number of times on CAS conflicts or a busy DB."""
    import time

    from sqlalchemy.exc import IntegrityError

    from .db.engine import is_busy_error, session_scope

    attempt = 0
    while True:
        try:
            with session_scope(engine, write=write) as session:
                return work(session)
        except ConflictError:
            pass
        except IntegrityError:
            pass  # a concurrent writer took the same event seq: same as a CAS conflict
        except Exception as exc:
            if not is_busy_error(exc):
                raise
        attempt += 1
        if attempt >= retries:
            raise ConflictError("gave up after %d tries" % attempt)
        time.sleep(min(0.005 * (2 ** attempt), 0.2))
