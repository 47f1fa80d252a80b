"""What ``GET /metrics`` reads from the database at each scrape (docs/metrics.md).

Counts only, in one read transaction: the database is shared by every api process, so a
figure read here is the same whichever process answers the scrape. No task name, argv or
value leaves this module: the labels are statuses, stable error codes and journal states.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, and_, func, select

from app.domain.journal import CONSUMED, STATES
from app.domain.states import TERMINAL_RUN, RunStatus
from app.storage.tables import (
    ACTIVE_ATTEMPT,
    ACTIVE_ATTEMPT_STATUSES,
    attempts,
    receipt_journal,
    runs,
)
from app.storage.uow import UnitOfWork

# The attempts starting or running by status (ix_attempts_status_id, whose predicate the
# query repeats as its own).
ACTIVE_BY_STATUS = (
    select(attempts.c.status, func.count()).where(ACTIVE_ATTEMPT).group_by(attempts.c.status)
)
_TERMINAL = tuple(s.value for s in TERMINAL_RUN)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One scrape's counts."""

    runs_by_status: dict[str, int]
    # Terminal runs by status and their latest attempt's error code ("" when none).
    ended_by_code: dict[tuple[str, str], int]
    attempts_active: dict[str, int]
    journal_by_state: dict[str, int]
    log_bytes: int


def read_snapshot(engine: Engine) -> MetricsSnapshot:
    """Five aggregate reads; each is one index or table scan, never a row per run returned."""
    latest = and_(attempts.c.run_id == runs.c.id, attempts.c.number == runs.c.latest_attempt)
    with UnitOfWork(engine, write=False) as uow:
        conn = uow.conn
        by_status = conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status)).all()
        ended = conn.execute(
            select(runs.c.status, attempts.c.error_code, func.count())
            .select_from(runs.join(attempts, latest))
            .where(runs.c.status.in_(_TERMINAL))
            .group_by(runs.c.status, attempts.c.error_code)
        ).all()
        active = conn.execute(ACTIVE_BY_STATUS).all()
        journal = conn.execute(
            select(receipt_journal.c.state, func.count())
            .where(receipt_journal.c.state != CONSUMED)
            .group_by(receipt_journal.c.state)
        ).all()
        # Logs still there only (docs/retention.md §3): an expiring or expired log is freed.
        log_bytes = conn.execute(
            select(func.coalesce(func.sum(attempts.c.log_bytes), 0)).where(
                attempts.c.log_state.is_(None)
            )
        ).scalar()
    statuses = {s.value: 0 for s in RunStatus}
    statuses.update({str(status): int(n) for status, n in by_status})
    return MetricsSnapshot(
        runs_by_status=statuses,
        ended_by_code={(str(s), str(code or "")): int(n) for s, code, n in ended},
        attempts_active={s: 0 for s in ACTIVE_ATTEMPT_STATUSES}
        | {str(s): int(n) for s, n in active},
        # Every state not consumed, 0 included: an alert on quarantined > 0 needs the series.
        journal_by_state={s: 0 for s in STATES - {CONSUMED}} | {str(s): int(n) for s, n in journal},
        log_bytes=int(log_bytes or 0),
    )
