"""The partial indexes of ``runs`` and ``attempts`` serve the reads they are for
(migrations 0010 and 0011).

``ix_runs_retry_wait`` holds only the runs waiting for a retry's instant, the two schedule
indexes only the runs a schedule made, and the three status indexes of ``attempts`` only
the attempts starting or running, so an ordinary run's writes touch them only between T1
and its ending (bench/README.md: the bytes each write statement logs). A partial index is
usable only when the planner can prove its predicate from the query's own terms, and a
bound parameter proves nothing to a generic plan. These tests check each index's predicate
as the engine stores it, and ask each engine which index it uses for the statements the
code builds, over tables where the partial indexes hold a small part of the rows:

- PostgreSQL: the generic plan of the prepared statement (what a hot statement keeps), with
  sequential scans disabled and fresh statistics. This is where a bound status or LIMIT
  shows: the generic plan cannot use the index or prefers the primary key.
- SQLite: ``EXPLAIN QUERY PLAN`` after ``ANALYZE``. SQLite plans with the bound values in
  hand, so it catches a predicate written differently from the index's (an attempt read
  with a bound ``IN (?, ?)`` walked the primary key), not a bound one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from sqlalchemy import BigInteger, Engine, bindparam, insert, text
from sqlalchemy.sql import ClauseElement
from sqlalchemy.types import NullType

from app.domain.ids import uuid7
from app.storage.hosts_repo import HOST_ACTIVE_PAGE
from app.storage.metrics_reads import ACTIVE_BY_STATUS
from app.storage.run_reads import _NEXT_RETRY, COUNT_HOST_ACTIVE, active_page, own_attempts
from app.storage.runs_repo import _ANY_DUE, _HELD_BY_ID, _PROMOTE_DUE
from app.storage.schedules_repo import _ACTIVE_RUNS, _QUEUED_RUNS
from app.storage.tables import attempts, runs
from tests.storage.helpers import define_task

SCHEDULE = "0190d7a0-0000-7000-8000-000000000001"
# Each statement, its parameters, and the indexes any of which serves it.
RETRY = {"ix_runs_retry_wait"}
SCHEDULED = {"ix_runs_schedule_id_status", "ix_runs_schedule_id_slot_ms"}
HOST = {"ix_attempts_worker_instance_id_status"}
ACTIVE = {"ix_attempts_status_id", "ix_attempts_status_deadline_at_ms"} | HOST
INSTANCE = "0190d7a0-0000-7000-8000-0000000000aa"
_OVERDUE = (attempts.c.deadline_at_ms <= 5_000) | runs.c.cancel_reason.is_not(None)
CASES: list[tuple[str, ClauseElement, dict[str, Any], set[str]]] = [
    ("next retry", _NEXT_RETRY, {"after": 5_000}, RETRY),
    ("any due", _ANY_DUE, {"now": 5_000}, RETRY),
    ("promote due", _PROMOTE_DUE, {"now": 5_000, "limit": 256}, RETRY),
    ("schedule's active runs", _ACTIVE_RUNS, {"schedule_id": SCHEDULE}, SCHEDULED),
    ("schedule's queued runs", _QUEUED_RUNS, {"schedule_id": SCHEDULE}, SCHEDULED),
    ("reconciler's page", active_page(), {"page_limit": 16}, ACTIVE),
    (
        "a host's reconciler page",
        active_page(own_attempts(INSTANCE)).where(attempts.c.id > bindparam("after")),
        {"page_limit": 16, "after": INSTANCE},
        ACTIVE,
    ),
    ("stop candidates", active_page(_OVERDUE), {"page_limit": 16}, ACTIVE),
    ("metrics' active attempts", ACTIVE_BY_STATUS, {}, ACTIVE),
    ("a host's share", COUNT_HOST_ACTIVE, {"count_instance": INSTANCE}, HOST),
    ("a lost host's page", HOST_ACTIVE_PAGE, {"instance": INSTANCE, "limit": 16}, HOST),
]


def _fill(engine: Engine) -> str:
    """3,000 ended runs no schedule made, 40 runs of schedules (one of them held behind
    its schedule's older slots), 20 waiting for a retry; each run's attempt, 20 of them
    starting or running (half on one host); the held run's id."""
    rows: list[dict[str, Any]] = []
    tries: list[dict[str, Any]] = []
    for i in range(3_060):
        scheduled, waiting = 3_000 <= i < 3_040, i >= 3_040
        rows.append(
            {"id": uuid7(), "task": "job", "revision": 1,
             "status": "queued" if scheduled or waiting else "succeeded",
             "priority": 0, "version": 1, "latest_attempt": 1, "created_at_ms": 1_000 + i,
             "not_before_ms": 10_000 + i if waiting else None,
             "schedule_id": (SCHEDULE if i % 2 else uuid7()) if scheduled else None,
             "slot_ms": i if scheduled else None,
             "hold_from_slot_ms": 3_000 if i == 3_039 else None}
        )  # fmt: skip
        active = 3_000 <= i < 3_020
        tries.append(
            {"id": uuid7(), "run_id": rows[-1]["id"], "number": 1, "executor": "local",
             "status": ("running" if i % 2 else "starting") if active
             else "claimed" if i >= 3_000 else "succeeded",
             "created_at_ms": 1_000 + i, "callback_sequence": 0,
             "deadline_at_ms": 2_000 + i, "worker_instance_id": INSTANCE if i % 2 else None}
        )  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(runs), rows)
        conn.execute(insert(attempts), tries)
        # These two tables only: a bare ANALYZE on PostgreSQL takes every schema's tables,
        # other xdist workers' too, and deadlocked with one's TRUNCATE between its tests.
        conn.execute(text("ANALYZE runs"))
        conn.execute(text("ANALYZE attempts"))
    return str(rows[3_039]["id"])


