"""A dispatch page costs its own rows, not the queue's (docs/design.md §3.3).

Every drain pass reads one page of candidates. With thousands of runs queued, a plan that
reads every queued run and sorts them to keep the first few makes every pass, and so every
start, pay for the whole queue. These tests fill a real database with queued runs (and runs
waiting for a retry, which the walk must skip by its index) and measure what one page
reads:

- PostgreSQL: the plan the server really keeps for the prepared statement once it is hot,
  the generic plan (every bind a parameter), run with EXPLAIN ANALYZE: how many ``runs``
  rows the page's scan returned.
- SQLite: how many virtual-machine steps the statement takes, with a short and a long queue.
- Both: a page after a keyset cursor starts its walk at the cursor's priority.
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, insert, text

from app.domain.ids import uuid7
from app.storage.run_reads import RunReader
from app.storage.tables import attempts, runs
from tests.storage.helpers import define_task

LIMIT = 16
_PG_TYPES = {str: "text", int: "bigint", bool: "boolean"}


def _fill(engine: Engine, queued: int, waiting: int, *, start: int = 0) -> None:
    """``waiting`` runs whose retry instant is ahead, at the top priority and created first
    (a walk that filters them reads them all), then ``queued`` ready runs in three
    priorities; each with its claimed attempt."""
    run_rows, attempt_rows = [], []
    for i in range(start, start + waiting + queued):
        run_id = uuid7()
        wait = i - start < waiting
        run_rows.append(
            {"id": run_id, "task": "job", "revision": 1, "status": "queued",
             "priority": 2 if wait else i % 3, "version": 1, "latest_attempt": 1,
             "created_at_ms": 1_000 + i, "not_before_ms": 10**15 if wait else None}
        )  # fmt: skip
        attempt_rows.append(
            {"id": uuid7(), "run_id": run_id, "number": 1, "status": "claimed",
             "executor": "local_process", "created_at_ms": 1_000 + i, "callback_sequence": 0,
             "not_before_ms": 10**15 if wait else None}
        )  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(runs), run_rows)
        conn.execute(insert(attempts), attempt_rows)


def _page_statement(engine: Engine, after_priority: int | None = None) -> tuple[str, Any]:
    """The very statement ``dispatch_candidates`` runs, and the driver's arguments for one
    page (a dict for psycopg, a tuple for sqlite3): the first page, or with
    ``after_priority`` the page after a cursor placed before every run of that priority."""
    read = RunReader(engine)._dispatch_page(after=after_priority is not None)
    params: dict[str, Any] = {"limit": LIMIT + 1, "now": 2_000}
    if after_priority is not None:
        params |= {"prio": after_priority, "created": 0, "run_id": ""}
    return read.bound(params)


def _rows_read_in_generic_plan(
    engine: Engine, after_priority: int | None = None
) -> dict[str, int]:
    """Rows of ``runs`` and of ``attempts`` that one page read, under the plan a hot
    prepared statement keeps (``force_generic_plan``: the planner sees no bind's value):
    what each scan returned and filtered out, over all its loops."""
    sql, args = _page_statement(engine, after_priority)
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    numbered = re.sub(r"%\((\w+)\)s", number, sql)
    raw = engine.raw_connection()
    try:
        # Client-side binding: the $n of the PREPARE body must reach the server as text, not
        # as the protocol's own parameters.
        cursor = psycopg.ClientCursor(raw.dbapi_connection)
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        types = ", ".join(_PG_TYPES[type(args[n])] for n in names)
        cursor.execute(f"PREPARE dispatch_page ({types}) AS {numbered}")
        try:
            casts = ", ".join(f"%s::{_PG_TYPES[type(args[n])]}" for n in names)
            cursor.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE dispatch_page({casts})",
                [args[n] for n in names],
            )
            (plan,) = cursor.fetchone()
        finally:
            raw.rollback()  # undoes the SET and the PREPARE, both made in this transaction
    finally:
        raw.close()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    read = {"runs": 0, "attempts": 0}
    for node in _nodes(plan[0]["Plan"]):
        table = node.get("Relation Name")
        if table in read and node.get("Alias") != "older":  # not the hold check's probe
            per_loop = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read[table] += per_loop * node["Actual Loops"]
    return read


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found.extend(_nodes(child))
    return found


@pytest.mark.postgres
@pytest.mark.parametrize("statistics", ["stale", "fresh"])
def test_a_hot_postgresql_page_reads_the_page_not_the_queue(
    pg_engine: Engine, statistics: str
) -> None:
    """3,000 ready runs behind 1,000 waiting ones. Whether the planner's statistics still
    call the queue empty (a burst on a quiet database) or count every row, the generic plan
    walks the page's index in order and stops after limit + 1 runs, and looks up one
    attempt per page row. Before: every queued run read and sorted (stale), or every
    attempt hashed (fresh)."""
    define_task(pg_engine)
    if statistics == "stale":
        _analyze(pg_engine)  # of the empty tables
    _fill(pg_engine, 3_000, 1_000)
    if statistics == "fresh":
        _analyze(pg_engine)
    read = _rows_read_in_generic_plan(pg_engine)
    assert read["runs"] <= LIMIT + 1 and read["attempts"] <= LIMIT + 1, read
    # After a cursor before the lowest priority, behind 2,000 ready runs of the higher
    # two: the walk starts at the cursor's priority (2,017 rows without its range term).
    after = _rows_read_in_generic_plan(pg_engine, after_priority=0)
    assert after["runs"] <= LIMIT + 1 and after["attempts"] <= LIMIT + 1, after
    got = RunReader(pg_engine).dispatch_candidates(limit=LIMIT)
    assert len(got.items) == LIMIT and got.next_cursor is not None
    assert [c.priority for c in got.items] == [2] * LIMIT  # the order holds
    assert [c.created_at_ms for c in got.items] == sorted(c.created_at_ms for c in got.items)


def _analyze(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("ANALYZE runs"))
        conn.execute(text("ANALYZE attempts"))


def _sqlite_steps(engine: Engine, after_priority: int | None = None) -> int:
    """Virtual-machine steps of one page on SQLite (a progress handler called every step)."""
    sql, args = _page_statement(engine, after_priority)
    raw = engine.raw_connection()
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    try:
        raw.dbapi_connection.set_progress_handler(count, 1)  # type: ignore[union-attr]
        cursor = raw.cursor()
        cursor.execute(sql, args)
        assert len(cursor.fetchall()) == LIMIT + 1
        raw.dbapi_connection.set_progress_handler(None, 1)  # type: ignore[union-attr]
    finally:
        raw.close()
    return steps[0]


def test_a_sqlite_page_costs_the_same_with_ten_times_the_queue(tmp_path: Any) -> None:
    """The steps of one page with 300 queued runs and with 3,000 (and as many waiting)
    differ by less than half: the walk is the page's, not the queue's. A guard more than a
    measure of migration 0009: SQLite already walked ix_runs_ready_order in order (1,323
    steps at both sizes before, 1,752 now); without an index to walk, 58,509."""
    from app.storage.engine import make_engine
    from app.storage.migrate import upgrade_to_head

    engine = make_engine(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        upgrade_to_head(engine)
        define_task(engine)
        _fill(engine, 300, 300)
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        short = _sqlite_steps(engine), _sqlite_steps(engine, after_priority=0)
        _fill(engine, 2_700, 2_700, start=600)
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        long = _sqlite_steps(engine), _sqlite_steps(engine, after_priority=0)
    finally:
        engine.dispose()
    assert long[0] < short[0] * 1.5, (short, long)
    # After a cursor before the lowest priority: the walk starts there, not at the top.
    assert long[1] < short[1] * 1.5, (short, long)
