"""A transition's three writes as one PostgreSQL statement (docs/design.md §3.7).

Every transition that moves a run and its attempt together writes three things: the run's
compare-and-set on ``version``, the attempt's on ``status``, and the events. On PostgreSQL
each was a round trip of its own (the events already one executemany); here they are one
statement of data-modifying CTEs:

    WITH r AS (UPDATE runs ... WHERE id = ? AND version = ? RETURNING id),
         a AS (UPDATE attempts ... WHERE id = ? AND status = ? AND EXISTS (SELECT FROM r)
               RETURNING id),
         e AS (INSERT INTO run_events ... SELECT ... WHERE EXISTS (SELECT FROM a)
               RETURNING seq)
    SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM a)

The attempt is written only if the run's CAS took, and the events only if both did, so a
lost CAS writes what the three statements wrote before it raised: at most the run row,
rolled back with the caller's transaction. The run row is still written first (the
uncorrelated EXISTS runs before the attempt's scan), the order every transaction that
writes both keeps. Callers have read and, on PostgreSQL, locked both rows already.

SQLite has no data-modifying CTE: it keeps the three statements (no round trip there).

A step may also carry other writes of its transaction (``Writes``: the receipt journal's
move in T2 and in a completion): each is one more data-modifying CTE of the statement,
run whatever the CASes found (as its own statement ran before), and its row count comes
back by name. They change rows the CASes do not touch, so the order inside the statement
changes no lock order: the caller read and locked run and attempt before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    Select,
    Update,
    bindparam,
    exists,
    func,
    insert,
    literal_column,
    select,
    union_all,
    update,
)

from app.storage.tables import attempts, run_events, runs

# Counts a statement takes besides its writes, by name: a one-column count and its parameters.
Counts = Mapping[str, tuple[Select[Any], Mapping[str, Any]]]
# Other writes a step's statement carries, by name: an UPDATE (the same one for a name, its
# SET values and conditions all bound) and its parameters. See ``run_writes``.
Writes = Mapping[str, tuple[Update, Mapping[str, Any]]]
_EVENT_COLUMNS = ("run_id", "seq", "type", "at_ms", "data")
_COLUMN_NAMES = frozenset(runs.c.keys()) | frozenset(attempts.c.keys())
_STATEMENTS: dict[
    tuple[tuple[str, ...], tuple[str, ...], int, tuple[str, ...], tuple[tuple[str, Update], ...]],
    Select[Any],
] = {}


def run_writes(conn: Connection, writes: Writes) -> dict[str, int]:
    """``writes`` as statements of their own (SQLite, or a step that is not one statement):
    the rows each changed, by name."""
    return {name: int(conn.execute(w, params).rowcount) for name, (w, params) in writes.items()}


def _statement(
    run_keys: tuple[str, ...],
    attempt_keys: tuple[str, ...],
    events: int,
    counts: Counts,
    writes: Writes,
) -> Select[Any]:
    """The statement for these SET columns, this many events, these counts and writes
    (built once per shape; a count is known by its name, a write by its name and its
    UPDATE, a statement built once by its caller)."""
    key = (
        run_keys,
        attempt_keys,
        events,
        tuple(counts),
        tuple((n, w) for n, (w, _p) in writes.items()),  # the key holds the UPDATE itself
    )
    found = _STATEMENTS.get(key)
    if found is not None:
        return found
    run_cte = (
        update(runs)
        .where(runs.c.id == bindparam("r_where_id"), runs.c.version == bindparam("r_where_version"))
        .values({k: bindparam(f"r_{k}", type_=runs.c[k].type) for k in run_keys})
        .returning(runs.c.id)
        .cte("r")
    )
    attempt_cte = (
        update(attempts)
        .where(
            attempts.c.id == bindparam("a_where_id"),
            attempts.c.status == bindparam("a_where_status"),
            exists(select(run_cte.c.id)),
        )
        .values({k: bindparam(f"a_{k}", type_=attempts.c[k].type) for k in attempt_keys})
        .returning(attempts.c.id)
        .cte("a")
    )
    riding = [
        w.returning(literal_column("1").label("one")).cte(f"w_{name}")
        for name, (w, _params) in writes.items()
    ]
    statement = _counts(run_cte, attempt_cte, _events_after(attempt_cte, events), *riding)
    statement = _with_counts(statement, counts)
    _STATEMENTS[key] = statement
    return statement


def _events_after(attempt_cte: CTE, events: int) -> CTE:
    """The events insert, run only when ``attempt_cte`` wrote its row."""
    rows = [
        select(
            *(bindparam(f"e{i}_{c}", type_=run_events.c[c].type).label(c) for c in _EVENT_COLUMNS)
        ).where(exists(select(attempt_cte.c.id)))
        for i in range(events)
    ]
    source = rows[0] if len(rows) == 1 else union_all(*rows)
    return (
        insert(run_events)
        .from_select(list(_EVENT_COLUMNS), source)
        .returning(run_events.c.seq)
        .cte("e")
    )


def _counts(*ctes: CTE) -> Select[Any]:
    """The rows each CTE wrote; naming them also makes each one part of the statement."""
    return select(*(select(func.count()).select_from(c).scalar_subquery() for c in ctes))


def _with_counts(statement: Select[Any], counts: Counts) -> Select[Any]:
    """``statement`` with a column per count, after its own."""
    for count, _params in counts.values():
        statement = statement.add_columns(count.scalar_subquery())
    return statement


def _execute(
    conn: Connection,
    statement: Select[Any],
    params: dict[str, Any],
    written: int,
    counts: Counts,
    writes: Writes | None = None,
) -> tuple[tuple[Any, ...], dict[str, int]]:
    """The statement's first ``written`` columns, and its counts by name. No parameter of a
    count or a write may be named as a column of a table the statement writes: that
    table's UPDATE or INSERT would take it for a value to write."""
    parts: list[tuple[Any, Mapping[str, Any]]] = [({}, more) for _sql, more in counts.values()]
    parts += [(w.table.c, more) for w, more in (writes or {}).values()]
    for own, more in parts:  # ``own``: the columns of the table a write changes
        if any(k in _COLUMN_NAMES or k in params or k in own for k in more):
            raise ValueError(f"parameters named as columns or taken: {sorted(more)}")
        params.update(more)
    row = tuple(conn.execute(statement, params).one())
    return row[:written], {name: int(n) for name, n in zip(counts, row[written:], strict=True)}