def _compiled(engine: Engine, statement: Any, params: dict[str, Any]) -> tuple[Any, Any]:
    """The statement compiled for the engine and its IN lists expanded (the SQL, the binds
    by name, their order for a positional driver), and each bind's SQL type."""
    compiled = statement.compile(dialect=engine.dialect)
    state = compiled.construct_expanded_state(params)

    def sql_type(name: str) -> str:
        bind = compiled.binds[name if name in compiled.binds else name.rsplit("_", 1)[0]]
        kind = bind.type
        if isinstance(kind, NullType):  # the NULL an UPDATE sets, or a LIMIT
            kind = runs.c[name].type if name in runs.c else BigInteger()
        return str(kind.compile(dialect=engine.dialect))

    return state, sql_type


def _pg_indexes(engine: Engine, statement: Any, params: dict[str, Any]) -> set[str]:
    """Indexes in the generic plan of ``statement`` prepared on PostgreSQL."""
    return {n["Index Name"] for n in pg_plan(engine, statement, params) if "Index Name" in n}


def pg_plan(engine: Engine, statement: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of the generic plan of ``statement`` prepared on PostgreSQL."""
    state, sql_type = _compiled(engine, statement, params)
    args = state.parameters
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    numbered = re.sub(r"%\((\w+)\)s", number, state.statement)
    types = [sql_type(n) for n in names]
    raw = engine.raw_connection()
    try:
        cursor = psycopg.ClientCursor(raw.dbapi_connection)
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute("SET enable_seqscan = off")
        declared = f"({', '.join(types)})" if types else ""
        cursor.execute(f"PREPARE probe {declared} AS {numbered}")
        casts = f"({', '.join(f'%s::{t}' for t in types)})" if types else ""
        cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE probe{casts}", [args[n] for n in names])
        (plan,) = cursor.fetchone()
    finally:
        raw.invalidate()  # the session's settings and its prepared probe go with it
        raw.close()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return _nodes(plan[0]["Plan"])


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found.extend(_nodes(child))
    return found


def _sqlite_indexes(engine: Engine, statement: ClauseElement, params: dict[str, Any]) -> set[str]:
    """Indexes SQLite's query plan names for ``statement``."""
    details = sqlite_plan(engine, statement, params)
    return {m for d in details for m in re.findall(r"INDEX (\w+)", d)}


def sqlite_plan(engine: Engine, statement: ClauseElement, params: dict[str, Any]) -> list[str]:
    """Each line of SQLite's ``EXPLAIN QUERY PLAN`` for ``statement``."""
    state, _type = _compiled(engine, statement, params)
    positional = [state.parameters[name] for name in state.positiontup]
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(f"EXPLAIN QUERY PLAN {state.statement}", positional)
        return [row[3] for row in cursor.fetchall()]
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("what", "statement", "params", "served_by"), CASES, ids=[c[0] for c in CASES]
)
def test_each_read_of_a_partial_index_walks_it(
    engine: Engine,
    what: str,
    statement: ClauseElement,
    params: dict[str, Any],
    served_by: set[str],
) -> None:
    define_task(engine)
    _fill(engine)
    probe = _pg_indexes if engine.dialect.name == "postgresql" else _sqlite_indexes
    used = probe(engine, statement, params)
    assert used & served_by, (what, used)


# Each partial index, and a piece of the predicate the engine stores for it.
PARTIAL = {
    "ix_runs_ready_page": "not_before_ms IS NULL",
    "ix_runs_retry_wait": "not_before_ms IS NOT NULL",
    "ix_runs_schedule_id_slot_ms": "schedule_id IS NOT NULL",
    "ix_runs_schedule_id_status": "schedule_id IS NOT NULL",
    "ix_attempts_status_id": "running",
    "ix_attempts_status_deadline_at_ms": "running",
    "ix_attempts_worker_instance_id_status": "running",
}


def test_each_index_that_only_some_reads_walk_is_partial(engine: Engine) -> None:
    """The names above could as well be full indexes and the plans still name them: the
    stored definitions say what each one holds."""
    if engine.dialect.name == "postgresql":
        query = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
    else:
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    with engine.connect() as conn:
        stored = {name: sql for name, sql in conn.execute(text(query))}
    for name, piece in PARTIAL.items():
        sql = " ".join(stored[name].split())
        where = sql.upper().partition(" WHERE ")[2]
        assert where and piece.upper() in where, (name, sql)
    unique = stored["ix_runs_schedule_id_slot_ms"].upper()
    assert "UNIQUE" in unique, unique


def test_the_hold_check_probes_its_schedule_by_the_partial_slot_index(engine: Engine) -> None:
    """The held run's check walks its schedule's older slots (``older``, a range of the
    unique slot index), and finds the older runs of its schedule still queued: held."""
    define_task(engine)
    held = _fill(engine)
    probe = _pg_indexes if engine.dialect.name == "postgresql" else _sqlite_indexes
    used = probe(engine, _HELD_BY_ID, {"run_id": held})
    assert "ix_runs_schedule_id_slot_ms" in used, used
    with engine.connect() as conn:
        assert conn.execute(_HELD_BY_ID, {"run_id": held}).scalar_one()
