"""On PostgreSQL a budget or queue-cap check costs no round trip of its own.

The enqueue under ``QL_MAX_QUEUED`` and T1 under ``QL_MAX_RUNNING`` / ``max_concurrent``
take their advisory lock and then one write statement that also counts
(docs/concurrency-budgets.md §2, §3): every statement the driver is sent is recorded here,
and none is a count of its own. That the counts stay exact under concurrency is
tests/storage/test_queue_cap.py's and tests/execution/test_admission_budgets.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event

from app.domain.errors import AdmissionRefused, QueueFull
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import define_task

pytestmark = pytest.mark.postgres


@contextmanager
def _sent(engine: Engine) -> Iterator[list[str]]:
    """The statements the driver is sent meanwhile, first words only."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split())[:60])

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_an_enqueue_under_the_queue_cap_counts_in_its_insert(pg_engine: Engine) -> None:
    define_task(pg_engine)
    repo = RunRepository(pg_engine)
    with _sent(pg_engine) as seen:
        repo.enqueue_run(task="job", revision=None, priority=None, max_queued=2)
    assert [s.split()[0] for s in seen] == ["SELECT", "SELECT", "WITH"], seen
    assert "pg_advisory_xact_lock" in seen[1], seen  # the lock, then the insert that counts
    repo.enqueue_run(task="job", revision=None, priority=None, max_queued=2)
    with pytest.raises(QueueFull):  # the third: two queued before it
        repo.enqueue_run(task="job", revision=None, priority=None, max_queued=2)
    assert repo.queued_count() == 2


def test_t1_under_both_budgets_counts_in_its_write(pg_engine: Engine) -> None:
    define_task(pg_engine)
    repo = RunRepository(pg_engine)
    first, _ = repo.enqueue_run(task="job", revision=None, priority=None)
    second, _ = repo.enqueue_run(task="job", revision=None, priority=None)

    def t1(run: Any, **budgets: Any) -> Any:
        assert run.latest_attempt is not None
        return repo.begin_dispatch(
            run_id=run.id, attempt_id=run.latest_attempt.id, expected_version=None,
            token_digest="0" * 64, deadline_at_ms=None, log_artifact_id="log", **budgets,
        )  # fmt: skip

    with _sent(pg_engine) as seen:
        assert t1(first, max_running=2, max_concurrent=1).status == "dispatching"
    assert [s.split()[0] for s in seen] == ["SELECT", "SELECT", "WITH"], seen
    assert "pg_advisory_xact_lock" in seen[1], seen
    # The counts leave out the start they admit: the second run of the task is refused at
    # max_concurrent 1, and admitted at 2 (the global budget of 2 then holds both).
    with pytest.raises(AdmissionRefused) as refused:
        t1(second, max_running=2, max_concurrent=1)
    assert refused.value.scope == "task"
    with pytest.raises(AdmissionRefused) as refused:
        t1(second, max_running=1, max_concurrent=2)
    assert refused.value.scope == "global"
    # A refused T1 kept nothing of its step: the run is queued at its version, no event.
    untouched = RunReader(pg_engine).get_run(second.id)
    assert (untouched.status, untouched.version) == ("queued", second.version)
    assert t1(second, max_running=2, max_concurrent=2).status == "dispatching"
