"""What GET /metrics reads from the database (docs/metrics.md), on both engines."""

from __future__ import annotations

from sqlalchemy import Engine, update

from app.storage.metrics_reads import read_snapshot
from app.storage.tables import attempts
from tests.storage.helpers import define_task, enqueue, start


def test_log_bytes_counts_the_logs_still_there_not_those_retention_expired(
    engine: Engine,
) -> None:
    define_task(engine)
    kept, gone = (start(engine, enqueue(engine)) for _ in range(2))
    with engine.begin() as conn:
        for run, size, state in ((kept, 7, None), (gone, 1000, "expired")):
            assert run.latest_attempt is not None
            conn.execute(
                update(attempts)
                .where(attempts.c.id == run.latest_attempt.id)
                .values(log_bytes=size, log_state=state)
            )
    # The same figure GET /api/v1/system/storage reports: an expired log's bytes are freed.
    assert read_snapshot(engine).log_bytes == 7
