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


def _bulk_runs(
    engine: Engine, n: int, *, priority_of: object = None, status: str = "queued"
) -> list[str]:
    """Insert ``n`` runs quickly (the repository path is covered elsewhere), queued with a
    claimed attempt unless ``status`` says otherwise (an ended run with an ended attempt)."""
    attempt_status = "claimed" if status == "queued" else status
    ids, run_rows, attempt_rows, event_rows = [], [], [], []
    for i in range(n):
        rid = uuid7()
        ids.append(rid)
        prio = priority_of(i) if callable(priority_of) else 0
        run_rows.append(
            {"id": rid, "task": "job" if i % 3 else "other", "revision": 1, "status": status,
             "priority": prio, "version": 1, "latest_attempt": 1, "created_at_ms": 1000 + i // 7}
        )  # fmt: skip
        attempt_rows.append(
            {"id": uuid7(), "run_id": rid, "number": 1, "status": attempt_status,
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
        keys += [(-c.priority, c.created_at_ms, c.run_id) for c in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(keys) == N == len(set(keys))
    assert keys == sorted(keys)


def test_a_run_whose_attempt_fails_the_guards_is_left_out_and_the_walk_goes_on_past_it(
    engine: Engine,
) -> None:
    # A queued run's latest attempt is claimed by construction; the page only guards it.
    # Rows that break it (written here directly) must not end the walk early.
    define_task(engine)
    define_task(engine, task="other")
    ids = _bulk_runs(engine, 40)
    odd = set(ids[:20])
    with engine.begin() as conn:
        conn.execute(attempts.update().where(attempts.c.run_id.in_(odd)).values(status="starting"))
    reader = RunReader(engine)
    listed, cursor, pages = [], None, 0
    while True:
        page = reader.dispatch_candidates(limit=16, cursor=cursor)
        listed += [c.run_id for c in page.items]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert listed == ids[20:]
    assert pages == 3  # 16 left out, then 4 left out and 12 listed, then 8 listed


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_burst_after_a_history_of_ended_runs_joins_only_the_page(engine: Engine) -> None:
    # Statistics taken over a history of ended runs call 'queued' rare; 1,000 queued runs
    # then arrive. The page must still join one attempt per listed run, not the queue's.
    define_task(engine)
    define_task(engine, task="other")
    _bulk_runs(engine, 2000, status="succeeded")
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE runs")
        conn.exec_driver_sql("ANALYZE attempts")
        conn.commit()
    _bulk_runs(engine, N)
    reader = RunReader(engine)
    sql, args = reader._dispatch_page(after=False).bound({"limit": 17, "now": 2**62})
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, args)
        plan = cursor.fetchone()[0][0]["Plan"]
    finally:
        raw.close()

    def attempt_scans(node: dict) -> list[int]:
        here = (
            [node["Actual Loops"] * node["Actual Rows"]]
            if node.get("Relation Name") == "attempts"
            else []
        )
        return here + [n for child in node.get("Plans", []) for n in attempt_scans(child)]

    scans = attempt_scans(plan)
    assert scans and sum(scans) <= 17, plan
    assert len(reader.dispatch_candidates(limit=16).items) == 16


@pytest.mark.parametrize("cursor", ["", "!!!", "eyJrIjoicnVucyJ9", "a" * 600])
def test_a_forged_cursor_is_a_validation_error(engine: Engine, cursor: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        RunReader(engine).list_runs(task=None, status=None, limit=5, cursor=cursor or "x")
    assert info.value.code == "INVALID_CURSOR"
