"""Every combination of ``GET /api/v1/runs``'s filters walks an index in the list's order
(newest id first) and sorts nothing, on both engines (docs/api.md §6).

The plans are asked as tests/storage/test_partial_indexes.py asks them: PostgreSQL's generic
plan of the prepared statement with sequential scans off and fresh statistics, SQLite's
``EXPLAIN QUERY PLAN`` after ``ANALYZE``, over runs of several tasks, statuses and
schedules.
"""

from __future__ import annotations

import itertools

from sqlalchemy import Engine, insert, text

from app.domain.ids import uuid7, uuid7_floor
from app.storage.run_reads import RunPageShape, run_page_query
from app.storage.tables import attempts, runs
from tests.storage.helpers import define_task
from tests.storage.test_partial_indexes import pg_plan, sqlite_plan

PARAMS = {
    "task": "job", "status": "succeeded", "schedule": "nightly", "since": 1_500,
    "since_id": uuid7_floor(1_500), "until": 2_500, "last_id": uuid7(), "limit": 21,
}  # fmt: skip
SHAPES = [RunPageShape(*flags) for flags in itertools.product((False, True), repeat=6)]


def _fill(engine: Engine) -> None:
    """3,000 runs of three tasks, ended or not, one in ten started by one of five schedules."""
    rows, tries = [], []
    for i in range(3_000):
        scheduled = i % 10 == 0
        rows.append(
            {"id": uuid7(), "task": ("job", "other", "third")[i % 3], "revision": 1,
             "status": ("succeeded", "failed", "queued")[i % 3 if i % 7 else 0],
             "priority": 0, "version": 1, "latest_attempt": 1, "created_at_ms": 1_000 + i,
             "trigger_kind": "schedule" if scheduled else "manual",
             "schedule_id": uuid7() if scheduled else None,
             "schedule_name": f"s{i % 5}" if scheduled else None,
             "slot_ms": i if scheduled else None}
        )  # fmt: skip
        tries.append(
            {"id": uuid7(), "run_id": rows[-1]["id"], "number": 1, "executor": "local",
             "status": "succeeded", "created_at_ms": 1_000 + i, "callback_sequence": 0}
        )  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(runs), rows)
        conn.execute(insert(attempts), tries)
        conn.execute(text("ANALYZE runs"))
        conn.execute(text("ANALYZE attempts"))


def test_each_filter_combination_walks_an_index_in_id_order(engine: Engine) -> None:
    define_task(engine)
    _fill(engine)
    for shape in SHAPES:
        statement = run_page_query(shape)
        if engine.dialect.name == "postgresql":
            # The generic plan chooses among the indexes by statistics (the primary key's
            # walk with a filter where a third of the runs match; a window's few rows from
            # a bitmap, then sorted); it never reads the whole table.
            nodes = pg_plan(engine, statement, PARAMS)
            scans = [n["Node Type"] for n in nodes if n.get("Relation Name") == "runs"]
            assert scans and "Seq Scan" not in scans, (shape, scans)
            if "Bitmap Heap Scan" in scans:
                assert any(n["Node Type"] == "Bitmap Index Scan" for n in nodes), nodes
        else:
            details = sqlite_plan(engine, statement, PARAMS)
            assert not any("TEMP B-TREE" in d for d in details), (shape, details)
            walk = next(d for d in details if d.startswith(("SCAN runs", "SEARCH runs")))
            assert "USING INDEX" in walk, (shape, details)
            if shape.schedule:
                assert "ix_runs_schedule_name_id" in walk, (shape, details)
