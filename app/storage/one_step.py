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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    CTE,
    Connection,
    Select,
    bindparam,
    exists,
    func,
    insert,
    select,
    union_all,
    update,
)

from app.storage.tables import attempts, run_events, runs

_EVENT_COLUMNS = ("run_id", "seq", "type", "at_ms", "data")
_COLUMN_NAMES = frozenset(runs.c.keys()) | frozenset(attempts.c.keys())
_STATEMENTS: dict[
    tuple[tuple[str, ...], tuple[str, ...], int, tuple[str, ...]], Select[Any]
] = {}


def _statement(
    run_keys: tuple[str, ...],
    attempt_keys: tuple[str, ...],
    events: int,
    counts: Mapping[str, Select[Any]],
) -> Select[Any]:
    """The statement for these SET columns, this many events and these counts (built once
    per shape; a count is known by its name)."""
    key = (run_keys, attempt_keys, events, tuple(counts))
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
    statement = _counts(run_cte, attempt_cte, _events_after(attempt_cte, events))
    for count in counts.values():
        statement = statement.add_columns(count.scalar_subquery())
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
    counts: Mapping[str, Select[Any]] | None = None,
    count_params: Mapping[str, Any] | None = None,
) -> tuple[bool, dict[str, int]]:
    """Run CAS, attempt CAS and events in one statement; False (nothing kept but, at most,
    the run row, for the caller to roll back) when either CAS found its row moved.

    ``counts``: one-column count statements (binding ``count_params``) evaluated in the same
    statement, by name. Their snapshot is the statement's: they do not see its own writes.
    """
    counts = counts or {}
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
    count_params = count_params or {}
    if set(count_params) & _COLUMN_NAMES:
        # The UPDATEs would take a parameter named as a column for a SET value.
        raise ValueError(f"count parameters named as columns: {sorted(count_params)}")
    params.update(count_params)
    statement = _statement(run_keys, attempt_keys, len(event_rows), counts)
    ran, moved, appended, *counted = conn.execute(statement, params).one()
    took = bool(ran == 1 and moved == 1 and appended == len(event_rows))
    return took, {name: int(n) for name, n in zip(counts, counted, strict=True)}


_INSERTS: dict[tuple[tuple[str, ...], tuple[str, ...], bool], Select[Any]] = {}


def _insert_statement(
    run_keys: tuple[str, ...], attempt_keys: tuple[str, ...], count_queued: bool
) -> Select[Any]:
    """A new run, its attempt 1 and its one event: the enqueue's three inserts; with
    ``count_queued`` also the runs queued before it (the statement's snapshot does not see
    its own insert)."""
    key = (run_keys, attempt_keys, count_queued)
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
    statement = _counts(run_cte, attempt_cte, _events_after(attempt_cte, 1))
    if count_queued:
        queued = select(func.count()).select_from(runs).where(runs.c.status == "queued")
        statement = statement.add_columns(queued.scalar_subquery())
    _INSERTS[key] = statement
    return statement


def insert_run(
    conn: Connection,
    *,
    run_values: dict[str, Any],
    attempt_values: dict[str, Any],
    event_row: dict[str, Any],
    count_queued: bool = False,
) -> int | None:
    """The run, its first attempt and its first event in one statement. A key or foreign
    key violation raises as the three inserts did (IntegrityError), and nothing is kept.

    With ``count_queued``: how many runs were queued besides this one, counted in the same
    statement (one round trip less for the queue cap: the caller took the queue lock just
    before, so the statement's snapshot comes after it); else None."""
    params: dict[str, Any] = {f"r_{k}": v for k, v in run_values.items()}
    params.update({f"a_{k}": v for k, v in attempt_values.items()})
    params.update({f"e0_{c}": event_row[c] for c in _EVENT_COLUMNS})
    keys = (tuple(sorted(run_values)), tuple(sorted(attempt_values)))
    row = tuple(conn.execute(_insert_statement(*keys, count_queued), params).one())
    if row[:3] != (1, 1, 1):  # an INSERT without a conflict clause inserts or raises
        raise RuntimeError(f"the enqueue's insert wrote {row[:3]}")
    return int(row[3]) if count_queued else None