def write_step(
    conn: Connection,
    *,
    run_id: str,
    run_version: int,
    run_values: dict[str, Any],
    attempt_id: str,
    attempt_status: str,
    attempt_values: dict[str, Any],
    event_rows: list[dict[str, Any]],
    counts: Counts | None = None,
    writes: Writes | None = None,
) -> tuple[bool, dict[str, int]]:
    """Run CAS, attempt CAS and events in one statement; False (nothing kept but, at most,
    the run row and ``writes``, for the caller to roll back) when either CAS found its row
    moved.

    ``counts``, taken in the same statement, come back by name. Their snapshot is the
    statement's: they do not see its own writes. ``writes`` run in the same statement
    whatever the CASes find; the rows each changed come back by name with the counts.
    """
    counts = counts or {}
    writes = writes or {}
    if not event_rows:
        raise ValueError("a step appends its events")
    run_keys = tuple(sorted(run_values))
    attempt_keys = tuple(sorted(attempt_values))
    params: dict[str, Any] = {
        "r_where_id": run_id,
        "r_where_version": run_version,
        "a_where_id": attempt_id,
        "a_where_status": attempt_status,
    }
    params.update({f"r_{k}": v for k, v in run_values.items()})
    params.update({f"a_{k}": v for k, v in attempt_values.items()})
    for i, row in enumerate(event_rows):
        params.update({f"e{i}_{c}": row[c] for c in _EVENT_COLUMNS})
    statement = _statement(run_keys, attempt_keys, len(event_rows), counts, writes)
    wrote, counted = _execute(conn, statement, params, 3 + len(writes), counts, writes)
    ran, moved, appended = wrote[:3]
    counted |= {name: int(n) for name, n in zip(writes, wrote[3:], strict=True)}
    return bool(ran == 1 and moved == 1 and appended == len(event_rows)), counted


_INSERTS: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], Select[Any]] = {}


def _insert_statement(
    run_keys: tuple[str, ...], attempt_keys: tuple[str, ...], counts: Counts
) -> Select[Any]:
    """A new run, its attempt 1 and its one event: the enqueue's three inserts, and
    ``counts`` (built once per shape; a count is known by its name)."""
    key = (run_keys, attempt_keys, tuple(counts))
    found = _INSERTS.get(key)
    if found is not None:
        return found
    run_cte = (
        insert(runs)
        .values({k: bindparam(f"r_{k}", type_=runs.c[k].type) for k in run_keys})
        .returning(runs.c.id)
        .cte("r")
    )
    attempt_row = select(
        *(bindparam(f"a_{k}", type_=attempts.c[k].type).label(k) for k in attempt_keys)
    ).where(exists(select(run_cte.c.id)))
    attempt_cte = (
        insert(attempts)
        .from_select(list(attempt_keys), attempt_row)
        .returning(attempts.c.id)
        .cte("a")
    )
    statement = _with_counts(_counts(run_cte, attempt_cte, _events_after(attempt_cte, 1)), counts)
    _INSERTS[key] = statement
    return statement


def insert_run(
    conn: Connection,
    *,
    run_values: dict[str, Any],
    attempt_values: dict[str, Any],
    event_row: dict[str, Any],
    counts: Counts | None = None,
) -> dict[str, int]:
    """The run, its first attempt and its first event in one statement. A key or foreign
    key violation raises as the three inserts did (IntegrityError), and nothing is kept.

    ``counts``, taken in the same statement, come back by name; they do not see its own
    insert (the enqueue's queue cap: one round trip less)."""
    counts = counts or {}
    params: dict[str, Any] = {f"r_{k}": v for k, v in run_values.items()}
    params.update({f"a_{k}": v for k, v in attempt_values.items()})
    params.update({f"e0_{c}": event_row[c] for c in _EVENT_COLUMNS})
    statement = _insert_statement(tuple(sorted(run_values)), tuple(sorted(attempt_values)), counts)
    wrote, counted = _execute(conn, statement, params, 3, counts)
    if wrote != (1, 1, 1):  # an INSERT without a conflict clause inserts or raises
        raise RuntimeError(f"the enqueue's insert wrote {wrote}")
    return counted
