"""Keyset pages over 1,000 runs: no duplicate, no gap, also while runs are inserted."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, insert

from app.domain.errors import ValidationFailed
from app.domain.ids import uuid7
from app.storage.run_reads import RunReader
from app.storage.tables import attempts, run_events, runs
from tests.storage.helpers import define_task, enqueue

N = 1000


def _bulk_runs(engine: Engine, n: int, *, priority_of: object = None) -> list[str]:
    """Insert ``n`` queued runs quickly (the repository path is covered elsewhere)."""
    ids, run_rows, attempt_rows, event_rows = [], [], [], []
    for i in range(n):
        rid = uuid7()
        ids.append(rid)
        prio = priority_of(i) if callable(priority_of) else 0
        run_rows.append(
            {"id": rid, "task": "job" if i % 3 else "other", "revision": 1, "status": "queued",
             "priority": prio, "version": 1, "latest_attempt": 1, "created_at_ms": 1000 + i // 7}
        )  # fmt: skip
        attempt_rows.append(
            {"id": uuid7(), "run_id": rid, "number": 1, "status": "claimed",
             "executor": "local_process", "created_at_ms": 1000 + i // 7, "callback_sequence": 0}
        )  # fmt: skip
        event_rows.append({"run_id": rid, "seq": 1, "type": "run.queued", "at_ms": 1, "data": "{}"})
    with engine.begin() as conn:
        conn.execute(insert(runs), run_rows)
        conn.execute(insert(attempts), attempt_rows)
        conn.execute(insert(run_events), event_rows)
    return ids


def test_run_pages_have_no_duplicate_and_no_gap_while_runs_are_inserted(engine: Engine) -> None:
    define_task(engine)
    define_task(engine, task="other")
    existing = _bulk_runs(engine, N)
    reader = RunReader(engine)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = reader.list_runs(task=None, status=None, limit=37, cursor=cursor)
        seen.extend(r.id for r in page.items)
        pages += 1
        enqueue(engine)  # newer than every page already read: must not appear later
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(seen) == len(set(seen))
    assert seen == sorted(existing, reverse=True)
    assert pages == -(-N // 37)


def test_filtered_pages_follow_task_and_status(engine: Engine) -> None:
    define_task(engine)
    define_task(engine, task="other")
    ids = _bulk_runs(engine, 300)
    reader = RunReader(engine)
    collected, cursor = [], None
    while True:
        page = reader.list_runs(task="other", status="queued", limit=50, cursor=cursor)
        collected += page.items
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    expected = [rid for i, rid in enumerate(ids) if i % 3 == 0]
    assert [r.id for r in collected] == sorted(expected, reverse=True)
    assert all(r.task == "other" and r.status == "queued" for r in collected)
    assert reader.list_runs(task="other", status="running", limit=5, cursor=None).items == []


def test_dispatch_candidates_come_in_priority_then_age_order_without_gaps(engine: Engine) -> None:
    define_task(engine)
    define_task(engine, task="other")
    _bulk_runs(engine, N, priority_of=lambda i: (i * 37) % 5 - 2)
    reader = RunReader(engine)
    keys, cursor = [], None
    while True:
        page = reader.dispatch_candidates(limit=16, cursor=cursor)
        assert len(page.items) <= 16
        keys += [
            (-c.priority, c.created_at_ms, c.attempt_created_at_ms, c.attempt_id)
            for c in page.items
        ]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(keys) == N == len(set(keys))
    assert keys == sorted(keys)


@pytest.mark.parametrize("cursor", ["", "!!!", "eyJrIjoicnVucyJ9", "a" * 600])
def test_a_forged_cursor_is_a_validation_error(engine: Engine, cursor: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        RunReader(engine).list_runs(task=None, status=None, limit=5, cursor=cursor or "x")
    assert info.value.code == "INVALID_CURSOR"
